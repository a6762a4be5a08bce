"""The outcome of a launch: per host its state, exit code, first failure and duration; summary.json."""

from __future__ import annotations

import enum
import json
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.account.compute import Account
from orchestrator.launch.plan import LaunchPlan, mask_env
from orchestrator.remote.wire import NcclChoice, RankError


class RunState(str, enum.Enum):
    """A host's state in one launch (HostRun.state)."""

    CONNECTING = "connecting"
    RUNNING = "running"
    STOPPING = "stopping"
    EXITED = "exited"
    FAILED = "failed"  # exited non-zero
    STOPPED = "stopped"  # ended because we stopped the job (another host failed, Ctrl-C, a signal)
    LOST = "lost"  # connection failed, closed without an exit status, or silent for lost_after


@dataclass
class HostRun:
    host: str
    node_rank: int
    command: str
    state: RunState = RunState.CONNECTING
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    error: str | None = None
    stop_reason: str | None = None
    first_error: RankError | None = None  # the earliest rank error file on this host
    remote_log: str | None = None
    hostname: str | None = None  # the machine's own name, as its supervisor reported it (Slurm: the node)
    nccl: NcclChoice | None = None  # what NCCL chose, with --nccl-debug
    tail: list[str] = field(default_factory=list)
    link_closed: bool = False  # lost because its connection closed (host or sshd died), not silence
    # lost because it did not confirm a stop within its bound (faults.FaultLimits.stop_bound): `up`
    # ended without its report, which is no evidence that the host failed (the host ledger keeps no fault)
    stop_unconfirmed: bool = False

    @property
    def done(self) -> bool:
        return self.state in (RunState.EXITED, RunState.FAILED, RunState.STOPPED, RunState.LOST)

    @property
    def duration_s(self) -> float | None:
        return self.ended_at - self.started_at if self.ended_at and self.started_at else None


# Errors a rank gets because a peer died first: never the root cause while another error exists.
CONSEQUENCE = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|remote process exited|"
    r"DistNetworkError|DistBackendError|SIGTERM|KeyboardInterrupt|Socket Timeout|timed out", re.IGNORECASE)


@dataclass(frozen=True)
class RankFailure:
    """One rank's error and where it ran."""

    host: str
    node_rank: int
    error: RankError

    @property
    def consequence(self) -> bool:
        """The error reads like a peer's death (closed connection, collective timeout)."""
        return bool(CONSEQUENCE.search(f"{self.error.kind} {self.error.message}"))


def root_cause(failures: Sequence[RankFailure]) -> RankFailure | None:
    """The rank that failed first in time, preferring errors that are not a peer's death (host
    clocks differ by milliseconds; a peer's 'connection closed' is never the cause)."""
    return min(failures, key=lambda f: (f.consequence, f.error.timestamp or float("inf")), default=None)


def clock(at: float) -> str:
    """A time.time() as this machine's wall clock, to the second (in notices and headlines)."""
    return time.strftime("%H:%M:%S", time.localtime(at))


@dataclass(frozen=True)
class HostLoss:
    """A host the job lost (gone, or its supervisor stopped for lack of us): it outranks every
    error that is a consequence of it."""

    host: str
    reason: str  # what happened, in words
    at: float  # time.time() on this machine

    def when(self) -> str:
        return clock(self.at)


@dataclass
class Span:
    """When a finding that can end (a straggler) began and ended, in time.time(). The monitor that
    made the finding ends it; whoever keeps the finding reads the end when it writes its file."""

    start: float
    end: float | None = None  # None: not over (yet)

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        """start, end and duration_s: to the end, or to `now` (else the present) while not over."""
        until = self.end if self.end is not None else now if now is not None else time.time()
        return {"start": self.start, "end": self.end, "duration_s": round(max(0.0, until - self.start), 3)}


