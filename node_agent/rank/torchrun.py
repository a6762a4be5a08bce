"""torchrun as a node's supervisor starts it: torch.distributed.run's own main, unchanged, in a
process that skips the interpreter's final garbage collection when it exits.

The supervisor writes this file's source as `bin/torchrun` in the job's run state and starts
`python <state dir>/bin/torchrun ARGS` in place of `python -m torch.distributed.run ARGS` (the name
keeps it torchrun to `ps` and to kill-port). A process that has imported torch spends about 0.4 s
of CPU in that last collection; with every host's agent and ranks exiting at once on a few
cores, that was most of the time from a job's last line to its end. atexit handlers still run;
only objects in reference cycles still alive at exit are not finalized, which Python never
promised. It also records a rank that a signal ended, as only torchrun, its parent, can see it
(`hook_failures`). Standard library only, Python 3.8 and newer.
"""

import atexit
import gc
import importlib
import json
import os
import runpy
import signal
import time

ELASTIC_API = "torch.distributed.elastic.multiprocessing.api"


STOPPING = "stopping"  # beside the rank directory: ddpctl itself is ending the job's ranks
# What ends a rank without its asking: the OOM killer's (or an admin's) SIGKILL, a crash. Not the
# stop requests (SIGTERM, SIGINT, SIGHUP, ...): whoever sends them stops the job, and says so.
UNASKED = (signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "signal %d" % signum


def record_killed(rank_dir: str, local_rank: int, pid: int, signum: int, by: str) -> None:
    """`<local rank>.ended` in the rank directory, written as the rank wrapper writes an error
    record: a rank that an UNASKED signal ended (SIGKILL: the OOM killer, an admin; SIGSEGV) leaves
    no error of its own, and its node supervisor forwards this instead. Not when ddpctl itself is ending the
    job's ranks (`stopping` beside the rank directory), nor twice, nor for a rank that recorded its
    own error (fail fast kills it)."""
    state = os.path.dirname(rank_dir.rstrip("/"))
    path = os.path.join(rank_dir, "%d.ended" % local_rank)
    if signum not in UNASKED or os.path.exists(os.path.join(state, STOPPING)) or os.path.exists(path) or \
            os.path.exists(os.path.join(rank_dir, "%d.error" % local_rank)):
        return
    name = signal_name(signum)
    why = "out of memory, or killed on the host" if signum == signal.SIGKILL else "it crashed, or was signalled"
    try:
        with open(path + ".tmp", "w") as f:
            json.dump({"phase": "ended", "time": time.time(), "local_rank": local_rank, "pid": pid,
                       "signal": signum, "type": name, "traceback": "", "by": by,
                       "message": "the rank was ended by %s (%s); it left no Python error" % (name, why)}, f)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def hook_failures(rank_dir: str) -> None:
    """Wrap torchrun's capture of its workers' exit codes (it reaps them; nobody else can read
    them after): each rank a signal ended is recorded as torchrun sees it."""
    try:
        api = importlib.import_module(ELASTIC_API)
        context = api.SubprocessContext
        original = context._capture_process_failures
    except (ImportError, AttributeError):
        return

    def capture(self, done_local_ranks):  # type: ignore[no-untyped-def]
        first = not self._failures  # later calls log the ranks torchrun itself then ends
        original(self, done_local_ranks)
        if first:
            for failure in list(self._failures.values()):
                if int(failure.exitcode) < 0:
                    record_killed(rank_dir, int(failure.local_rank), int(failure.pid), -int(failure.exitcode),
                                  "torchrun")

    context._capture_process_failures = capture


if __name__ == "__main__":
    atexit.register(gc.freeze)  # registered first, so it runs after every other handler
    if os.environ.get("DDPCTL_RANK_DIR"):
        hook_failures(os.environ["DDPCTL_RANK_DIR"])
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
