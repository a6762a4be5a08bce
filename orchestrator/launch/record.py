"""What the supervision core records of a job as it runs, for its outcome and summary.json: rank
errors, host losses, who failed first, who ended it (a signal, a monitor, the scheduler), how far
the ranks got (optimizer steps, a newer checkpoint) and the monitors' findings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator.launch.outcome import FinalState
from orchestrator.launch.result import Finding, HostLoss, HostRun, RankFailure
from orchestrator.remote.wire import RankError


@dataclass
class Record:
    failures: list[RankFailure] = field(default_factory=list)  # every rank error, once, as reported
    losses: list[HostLoss] = field(default_factory=list)
    first_failure: HostRun | None = None  # the host whose failure stopped the job
    signals: list[int] = field(default_factory=list)  # the signals that reached `up`, in order
    hung: bool = False  # a monitor judged the job hung
    cause: str | None = None  # a monitor's diagnosis (the rendezvous watchdog's)
    ended_by: str | None = None  # the scheduler's own reason for ending the job (Slurm's words)
    stopped_by: str | None = None  # someone else stopped it: `ddpctl down` (who, when), a signal to torchrun
    stopped_at: float | None = None  # when that stop began (what fails after it is its consequence)
    steps: dict[tuple[str, int | None], int] = field(default_factory=dict)  # (host, local rank) -> steps
    checkpointed: bool = False  # a host saw a newer file in [restart] checkpoint_dir
    findings: list[Finding] = field(default_factory=list)  # the monitors', in order

    def rank_failed(self, run: HostRun, error: RankError) -> RankFailure | None:
        """Keep each rank's error once (live from its milestone, again in the closing report); the
        new failure, or None when it was known."""
        key = (run.host, error.local_rank, error.timestamp)
        if any((f.host, f.error.local_rank, f.error.timestamp) == key for f in self.failures):
            return None
        failure = RankFailure(run.host, run.node_rank, error)
        self.failures.append(failure)
        return failure

    def stepped(self, host: str, local_rank: int | None, step: int) -> None:
        """A rank (local_rank None: the host's closing count) reached `step` optimizer steps."""
        key = (host, local_rank)
        self.steps[key] = max(self.steps.get(key, 0), step)

    @property
    def most_steps(self) -> int | None:
        return max(self.steps.values()) if self.steps else None

    def final(self, runs: Sequence[HostRun]) -> FinalState:
        return FinalState(runs, self.signals[0] if self.signals else None, self.hung, self.cause, self.ended_by,
                          tuple(self.failures), tuple(self.losses), self.first_failure, self.stopped_by,
                          self.stopped_at)