@dataclass(frozen=True)
class Finding:
    """Something wrong with a running job, kept for summary.json and the report: a straggler, a
    hang or stall, a lost host, an idle GPU, creeping memory. Kept, not said (a Say says it).
    A finding with a span can end (a straggler back to pace)."""

    kind: str  # "straggler", "hang", "no progress", "host lost", "gpu idle", "memory creeping"
    text: str
    at: float  # time.time()
    rank: int | None = None
    host: str | None = None
    step: int | None = None  # the job's optimizer step when it was said
    span: Span | None = field(default=None, compare=False)
    slower: float | None = field(default=None, compare=False)  # a straggler's work per step over the others', less 1

    def to_json(self, started: float | None, now: float | None = None) -> dict[str, Any]:
        out = {"kind": self.kind, "text": self.text, "at": self.at, "rank": self.rank, "host": self.host,
               "step": self.step, "t": round(self.at - started, 3) if started is not None else None}
        return {**out, **self.span.to_json(now)} if self.span is not None else out


@dataclass(kw_only=True)
class RunResult:
    """One attempt's outcome (built by the supervision core, read by restarts and the CLI)."""

    job_id: str
    run_dir: Path
    hosts: list[HostRun]
    exit_code: int
    first_failure: HostRun | None
    interrupted: bool = False
    nprocs: dict[str, int] = field(default_factory=dict)
    hung: bool = False
    root_cause: RankFailure | None = None  # the first rank error in time, on a failed run
    cause: str | None = None  # the rendezvous watchdog's diagnosis, when it stopped the job
    loss: HostLoss | None = None  # the first host lost, where that (not a rank's own error) is the cause
    signal: int | None = None  # the signal that stopped `up` (SIGINT, SIGTERM, SIGHUP)
    ended_by: str | None = None  # the scheduler ended the job for its own reason (Slurm's words)
    steps: int | None = None  # the most optimizer steps any rank took (the rank wrapper's count)
    checkpointed: bool = False  # a newer file appeared in [restart] checkpoint_dir on some host
    findings: list[Finding] = field(default_factory=list)  # orchestrator/watch/: stragglers, hangs, ...
    started: float | None = None  # time.time() at the launch: the findings' `t` counts from it
    stopped_by: str | None = None  # someone else stopped it: `ddpctl down` (who, when), a signal to torchrun
    account: Account | None = None  # where the run's time went (orchestrator/account/), once it is over

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def global_rank(self, run: HostRun, local_rank: int | str | None) -> int | None:
        """torchrun numbers ranks node by node, each node by its own count (they may differ)."""
        if not self.nprocs.get(run.host) or not isinstance(local_rank, int):
            return None
        before = [self.nprocs.get(r.host) for r in self.hosts if r.node_rank < run.node_rank]
        return None if None in before else sum(n or 0 for n in before) + local_rank

    def findings_json(self) -> list[dict[str, Any]]:
        return [f.to_json(self.started) for f in self.findings]

    def rank_of(self, failure: RankFailure) -> int | None:
        """The failed rank's global rank: as it recorded it, else from its node and local rank."""
        if failure.error.rank is not None:
            return failure.error.rank
        run = next((r for r in self.hosts if r.host == failure.host), None)
        return self.global_rank(run, failure.error.local_rank) if run is not None else None


def write_summary(plan: LaunchPlan, result: RunResult) -> Path:
    path = result.run_dir / "summary.json"
    data = {
        "job_id": plan.job_id, "job": plan.job.name, "exit_code": result.exit_code,
        "interrupted": result.interrupted, "master": f"{plan.master_addr}:{plan.master_port}",
        "world_size": plan.world_size,
        "first_failure": result.first_failure.host if result.first_failure else None,
        "lost": asdict(result.loss) if result.loss else None,
        "signal": result.signal,
        "root_cause": asdict(result.root_cause) if result.root_cause else None,
        "cause": result.cause,
        "ended_by": result.ended_by,
        "stopped_by": result.stopped_by,
        "steps": result.steps,
        "checkpointed": result.checkpointed,
        "findings": result.findings_json(),
        "hosts": [dict(asdict(r), state=r.state.value, duration_s=r.duration_s,
                       env=mask_env(plan.hosts[r.node_rank].env), tail=r.tail[-10:])
                  for r in result.hosts],
    }
    path.write_text(json.dumps(data, indent=2, default=str))
    return path
