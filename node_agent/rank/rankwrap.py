"""Every rank's entry point under ddpctl: runs the user's program as `python script.py ARGS` (or
`python -m module ARGS`) would, and records its milestones, steps and errors where its node's
supervisor reads them; answers dump requests (docs/architecture.md, "The rank wrapper").

    python rankwrap.py script.py ARGS...      python rankwrap.py -m package.module ARGS...
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import importlib.machinery
import json
import os
import runpy
import socket
import sys
import threading
import time
import traceback
import weakref

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

RANK_DIR_ENV = "DDPCTL_RANK_DIR"
C10D = "torch.distributed.distributed_c10d"
OPTIMIZER = "torch.optim.optimizer"
DDP = "torch.nn.parallel.distributed"
STEP_EVERY = 0.5  # seconds between two `step` records of one rank (the first step is written at once)
TOTAL_ENV = "DDPCTL_TOTAL_STEPS"
DUMP_REQUEST = "dump.request"  # written by node_agent/ops/stacks.py: a token, answered once
DUMPS = "dumps"
DUMP_POLL = 0.5  # seconds between two looks for a dump request
FR_ENTRIES = 64  # the flight recorder's last collectives kept in a dump
FR_BUFFER = "2000"  # TORCH_FR_BUFFER_SIZE when the job sets none (torch's own default is off)


class _Steps(object):
    """The rank's optimizer steps so far, when its `step` record was last written, and the window
    of step times and DDP timings since."""

    def __init__(self) -> None:
        self.count = 0
        self.written = 0.0
        self.recorded = 0  # the count in the `step` record
        self.last = 0.0  # time.monotonic() of the last step
        self.ends_ns = [0, 0]  # time.time_ns() of the last two steps (DDP's timestamps are wall-clock ns)
        self.durations: List[float] = []
        self.ddp: List[Tuple[float, Optional[float], float]] = []  # (wait, before, compute) ms
        self.ddp_iteration = -1
        self.ddp_models: List[Any] = []  # weak references to the DDP models built
        self.ddp_broken = False


_STEPS = _Steps()


def _stepped(*_args: Any) -> None:
    """torch's global optimizer step post-hook: count, time, and record now and then (never fails)."""
    _STEPS.count += 1
    now = time.monotonic()
    if _STEPS.count > 1:
        _STEPS.durations.append(now - _STEPS.last)
    _STEPS.last = now
    wall_ns = time.time_ns()
    if _STEPS.ddp_models and not _STEPS.ddp_broken:
        try:
            _sample_ddp()
        except Exception:  # a torch without these fields: no DDP timings, never a failed rank
            _STEPS.ddp_broken = True
    _STEPS.ends_ns = [_STEPS.ends_ns[1], wall_ns]
    if _STEPS.count == 1 or now - _STEPS.written >= STEP_EVERY:
        _STEPS.written = now
        _record_steps()


def _sample_ddp() -> None:
    """DDP's timings of its newest iteration (the newest model that ran one). torch sets them at the
    next forward pass, so they are the iteration before this step's: the time before its forward
    pass is counted from the end of the step before it."""
    for ref in reversed(_STEPS.ddp_models):
        model = ref()
        if model is None:
            continue
        data = model._get_ddp_logging_data()
        iteration = data.get("iteration", -1)
        compute_end = data.get("backward_compute_time_end") or 0
        comm_end = data.get("backward_comm_time_end") or 0
        if iteration == _STEPS.ddp_iteration or not compute_end or not comm_end:
            continue
        _STEPS.ddp_iteration = iteration
        wait = max(0, comm_end - compute_end) / 1e6
        compute = ((data.get("forward_compute_time") or 0) + (data.get("backward_compute_time") or 0)) / 1e6
        start = data.get("forward_compute_time_start") or 0
        ended = [end for end in _STEPS.ends_ns if 0 < end < start]
        before = (start - max(ended)) / 1e6 if ended else None
        _STEPS.ddp.append((wait, before, compute))
        return


