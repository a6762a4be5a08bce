"""The train_jobs modules ddpctl runs on the hosts itself (doctor's smoke test, its bandwidth table and
`--deep`'s host check), declared once: `agent_code()` bundles them with the node agent, so a host
keeps them in its agent cache under the agent's key and a call sends only that key; an inline program
names the ones it runs (orchestrator/launch/inline.py) and the node's supervisor writes those out
for torchrun (node_agent/runtime/programs.py). They must parse on the agent's oldest Python (3.8):
the host compiles them into its cache with the agent."""

from __future__ import annotations

from pathlib import Path

import train_jobs

TRAIN_JOBS = Path(train_jobs.__file__).parent
PACKAGE = "train_jobs"

# Paths relative to train_jobs/. A module the list lacks is refused by `modules_of`.
SHIPPED = (
    "__init__.py",
    "smoke.py",  # doctor --smoke
    "common.py", "allreduce_bench/__init__.py", "allreduce_bench/bench.py",  # doctor --bandwidth
    "hostcheck/__init__.py", "hostcheck/verdict.py", "hostcheck/figures.py", "hostcheck/schedule.py",
    "hostcheck/coordinate.py", "hostcheck/check.py",  # doctor --deep, hosts --release --check
)


def module_of(relative: str) -> str:
    """`hostcheck/check.py` -> `train_jobs.hostcheck.check`; a package's `__init__.py` -> the package."""
    parts = [PACKAGE, *relative.removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def shipped_sources() -> dict[str, tuple[bool, str]]:
    """Each shipped module's (is a package, source), keyed by module name: the form of the agent's own."""
    return {module_of(rel): (rel.endswith("__init__.py"), (TRAIN_JOBS / rel).read_text()) for rel in SHIPPED}


def modules_of(*relative: str) -> tuple[str, ...]:
    """The module names a program runs: the packages above each file first, then the file (each once).
    Raises ValueError for a file SHIPPED lacks: the hosts would not have it."""
    names: list[str] = []
    for rel in relative:
        parents = rel.split("/")[:-1]
        for path in ["__init__.py", *("/".join(parents[:i + 1]) + "/__init__.py" for i in range(len(parents))), rel]:
            if path not in SHIPPED:
                raise ValueError(f"train_jobs/{path} is not shipped with the agent: add it to SHIPPED "
                                 "(orchestrator/remote/programs.py)")
            if module_of(path) not in names:
                names.append(module_of(path))
    return tuple(names)
