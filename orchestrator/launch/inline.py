"""Programs ddpctl runs on the hosts itself (doctor's smoke test, bandwidth table and deep host check):
a host needs torch but not this repository. Their modules travel with the node agent, cached on each
host under its key (orchestrator/remote/programs.py declares them); a launch names the ones its
program runs (the supervise request's `modules`), the node's supervisor writes them into the job's
state directory and sets $DDPCTL_PROGRAM_DIR, and torchrun runs them (--no-python) through RUNNER, a
constant: the command line every `ps` shows is a few hundred bytes, whatever the program's size."""

from __future__ import annotations

from dataclasses import dataclass

from node_agent.wire.layout import PROGRAM_DIR_ENV
from orchestrator.remote.programs import modules_of

# `python -c RUNNER <main module> <args...>`: the program's folder first on the path (before the
# job's workdir, which may hold another train_jobs), then its main module run as __main__, with
# sys.argv as `python -m <main> <args...>` would give it. Never built from user data.
RUNNER = (f"import os, runpy, sys; sys.path.insert(0, os.environ[{PROGRAM_DIR_ENV!r}]); del sys.argv[0]; "
          "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")


@dataclass(frozen=True)
class InlineProgram:
    """`main` run with `modules` importable (module names, each shipped with the agent: `program`
    makes them from train_jobs' files), none of them needing to exist on the host beforehand."""

    modules: tuple[str, ...]
    main: str
    args: tuple[str, ...] = ()
    # each host runs it on its own (torchrun --standalone, no rendezvous between hosts); it finds
    # the others through the plan's DDPCTL_COORDINATOR (the master address and port)
    per_host: bool = False

    def argv(self, python: str) -> tuple[str, ...]:
        return (python, "-c", RUNNER, self.main, *self.args)


def shipped_program(files: tuple[str, ...], args: tuple[str, ...] = (), per_host: bool = False) -> InlineProgram:
    """The program whose main module is the last of `files` (paths relative to train_jobs/, each
    shipped: programs.SHIPPED), with the packages above them."""
    modules = modules_of(*files)
    return InlineProgram(modules, modules[-1], args, per_host)