def _percentile(ordered: List[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _median(values: List[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _window() -> Optional[Dict[str, Any]]:
    """The steps since the last record (then forgotten): how many, how long, p50/p95, DDP's medians."""
    durations, samples = _STEPS.durations, _STEPS.ddp
    _STEPS.durations, _STEPS.ddp = [], []
    if not durations:
        return None
    ordered = sorted(durations)
    window: Dict[str, Any] = {"steps": len(ordered), "seconds": round(sum(ordered), 6),
              "p50_ms": round(_median(ordered) * 1e3, 3), "p95_ms": round(_percentile(ordered, 0.95) * 1e3, 3)}
    if samples:
        before = [s[1] for s in samples if s[1] is not None]
        window["ddp"] = {"n": len(samples), "wait_ms": round(_median([s[0] for s in samples]), 3),
                         "data_ms": round(_median(before), 3) if before else None,
                         "compute_ms": round(_median([s[2] for s in samples]), 3)}
    return window


def _total() -> Optional[int]:
    try:
        total = int(os.environ.get(TOTAL_ENV, ""))
    except ValueError:
        return None
    return total if total > 0 else None


def _record_steps() -> None:
    if _STEPS.count != _STEPS.recorded:
        _STEPS.recorded = _STEPS.count
        fields: Dict[str, Any] = {"step": _STEPS.count}
        window = _window()
        if window is not None:
            fields["window"] = window
        total = _total()
        if total is not None:
            fields["total"] = total
        record("step", **fields)


def _hook_ddp(module: Any) -> None:
    """Every DistributedDataParallel built: DDP's runtime timings at every iteration (its default
    is one in 100), read at each optimizer step."""
    cls = getattr(module, "DistributedDataParallel", None)
    original = getattr(cls, "__init__", None)
    if cls is None or original is None or getattr(original, "_ddpctl_wrapped", False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            self._set_ddp_runtime_logging_sample_rate(1)
            _STEPS.ddp_models.append(weakref.ref(self))
        except Exception:  # a torch without it, or a model DDP did not wrap (no reducer)
            pass

    __init__._ddpctl_wrapped = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


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
        _Dumper.start()
        return result

    init_process_group._ddpctl_wrapped = True  # type: ignore[attr-defined]
    module.init_process_group = init_process_group


class _Dumper(object):
    """The side thread that answers dump requests, started once the process group is up. It is a
    daemon (a rank blocked for good must still exit), but it is ended and joined at exit, before
    the interpreter finalizes: a daemon thread that wakes up during finalization is ended there by
    pthread_exit, which a C++ frame on its way can turn into std::terminate."""

    started = False
    done = threading.Event()

    @classmethod
    def start(cls) -> None:
        where = os.environ.get(RANK_DIR_ENV)
        if cls.started or not where:
            return
        cls.started = True
        with contextlib.suppress(OSError):  # where NCCL's own dump on a timeout goes, too
            os.makedirs(_dumps(where), exist_ok=True)
        thread = threading.Thread(target=cls.watch, args=(where, threading.main_thread().ident),
                                  name="ddpctl-dumps", daemon=True)
        thread.start()
        atexit.register(cls.stop, thread)

    @classmethod
    def stop(cls, thread: threading.Thread) -> None:
        cls.done.set()
        thread.join(DUMP_POLL * 4)

    @classmethod
    def watch(cls, where: str, main: Optional[int]) -> None:
        request = os.path.join(where, DUMP_REQUEST)
        answered = ""
        seen: Optional[int] = None
        while not cls.done.wait(DUMP_POLL):
            try:
                mtime = os.stat(request).st_mtime_ns
                if mtime == seen:
                    continue
                seen = mtime
                with open(request) as f:
                    token = f.read().strip()
            except OSError:
                continue
            if token and token != answered:
                answered = token
                with contextlib.suppress(Exception):  # never the rank's failure
                    _dump(where, token, main)


def _dumps(where: str) -> str:
    """The node's dumps folder, next to its rank records."""
    return os.path.join(os.path.dirname(os.path.abspath(where)), DUMPS)


def _main_stack(main: Optional[int]) -> List[Dict[str, Any]]:
    """The main thread's Python frames, innermost first, without this wrapper's and runpy's."""
    frame = sys._current_frames().get(main) if main is not None else None
    ours = (os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>")
    frames = []
    while frame is not None:
        code = frame.f_code
        if code.co_filename not in ours and os.path.abspath(code.co_filename) not in ours:
            frames.append({"name": code.co_name, "file": code.co_filename, "line": frame.f_lineno})
        frame = frame.f_back
    return frames


FR_KEYS = ("collective_seq_id", "p2p_seq_id", "op_id", "pg_id", "process_group", "profiling_name", "state",
           "retired", "is_p2p", "time_created_ns", "input_sizes", "timeout_ms")


def _flight_records() -> Dict[str, Any]:
    """The flight recorder's ring, as torch dumps it (a JSON string), its newest entries only."""
    c10d = sys.modules.get("torch._C._distributed_c10d")
    dump = getattr(c10d, "_dump_fr_trace_json", None) or getattr(c10d, "_dump_nccl_trace_json", None)
    if dump is None:
        return {"error": "this torch has no flight recorder"}
    try:
        trace = json.loads(dump(True, True))
    except Exception as exc:
        return {"error": "the flight recorder's dump failed: %s" % exc}
    entries = trace.get("entries") or []
    if not entries and os.environ.get("TORCH_FR_BUFFER_SIZE") in ("0", None):
        return {"error": "the flight recorder is off (TORCH_FR_BUFFER_SIZE=0)"}
    return {"entries": [{k: e.get(k) for k in FR_KEYS if k in e} for e in entries[-FR_ENTRIES:]],
            "pg_status": trace.get("pg_status")}


def _groups() -> Dict[str, List[int]]:
    """Each process group's name (as the flight records name it) and its members' global ranks."""
    world = getattr(sys.modules.get(C10D), "_world", None)
    names = dict(getattr(world, "pg_names", None) or {})
    members = dict(getattr(world, "pg_group_ranks", None) or {})
    return {str(name): sorted(int(r) for r in members[pg]) for pg, name in names.items() if pg in members}


def _dump(where: str, token: str, main: Optional[int]) -> None:
    data: Dict[str, Any] = {"token": token, "time": time.time(), "local_rank": int(_local_rank()),
            "rank": int(os.environ.get("RANK", "-1")), "pid": os.getpid(), "step": _STEPS.count,
            "stack": _main_stack(main)}
    data.update(_flight_records())
    with contextlib.suppress(Exception):
        data["groups"] = _groups()
    folder = _dumps(where)
    path = os.path.join(folder, "%s.json" % _local_rank())
    try:
        os.makedirs(folder, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(data, f, default=str)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


class _InitHook(object):
    """A meta path finder that lets torch.distributed.distributed_c10d load as usual, then wraps
    its init_process_group before `torch.distributed` re-exports the name; registers the step
    hook once torch.optim.optimizer has loaded, and DDP's every-iteration timings once
    torch.nn.parallel.distributed has."""

    def find_spec(self, name: str, path: Optional[Sequence[str]] = None, target: Any = None) -> Any:
        if name not in (C10D, OPTIMIZER, DDP):
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
            elif name == DDP:
                _hook_ddp(module)
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
    record("error", type=type(exc).__name__, message=str(exc), traceback="".join(lines), step=_STEPS.count)


def run(argv: List[str], runner: Optional[Callable[[], Any]] = None) -> int:
    """Run the program `argv` names (script path, or `-m module`) as __main__; 0 or its exit code."""
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        sys.stderr.write("usage: rankwrap.py script.py ARGS... | -m module ARGS...\n")
        return 2
    record("started")
    where = os.environ.get(RANK_DIR_ENV)
    if where:  # torch's flight recorder (the last collectives, for a hang's verdict), unless the job says
        os.environ.setdefault("TORCH_FR_BUFFER_SIZE", FR_BUFFER)
        os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", os.path.join(_dumps(where), "nccl_trace_rank_"))
    # registered before the program's own handlers, so it runs after all of them: the exit then
    # skips the final garbage collection (about 0.4 s of CPU once torch is imported); objects in
    # reference cycles still alive at exit are not finalized, which Python never promised
    atexit.register(gc.freeze)
    atexit.register(_record_steps)  # the last steps, since the last record (runs before gc.freeze)
    if "torch.distributed" in sys.modules:  # imported already (not by us): wrap it in place
        _wrap_init(sys.modules.get(C10D))
    if OPTIMIZER in sys.modules:
        _hook_steps(sys.modules[OPTIMIZER])
    if DDP in sys.modules:
        _hook_ddp(sys.modules[DDP])
    if any(name not in sys.modules for name in (C10D, OPTIMIZER, DDP)):
        sys.meta_path.insert(0, _InitHook())
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
            record("error", type="SystemExit", message="exit code %d" % exc.code, traceback="", step=_STEPS.count,
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
