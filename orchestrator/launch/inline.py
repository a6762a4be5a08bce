"""Programs shipped inline: `python -c <loader>` with the modules it needs embedded, so a host needs
torch but not this repository. torchrun runs such a program with --no-python."""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import train_jobs

TRAIN_JOBS = Path(train_jobs.__file__).parent

LOADER = """\
import base64, json, sys, types, zlib
srcs = json.loads(zlib.decompress(base64.b64decode(sys.argv[1])))
main = sys.argv[2]
sys.argv = [main] + sys.argv[3:]
for name in sorted(srcs):
    if name != main:
        mod = types.ModuleType(name)
        if "." not in name:
            mod.__path__ = []
        sys.modules[name] = mod
for name in srcs:
    if name != main:
        exec(compile(srcs[name], name, "exec"), sys.modules[name].__dict__)
exec(compile(srcs[main], main, "exec"), {"__name__": "__main__", "__file__": main})
"""


@dataclass(frozen=True)
class InlineProgram:
    """`main` run with `modules` importable, none of them needing to exist on the host; they run
    in the order given (a module after those it imports)."""

    modules: Mapping[str, str]  # module name -> source
    main: str
    args: tuple[str, ...] = ()
    # each host runs it on its own (torchrun --standalone, no rendezvous between hosts); it finds
    # the others through the plan's DDPCTL_COORDINATOR (the master address and port)
    per_host: bool = False

    def argv(self, python: str) -> tuple[str, ...]:
        blob = base64.b64encode(zlib.compress(json.dumps(dict(self.modules)).encode(), 9)).decode()
        return (python, "-c", LOADER, blob, self.main, *self.args)


def train_jobs_sources(*relative: str) -> dict[str, str]:
    """The sources of train_jobs modules (paths relative to train_jobs/), keyed by module name, in
    the order given (a module after those it imports)."""
    out = {"train_jobs": (TRAIN_JOBS / "__init__.py").read_text()}
    for rel in relative:
        name = "train_jobs." + rel.removesuffix(".py").replace("/", ".")
        out[name] = (TRAIN_JOBS / rel).read_text()
    return out
