"""The prune op: the oldest run directories under this host's state root (`runs/<job id>`) removed,
the newest `keep` runs and every run that may still run kept (docs/running.md, "Run directories").

A directory counts as ddpctl's only where it holds nothing but `node<k>` directories and at least
one of them has the state.json a node supervisor wrote for that job id: anything else under runs/
(a Slurm job's directory, a file, a link, somebody's own folder) is left alone. The attempts of a
restarted run (`<run id>.<n>`) are one run. A run may still run when a process here carries one of
its job ids, its supervisor or torchrun lives, a detached restart loop of its run lives here, the
control plane names it (`protect`), or a node of it on another host (a shared home) says
"running". Standard library only, Python >= 3.8.
"""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

from node_agent.host.procfs import alive
from node_agent.host.runstate import JOB_ENV, launcher_running, read_json
from node_agent.ops.prunerule import RunDir, doomed, entries, newest_entry, remove, size_of
from node_agent.wire.layout import RUNS, state_root
from node_agent.wire.replies import wire
from node_agent.wire.replies_jobs import PrunedRun, PruneReport

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, BinaryIO, Callable, Dict, Iterable, List, Optional, Set, Tuple

NODE_DIR = re.compile(r"^node\d+$")
LOOPS = "loops"  # <state root>/loops/<run id>.json and .log: a detached run's restart loop (loops.py)


def node_states(path: str, name: str) -> Optional[List[Dict[str, Any]]]:
    """The node states of a run directory that is ddpctl's (see the module's docstring); None
    where it is not."""
    try:
        entries = os.listdir(path)
    except OSError:
        return None
    states = []
    for entry in entries:
        node = os.path.join(path, entry)
        if not NODE_DIR.match(entry) or os.path.islink(node) or not os.path.isdir(node):
            return None  # something ddpctl does not put there
        state = read_json_at(os.path.join(node, "state.json"))
        if state is not None and state.get("job_id") == name:
            states.append(state)
    return states or None


def read_json_at(path: str) -> Optional[Dict[str, Any]]:
    data = read_json(Path(path))
    return data if isinstance(data, dict) else None


def live_job_ids() -> Set[str]:
    """The DDPCTL_JOB_ID of every process of this user: one pass over /proc."""
    key = ("\0%s=" % JOB_ENV).encode()
    uid = os.getuid()
    found: Set[str] = set()
    try:
        pids = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return found
    for pid in pids:
        try:
            if uid != 0 and os.stat("/proc/" + pid).st_uid != uid:
                continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = b"\0" + f.read()
        except OSError:
            continue
        at = env.find(key)
        if at >= 0:
            end = env.find(b"\0", at + len(key))
            found.add(env[at + len(key):end if end >= 0 else len(env)].decode("utf-8", "replace"))
    return found


def live_loops() -> Set[str]:
    """The run ids whose detached restart loop (node_agent/runtime/loops.py) still runs here."""
    from node_agent.runtime.loops import is_loop

    me = socket.gethostname()
    out: Set[str] = set()
    for path in entries(str(state_root() / LOOPS)):
        if path.endswith(".json"):
            data = read_json_at(path)
            if data and data.get("hostname") == me and is_loop(data):
                out.add(str(data.get("run_id")))
    return out


def state_runs(state: Dict[str, Any], me: str, live: Callable[[], Set[str]]) -> bool:
    """A node of a run may still run: here, its supervisor, torchrun or a process carrying its id
    lives; on another host (a shared home), its state says so."""
    if state.get("hostname") != me:
        return state.get("status") == "running"
    pid = state.get("supervisor_pid")
    if launcher_running(state) or (state.get("status") == "running" and pid and alive(int(pid))):
        return True
    return str(state.get("job_id")) in live()


def scan(runs: str) -> Tuple[List[RunDir], int]:
    """(ddpctl's run directories under `runs`, how many entries are not ddpctl's)."""
    me = socket.gethostname()
    cache: Dict[str, Set[str]] = {}

    def live() -> Set[str]:  # read once, and only where a state's processes are in question
        if "ids" not in cache:
            cache["ids"] = live_job_ids()
        return cache["ids"]

    loops = live_loops()
    dirs: List[RunDir] = []
    foreign = 0
    try:
        names = sorted(os.listdir(runs))
    except OSError:
        return dirs, 0
    for name in names:
        path = os.path.join(runs, name)
        states = None if os.path.islink(path) or not os.path.isdir(path) else node_states(path, name)
        if states is None:
            foreign += 1
            continue
        run = str(next((s["run_id"] for s in states if s.get("run_id")), name))
        running = run in loops or any(state_runs(s, me, live) for s in states)
        dirs.append(RunDir(name, run, newest_entry(path), running))
    return dirs, foreign


def remove_loop_files(run: str) -> None:
    """A pruned run's restart loop record and log (its loop has ended: the run was not running)."""
    for suffix in (".json", ".log"):
        path = os.path.join(str(state_root() / LOOPS), run + suffix)
        if os.path.isfile(path) and not os.path.islink(path):
            try:
                os.remove(path)
            except OSError:
                continue


def prune_runs(keep: int, dry_run: bool = False, protect: Iterable[str] = ()) -> PruneReport:
    """Remove (dry_run: only name) the run directories of all but the newest `keep` runs here."""
    runs = str(state_root() / RUNS)
    dirs, foreign = scan(runs)
    now = time.time()
    removed: List[PrunedRun] = []
    errors: List[str] = []
    gone = set()
    for d in doomed(dirs, keep, protect):
        path = os.path.join(runs, d.name)
        size = size_of(path)
        problem = None if dry_run else remove(path)
        if problem is not None:
            errors.append("%s: %s" % (d.name, problem))
            continue
        gone.add(d.name)
        removed.append(PrunedRun(d.name, size, round(max(now - d.newest, 0.0), 1)))
    if not dry_run:
        for run in {d.run for d in dirs if d.name in gone} - {d.run for d in dirs if d.name not in gone}:
            remove_loop_files(run)
    running = sorted({d.run for d in dirs if d.running})
    return PruneReport(root=runs, removed=tuple(removed), kept=len(dirs) - len(gone), running=tuple(running),
                       foreign=foreign, errors=tuple(errors), dry_run=dry_run)


def prune_args(request: Dict[str, Any]) -> Dict[str, Any]:
    """The prune request's arguments, checked: keep a whole number >= 0, protect a list of names."""
    keep = request.get("keep")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise ValueError("prune: keep must be a whole number >= 0, not %r" % (keep,))
    return {"keep": keep, "dry_run": bool(request.get("dry_run")),
            "protect": [str(p) for p in request.get("protect") or ()]}


def prune(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    """The prune op: {keep, dry_run, protect} -> PruneReport."""
    return wire(prune_runs(**prune_args(request)))


def fact_prune(request: Dict[str, Any]) -> Dict[str, Any]:
    """The facts op's `prune` sub-fact: a launch prunes in the round trip it makes anyway."""
    return wire(prune_runs(**prune_args(dict(request.get("prune") or {}))))
