"""Every rank's entry point under ddpctl: runs the user's program as `python script.py ARGS` (or
`python -m module ARGS`) would, and records its milestones where its node's supervisor reads them.

    python rankwrap.py script.py ARGS...      python rankwrap.py -m package.module ARGS...

In $DDPCTL_RANK_DIR it writes, as `<local rank>.<phase>` files (JSON, written whole):
- `started`: the rank runs (torchrun's own rendezvous between the nodes is over);
- `init` / `joined`: it called / returned from torch.distributed.init_process_group (the
  process-group rendezvous between the ranks);
- `step`: how many optimizer steps it has taken (torch's global optimizer step hook: no change to
  the script), rewritten at its first step and then at most once every STEP_EVERY seconds;
- `error`: the exception that ended it, with its traceback and its step count, whether or not
  the script uses torchelastic's @record; a missing script is recorded as Python reports it
  ("can't open file"). It is written after Python's report of the exception is printed and
  flushed: from then on the supervisor may end the rank without losing a line of it.

It never imports torch itself (a script may set CUDA_VISIBLE_DEVICES before it does): an import
hook wraps init_process_group when the script imports torch.distributed, and registers the step
hook when it imports torch.optim. Standard library only,
Python 3.8 and newer; the supervisor writes this file's source next to its run state.
"""

from __future__ import annotations

import atexit
import functools
import gc
import importlib.machinery
import json
import os
import runpy
import socket
import sys
import time
import traceback

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Callable, List, Optional, Sequence

RANK_DIR_ENV = "DDPCTL_RANK_DIR"
C10D = "torch.distributed.distributed_c10d"
OPTIMIZER = "torch.optim.optimizer"
STEP_EVERY = 1.0  # seconds between two `step` records of one rank (the first step is written at once)


class _Steps(object):
    """The rank's optimizer steps so far, and when its `step` record was last written."""

    count = 0
    written = 0.0
    recorded = 0  # the count in the `step` record


def _stepped(*_args: Any) -> None:
    """torch's global optimizer step post-hook: count, and record now and then (never fails)."""
    _Steps.count += 1
    now = time.monotonic()
    if _Steps.count == 1 or now - _Steps.written >= STEP_EVERY:
        _Steps.written = now
        _record_steps()


def _record_steps() -> None:
    if _Steps.count != _Steps.recorded:
        _Steps.recorded = _Steps.count
        record("step", step=_Steps.count)


def _hook_steps(module: Any) -> None:
    register = getattr(module, "register_optimizer_step_post_hook", None)
    if register is not None and not getattr(module, "_ddpctl_steps", False):
        module._ddpctl_steps = True
        register(_stepped)


def _local_rank() -> str:
    return os.environ.get("LOCAL_RANK", "0")


def record(phase: str, **fields: Any) -> None:
    """Write `<local rank>.<phase>` atomically; never fails the rank."""
    where = os.environ.get(RANK_DIR_ENV)
    if not where:
        return
    data = {"phase": phase, "time": time.time(), "local_rank": int(_local_rank()),
            "rank": int(os.environ.get("RANK", "-1")), "pid": os.getpid(), "host": socket.gethostname()}
    data.update(fields)
    path = os.path.join(where, "%s.%s" % (_local_rank(), phase))
    try:
        with open(path + ".tmp", "w") as f:
            json.dump(data, f)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def _wrap_init(module: Any) -> None:
    original = getattr(module, "init_process_group", None)
    if original is None or getattr(original, "_ddpctl_wrapped", False):
        return

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        record("init")
        result = original(*args, **kwargs)
        record("joined")
        return result

    init_process_group._ddpctl_wrapped = True  # type: ignore[attr-defined]
    module.init_process_group = init_process_group


