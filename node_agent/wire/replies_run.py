"""Node agent replies (declared once: node_agent/wire/replies.py): supervise's result, detached start, `rank` events."""

from __future__ import annotations

from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Optional, Tuple, Union


# A rank's own end: its exception ("error", the rank wrapper's), or the signal that ended it ("ended",
# torchrun's or the node supervisor's, when it left no error: the OOM killer's SIGKILL, a SIGSEGV).
RANK_ENDS = ("error", "ended")


@dataclass(frozen=True)
class RankError:
    """The exception that ended a rank, from ddpctl's rank wrapper (or torchelastic's error file
    where the script uses @record), with its traceback and when (the host's clock) it happened."""

    local_rank: Union[int, str, None]
    message: str
    traceback: str
    timestamp: Optional[float]
    file: Optional[str]
    rank: Optional[int] = None  # the global rank (RANK), when the wrapper recorded it
    kind: str = ""  # the exception's type name ("" from an error file: it is in the message)
    step: Optional[int] = None  # the optimizer steps the rank had taken when it failed (the wrapper's)
    exit_code: Optional[int] = None  # the code it exited with (sys.exit), where that ended it

    @property
    def summary(self) -> str:
        """`RuntimeError: boom` (or the error file's message, which already reads so)."""
        if self.kind and not self.message.startswith(self.kind):
            return "%s: %s" % (self.kind, self.message)
        return self.message


@dataclass(frozen=True)
class StepWindow:
    """A rank's steps since its last `step` record (node_agent/rank/rankwrap.py): how many, the wall
    seconds they took, the step time's p50/p95, and DDP's per-iteration medians (None: no DDP
    model, or no sample): the time it waited in the gradient all-reduce after its own backward
    pass, the time from its previous step to its forward pass, its forward + backward compute."""

    steps: int
    seconds: float
    p50_ms: float
    p95_ms: float
    wait_ms: Optional[float] = None
    data_ms: Optional[float] = None
    compute_ms: Optional[float] = None
    samples: int = 0  # DDP iterations sampled

    @property
    def rate(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class RankPhase:
    """A rank's milestone (the `rank` event), as its wrapper recorded it: started, init, joined,
    step, error, or ended."""

    local_rank: Optional[int]
    rank: Optional[int]
    phase: str
    time: Optional[float]
    error: Optional[RankError]  # with phase "error" (or "ended")
    step: Optional[int] = None  # with phase "step" (and "error"): its optimizer steps so far
    window: Optional[StepWindow] = None  # with phase "step": the steps since the record before
    total: Optional[int] = None  # with phase "step": the steps the job will take, when stated


@dataclass(frozen=True)
class CheckpointWritten:
    """A node supervisor's `checkpoint` event: a newer file in [restart] checkpoint_dir than it had
    seen (`mtime`: its modification time), and the most optimizer steps any rank of the node had
    taken when it looked (None: no rank said)."""

    mtime: float
    steps: Optional[int] = None


@dataclass(frozen=True)
class NcclChoice:
    """What NCCL chose on one host, parsed from its NCCL_DEBUG=INFO log (--nccl-debug)."""

    files: Tuple[str, ...]
    networks: Tuple[str, ...]
    interfaces: Tuple[str, ...]
    bootstrap: Tuple[str, ...]
    transports: Tuple[str, ...]


@dataclass(frozen=True)
class SuperviseResult:
    """One host's supervised torchrun, as its supervisor reports it when it ends."""

    exit_code: Optional[int]
    stop_reason: Optional[str] = None
    first_error: Optional[RankError] = None
    nccl: Optional[NcclChoice] = None
    error: Optional[str] = None  # the agent itself failed
    log: Optional[str] = None
    rank_errors: Tuple[RankError, ...] = ()  # every rank error on the host, earliest first
    steps: Optional[int] = None  # the most optimizer steps a rank of the host took (None: unknown)
    checkpointed: bool = False  # a file in [restart] checkpoint_dir is newer than at the start
    state_dir: Optional[str] = None
    stopped_at: Optional[float] = None  # when someone else stopped it (`ddpctl down`, a signal): time.time()
    newest_checkpoint: Optional[float] = None  # the newest file's mtime in [restart] checkpoint_dir at the end


@dataclass(frozen=True)
class DetachedStart:
    """A detached supervisor's answer: it runs on as a daemon."""

    pid: Optional[int]  # None: the daemon wrote no state in time
    state_dir: Optional[str]
    log: Optional[str]
    detached: bool = True
    exit_code: int = 0
    host: str = ""


@dataclass(frozen=True)
class AgentFailure:
    """What an op that raised answers instead of its reply (node_agent/__main__.py)."""

    type: str
    message: str
    traceback: str


@dataclass(frozen=True)
class Failed:
    error: AgentFailure
    exit_code: int = 70
