"""What a backend reports about the nodes it runs: typed events, each naming its host (node)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.remote.wire import CheckpointWritten, HostSample, RankPhase, SuperviseResult


@dataclass(frozen=True)
class Started:
    """The node's torchrun is running."""

    host: str
    log: str | None = None  # where the node keeps its own copy of the output
    hostname: str | None = None  # the machine's own name (a Slurm node's, where ranks run)


@dataclass(frozen=True)
class Output:
    """Lines the node's torchrun (or its ranks, prefixed `[role<local rank>]:`) printed, in order:
    a batch, as the node sent it."""

    host: str
    lines: Sequence[str]


@dataclass(frozen=True)
class Alive:
    """A heartbeat: the node is there even if its ranks print nothing."""

    host: str
    heard_s: float | None = None  # how long ago the node last heard us (its own heartbeat says)


@dataclass(frozen=True)
class Reattached:
    """A fresh connection reached the node's supervisor after it went silent: its output resumes
    where it stopped."""

    host: str


@dataclass(frozen=True)
class Problem:
    """The node could not start or run its part, in the node's words (e.g. a missing workdir)."""

    host: str
    message: str


@dataclass(frozen=True)
class Reported:
    """The node's closing report: why it stopped, the first rank error, NCCL's choices."""

    host: str
    result: SuperviseResult


@dataclass(frozen=True)
class Exited:
    """The node's part ended; exit_code None: its connection closed without an exit status (the
    host or its sshd died)."""

    host: str
    exit_code: int | None


@dataclass(frozen=True)
class Lost:
    """The backend lost the node (connection failed, dropped, or never opened)."""

    host: str
    reason: str


@dataclass(frozen=True)
class Ended:
    """The scheduler ended the job for a reason of its own (a cancel from outside ddpctl, a time
    limit, a failed node): no rank failed, and nothing is left for ddpctl to stop. `lost`: this
    node is the one the scheduler says failed."""

    host: str
    cause: str  # in the scheduler's words
    lost: bool = False


@dataclass(frozen=True)
class Milestone:
    """A rank on the node started, entered or left init_process_group, or failed (its wrapper's
    record): what the rendezvous watchdog and the root cause are built from."""

    host: str
    phase: RankPhase


@dataclass(frozen=True)
class Notice:
    """What the backend has to say about the job as a whole (queued, requeued, where it runs)."""

    host: str
    text: str


@dataclass(frozen=True)
class Sampled:
    """The node's GPUs and its job's CPU and memory, now and then (orchestrator/watch/)."""

    host: str
    sample: HostSample


@dataclass(frozen=True)
class Checkpointed:
    """The node saw a newer file in [restart] checkpoint_dir (the time account's re-done work
    counts from the last one before a failure)."""

    host: str
    seen: CheckpointWritten


@dataclass(frozen=True)
class Scheduled:
    """The scheduler's state of the job changed: "queued" (pending), "running", or "requeued"
    (its ranks end and start again)."""

    host: str
    state: str
    text: str = ""


BackendEvent = (Started | Output | Alive | Problem | Reported | Exited | Lost | Ended | Milestone | Notice
                | Reattached | Sampled | Checkpointed | Scheduled)