class _InitHook(object):
    """A meta path finder that lets torch.distributed.distributed_c10d load as usual, then wraps
    its init_process_group before `torch.distributed` re-exports the name; and registers the step
    hook once torch.optim.optimizer has loaded."""

    def find_spec(self, name: str, path: Optional[Sequence[str]] = None, target: Any = None) -> Any:
        if name not in (C10D, OPTIMIZER):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            if name == C10D:
                _wrap_init(module)
            else:
                _hook_steps(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _user_frames(tb: Any) -> Any:
    """Skip this wrapper's and runpy's frames: the traceback starts in the user's code."""
    ours = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}
    while tb is not None and (tb.tb_frame.f_code.co_filename in ours or
                              os.path.abspath(tb.tb_frame.f_code.co_filename) in ours):
        tb = tb.tb_next
    return tb


def _one_line_carets(exc: BaseException) -> None:
    """Python 3.10-3.12's traceback module prints a SyntaxError that spans lines (a bracket closed
    lines later: end_lineno > lineno) with a caret line of spaces only, its end column being on
    another line; the interpreter's own report (and 3.13's module) underlines from the offset to
    the end of the line shown. Make every such error in the chain end on its first line so."""
    seen = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        end_lineno = getattr(current, "end_lineno", None)
        if isinstance(current, SyntaxError) and current.text and current.offset and \
                end_lineno not in (None, current.lineno):
            current.end_lineno = current.lineno
            current.end_offset = max(len(current.text.rstrip("\n")) + 1, current.offset + 1)
        current = current.__cause__ or current.__context__


def _failed(exc: BaseException) -> None:
    _one_line_carets(exc)  # after Python's own report: it is only ours that needs it
    lines = traceback.format_exception(type(exc), exc, _user_frames(exc.__traceback__))
    record("error", type=type(exc).__name__, message=str(exc), traceback="".join(lines), step=_Steps.count)


def run(argv: List[str], runner: Optional[Callable[[], Any]] = None) -> int:
    """Run the program `argv` names (script path, or `-m module`) as __main__; 0 or its exit code."""
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        sys.stderr.write("usage: rankwrap.py script.py ARGS... | -m module ARGS...\n")
        return 2
    record("started")
    # registered before the program's own handlers, so it runs after all of them: the exit then
    # skips the final garbage collection (about 0.4 s of CPU once torch is imported); objects in
    # reference cycles still alive at exit are not finalized, which Python never promised
    atexit.register(gc.freeze)
    atexit.register(_record_steps)  # the last steps, since the last record (runs before gc.freeze)
    if "torch.distributed" in sys.modules:  # imported already (not by us): wrap it in place
        _wrap_init(sys.modules.get(C10D))
    if OPTIMIZER in sys.modules:
        _hook_steps(sys.modules[OPTIMIZER])
    if C10D not in sys.modules or OPTIMIZER not in sys.modules:
        sys.meta_path.insert(0, _InitHook())  # type: ignore[arg-type]
    if argv[0] == "-m":
        module, args = argv[1], argv[2:]
        sys.argv = [module, *args]
        sys.path[0] = os.getcwd()
        target = runner or (lambda: runpy.run_module(module, run_name="__main__", alter_sys=True))
    else:
        script, args = argv[0], argv[1:]
        if not os.path.isfile(script):
            message = "can't open file %r: [Errno 2] No such file or directory" % os.path.abspath(script)
            sys.stderr.write("%s: %s\n" % (sys.executable, message))
            record("error", type="FileNotFoundError", message=message, traceback="")
            return 2
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        target = runner or (lambda: runpy.run_path(script, run_name="__main__"))
    try:
        target()
    except SystemExit as exc:
        if exc.code in (None, 0):
            return 0
        if isinstance(exc.code, int):
            record("error", type="SystemExit", message="exit code %d" % exc.code, traceback="", step=_Steps.count,
                   exit_code=exc.code)
            return exc.code
        _failed(exc)
        raise
    except KeyboardInterrupt as exc:
        _failed(exc)
        raise
    except BaseException as exc:
        # Python's own report first, flushed: the error record tells the supervisor it may end this
        # rank at once (fail fast), and nothing the rank printed may be lost by that
        sys.excepthook(type(exc), exc, exc.__traceback__)
        sys.stderr.flush()
        _failed(exc)
        return 1  # the exit code of an uncaught exception
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
