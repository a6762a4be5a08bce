"""Node agent replies (declared once: node_agent/wire/replies.py): the ps, down and logs ops, `log` events."""

from __future__ import annotations

from dataclasses import dataclass

from node_agent.wire.replies import wire

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Dict, Optional, Tuple


@dataclass(frozen=True)
class RunningJob:
    """One node of a ddpctl job that runs on a host (`ps`)."""

    job_id: str
    job_name: Optional[str]
    node_rank: Optional[int]
    pid: Optional[int]
    pids: Tuple[int, ...]
    uptime_s: float
    detached: bool
    log: Optional[str]
    gpu_memory_mib: Optional[int]
    host: str = ""

    def to_json(self) -> Dict[str, Any]:
        return dict(wire(self), pids=list(self.pids))


@dataclass(frozen=True)
class RunningJobs:
    """The ps op's answer."""

    jobs: Tuple[RunningJob, ...]


@dataclass(frozen=True)
class StoppedJob:
    """What `down` ended of one job on one host."""

    job_id: str
    terminated: Tuple[int, ...]
    killed: Tuple[int, ...]  # needed SIGKILL after the grace period
    commands: Dict[int, str]
    left: Tuple[int, ...]

    def to_json(self) -> Dict[str, Any]:
        return {"job_id": self.job_id, "terminated": list(self.terminated), "killed": list(self.killed),
                "commands": {str(k): v for k, v in self.commands.items()}, "left": list(self.left)}


@dataclass(frozen=True)
class StoppedJobs:
    """The down op's answer."""

    stopped: Tuple[StoppedJob, ...]
    exit_code: int = 0


@dataclass(frozen=True)
class LogsFound:
    """The `logs` op's closing answer: whether the host had the job's log at all."""

    found: bool
    job_id: Optional[str]
    node_rank: Optional[int]
    running: bool
    log: Optional[str] = None
    exit_code: int = 0


@dataclass(frozen=True)
class LogEvent:
    """One `log` event of the logs op: its lines' text joined by newlines, their times and rank
    labels (the global rank, "local<N>" where unknown, None for torchrun's own lines) run-length
    encoded ([[count, value], ...])."""

    text: str
    times: Tuple[Tuple[int, float], ...]
    labels: Tuple[Tuple[int, Optional[str]], ...]


@dataclass(frozen=True)
class PrunedRun:
    """One run directory the prune op removed (or, a dry run, would remove)."""

    name: str  # the directory's name under the state root's runs/: the job id
    bytes: int
    age_s: float  # since its newest entry was written


@dataclass(frozen=True)
class PruneReport:
    """The prune op's answer (and the facts op's `prune` sub-fact, at a launch): what it removed of
    the run directories under `root`, what it kept."""

    root: str
    removed: Tuple[PrunedRun, ...]
    kept: int  # run directories left (ddpctl's; with a dry run, those it would leave)
    running: Tuple[str, ...]  # the runs (run or job ids) kept because they still run here
    foreign: int = 0  # entries ddpctl did not write (or cannot tell it did): left alone
    errors: Tuple[str, ...] = ()  # "<name>: <error>" for a directory that could not be removed
    dry_run: bool = False

    @property
    def removed_bytes(self) -> int:
        return sum(r.bytes for r in self.removed)
