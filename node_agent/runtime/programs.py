"""Modules written out for the processes a supervisor starts: the rank wrapper and torchrun's shim
(node_agent/rank/), and an inline program's modules (the train_jobs programs the control plane
ships with the agent: orchestrator/remote/programs.py), each from the agent's own copy. That copy is
the host's agent cache, or where the cache cannot be written the sources this call brought: either
way nothing is sent twice, and a program's command line carries its name, never its source."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Sequence, Tuple


def module_source(name: str) -> Tuple[bool, str]:
    """A module's (is a package, source) as this agent has it, without running it (its parent
    packages are imported: for the shipped programs, docstrings). The agent's finder
    (orchestrator/remote/agent.py's BOOTSTRAP) answers from its cache or its sources; run from a
    checkout (the unit tests), the file's."""
    spec = importlib.util.find_spec(name)
    source = spec.loader.get_source(name) if spec is not None and spec.loader is not None else None  # type: ignore[attr-defined]
    if source is None:
        raise ImportError("the node agent has no source for %s (a ddpctl older than its control plane?)" % name,
                          name=name)
    return spec is not None and spec.submodule_search_locations is not None, str(source)


def write_source(path: Path, source: str) -> None:
    """A module's source into the file `path` (0600: the node's state dir is the user's alone)."""
    with open(os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(source)


def write_program(folder: Path, modules: Sequence[str]) -> None:
    """Each module as a file under `folder` (0700), a package as its folder's __init__.py: torchrun's
    processes import them from there, as from a checkout."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    for name in modules:
        package, source = module_source(name)
        parts = name.split(".")
        path = folder.joinpath(*parts, "__init__.py") if package else folder.joinpath(*parts[:-1], parts[-1] + ".py")
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_source(path, source)
