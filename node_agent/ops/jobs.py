"""Ops over this host's ddpctl jobs: list them (ps), stop them (down), replay their output (logs),
each line with its time and rank."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import subprocess
import time
from pathlib import Path

from node_agent.host.factparse import parse_nvidia_apps
from node_agent.host.runstate import (
    end_job,
    iter_states,
    job_pids,
    launcher_running,
    read_json,
    write_json_atomic,
)
from node_agent.runtime.loops import stop as stop_loops
from node_agent.wire.layout import DOWN_MARK
from node_agent.wire.protocol import emit_event
from node_agent.wire.replies import wire
from node_agent.wire.replies_jobs import LogEvent, LogsFound, RunningJob, RunningJobs, StoppedJob, StoppedJobs

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, BinaryIO, Deque, Dict, List, Optional, Tuple

LOG_BLOCK = 1 << 18  # bytes of output.log sent as one event at most
INDEX_BLOCK = 1 << 16  # bytes of output.idx read at a time
TORCHRUN_PREFIX = re.compile(r"^\[[A-Za-z_]*?(\d+)\]:")  # torchrun --tee's "[default3]:"


def _gpu_memory_by_pid() -> Dict[int, int]:
    """pid -> GPU MiB, from the same nvidia-smi query and parser the doctor's facts use."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    usage: Dict[int, int] = {}
    for app in parse_nvidia_apps(out):
        usage[app["pid"]] = usage.get(app["pid"], 0) + int(app["used_memory_mib"] or 0)
    return usage


def ps(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    gpu = _gpu_memory_by_pid()
    jobs = []
    for state in iter_states(request.get("job")):
        if not launcher_running(state):
            continue
        pids = job_pids(state["job_id"], state.get("node_rank"))
        jobs.append(RunningJob(
            job_id=str(state["job_id"]), job_name=state.get("job_name"), node_rank=state.get("node_rank"),
            pid=state.get("pid"), pids=tuple(pids),
            uptime_s=round(time.time() - float(state.get("started_at", time.time())), 1),
            detached=bool(state.get("detached", False)), log=state.get("log"),
            gpu_memory_mib=sum(gpu.get(p, 0) for p in pids) if gpu else None,
        ))
    return wire(RunningJobs(tuple(jobs)))


def down(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    """Stop every running instance of a job (by id, name or run id) on this host: with
    `loops_only`, only a detached restart loop (node_agent/runtime/loops.py), which `ddpctl down` ends
    on every host before any supervisor, so that nothing restarts what it stops."""
    if request.get("loops_only"):
        return wire(StoppedJobs(tuple(stopped_job(s) for s in stop_loops(str(request["job"])))))
    grace = float(request.get("grace", 10.0))
    stopped = []
    for state in iter_states(request["job"]):
        job_id, node_rank = state["job_id"], state.get("node_rank")
        pgid = int(state["pgid"]) if launcher_running(state) else None
        if pgid is None and not job_pids(job_id, node_rank):
            continue
        with contextlib.suppress(OSError, KeyError):  # the supervisor tells its control plane who stopped it
            write_json_atomic(Path(state["state_dir"]) / DOWN_MARK, {"by": request.get("by"), "at": time.time()})
        stopped.append(stopped_job(dict(end_job(job_id, pgid, grace, node_rank), job_id=job_id)))
    return wire(StoppedJobs(tuple(stopped)))


def _latest_state(job: str) -> Optional[Dict[str, Any]]:
    states = list(iter_states(job))
    return max(states, key=lambda s: float(s.get("started_at", 0))) if states else None


def _read_from(path: Path, offset: int, size: int = -1) -> bytes:
    try:
        with open(str(path), "rb") as f:
            f.seek(offset)
            return f.read(size)
    except OSError:
        return b""


def _mtime(path: Path) -> float:
    try:
        return os.stat(str(path)).st_mtime
    except OSError:
        return time.time()


class LogIndex(object):
    """output.idx beside output.log, read as far as it is needed: one line per chunk the node
    supervisor appended, "<end offset> <time>": every byte of the log before the offset was
    written by that time. Entries behind the lines already timed are dropped as it goes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0  # bytes of the index read so far (whole lines only)
        self.entries: Deque[Tuple[int, float]] = collections.deque()

    def exists(self) -> bool:
        return bool(self.entries) or self.path.exists()

    def _more(self) -> bool:
        data = _read_from(self.path, self.offset, INDEX_BLOCK)
        cut = data.rfind(b"\n") + 1
        if not cut:
            return False
        self.offset += cut
        for line in data[:cut].splitlines():
            parts = line.split()
            try:
                self.entries.append((int(parts[0]), float(parts[1])))
            except (IndexError, ValueError):
                continue
        return True

    def time_of(self, end: int) -> Optional[float]:
        """When the log's bytes before `end` had all been written; None beyond what it covers.
        Asked for ever larger `end`s."""
        while True:
            while self.entries and self.entries[0][0] < end:
                self.entries.popleft()
            if self.entries:
                return self.entries[0][1]
            if not self._more():
                return None


class RankLabels(object):
    """torchrun's `[<role><local rank>]:` line prefix -> the global rank, from the rank wrapper's
    milestone files (ranks/<local rank>.<phase>, JSON with "rank" and "local_rank"); `local<N>`
    where none says. The files are read again (at most once per block) when a rank is missing."""

    def __init__(self, rank_dir: Path) -> None:
        self.rank_dir = rank_dir
        self.ranks: Dict[int, int] = {}
        self.fresh = False  # read since the current block began

    def _read(self) -> None:
        self.fresh = True
        try:
            names = sorted(os.listdir(str(self.rank_dir)))
        except OSError:
            return
        for name in names:
            local = name.split(".", 1)[0]
            if name.endswith(".tmp") or not local.isdigit() or int(local) in self.ranks:
                continue
            record = read_json(self.rank_dir / name) or {}
            rank, local_rank = record.get("rank"), record.get("local_rank", int(local))
            if isinstance(rank, int) and rank >= 0 and isinstance(local_rank, int):
                self.ranks[local_rank] = rank

    def label(self, local: int) -> str:
        if local not in self.ranks and not self.fresh:
            self._read()
        rank = self.ranks.get(local)
        return "local%d" % local if rank is None else str(rank)


def _runs(values: List[Any]) -> Tuple[Tuple[int, Any], ...]:
    """[a, a, b] -> ((2, a), (1, b)): a block's times and labels, run-length encoded."""
    out: List[List[Any]] = []
    for v in values:
        if out and out[-1][1] == v:
            out[-1][0] += 1
        else:
            out.append([1, v])
    return tuple((n, v) for n, v in out)


def stopped_job(outcome: Dict[str, Any]) -> StoppedJob:
    """end_job's (or the loops' stop's) outcome for one job."""
    return StoppedJob(job_id=str(outcome["job_id"]), terminated=tuple(outcome["terminated"]),
                      killed=tuple(outcome["killed"]), left=tuple(outcome["left"]),
                      commands={int(k): str(v) for k, v in outcome["commands"].items()})


def _emit_block(data: bytes, start: int, index: Optional[LogIndex], labels: RankLabels,
                fallback: Optional[float]) -> int:
    """Send the lines of `data` (output.log from byte `start`) as one "log" event: each line's
    time, rank label (None: torchrun's own line) and text. A line whose time the index does not
    know yet, where `fallback` is None, and the lines after it wait for the next pass. Returns the
    bytes consumed."""
    labels.fresh = False
    times: List[float] = []
    ranks: List[Optional[str]] = []
    texts: List[str] = []
    pos = start
    for raw in data.splitlines(True):
        t = index.time_of(pos + len(raw)) if index is not None else None
        if t is None:
            if fallback is None:
                break
            t = fallback
        pos += len(raw)
        text = raw.rstrip(b"\r\n").decode("utf-8", "replace")
        m = TORCHRUN_PREFIX.match(text)
        times.append(round(t, 3))
        ranks.append(labels.label(int(m.group(1))) if m else None)
        texts.append(text[m.end():] if m else text)
    if texts:
        emit_event("log", **wire(LogEvent("\n".join(texts), _runs(times), _runs(ranks))))
    return pos - start


def _cut(data: bytes, full: bool, last: bool) -> int:
    """How much of a block read from the log to send: whole lines, unless it is all there is on a
    last pass (a last line without its newline), or a line longer than a block (cut there)."""
    if last and not full:
        return len(data)
    return data.rfind(b"\n") + 1 or (len(data) if full else 0)


def _send_pass(log: Path, offset: int, index: LogIndex, labels: RankLabels, last: bool) -> int:
    """Send what the log holds from `offset` on, block by block; the offset reached. Until the
    `last` pass, only whole lines whose time the index already has (where there is an index; an
    older supervisor wrote none: then every line gets the log's modification time)."""
    indexed = index.exists()
    while True:
        data = _read_from(log, offset, LOG_BLOCK)
        full = len(data) == LOG_BLOCK
        cut = _cut(data, full, last)
        if not cut:
            return offset
        fallback = _mtime(log) if last or not indexed else None
        sent = _emit_block(data[:cut], offset, index if indexed else None, labels, fallback)
        offset += sent
        if sent < cut or not full:
            return offset


def _earlier_attempts(job: str, latest: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Asked for a run by its id: the attempts on this host before the latest, oldest first."""
    if latest.get("run_id") != job:
        return []
    states = [s for s in iter_states(job) if s.get("job_id") != latest.get("job_id")]
    return sorted(states, key=lambda s: float(s.get("started_at", 0)))


def _attempt_mark(state: Dict[str, Any]) -> None:
    """One line before an attempt's output, timed at its start (a run's logs show every attempt)."""
    text = "---- ddpctl: attempt %s (job %s) ----" % (str(state.get("job_id", "")).rsplit(".", 1)[-1],
                                                     state.get("job_id"))
    emit_event("log", **wire(LogEvent(text, ((1, float(state.get("started_at", 0))),), ((1, None),))))


def logs(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    """Send a job's saved output on this host, each line with its time and rank label ("log"
    events); with follow, keep sending until the job ends. A restarted run's id gives every
    attempt this host ran, each after a marked line."""
    state = _latest_state(request["job"])
    if state is None:
        return wire(LogsFound(found=False, job_id=None, node_rank=None, running=False, exit_code=1))
    earlier = _earlier_attempts(str(request["job"]), state)
    for attempt in earlier:
        _attempt_mark(attempt)
        log = Path(attempt["log"])
        _send_pass(log, 0, LogIndex(log.with_name("output.idx")),
                   RankLabels(Path(attempt.get("state_dir") or log.parent) / "ranks"), True)
    if state.get("run_id") == request["job"]:
        _attempt_mark(state)
    path = Path(state["log"])
    index = LogIndex(path.with_name("output.idx"))
    labels = RankLabels(Path(state.get("state_dir") or path.parent) / "ranks")
    follow = bool(request.get("follow"))
    offset = 0
    while True:
        last = not follow or not launcher_running(state)
        offset = _send_pass(path, offset, index, labels, last)
        if last:
            break
        time.sleep(0.2)
    return wire(LogsFound(found=True, job_id=str(state["job_id"]), node_rank=state.get("node_rank"),
                          log=str(path), running=launcher_running(state)))
