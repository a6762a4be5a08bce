"""How a supervised job ended, as a pure function of its final state: `up`'s exit code, the host to
name first, the root cause among the ranks' errors and the host loss that outranks it, or the stop
from outside (`ddpctl down`, Slurm's cancel or time limit, a signal to torchrun) that ended it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.launch.result import HostLoss, HostRun, RankFailure, root_cause

EXIT_STOPPED = 3  # stopped from outside, not failed: `ddpctl down`, Slurm's cancel or time limit, a signal to torchrun


@dataclass(frozen=True)
class FinalState:
    """What the supervision knows when the job is over."""

    runs: Sequence[HostRun]
    signal: int | None = None  # the first signal that stopped `up` (SIGINT, SIGTERM, SIGHUP)
    hung: bool = False  # a monitor judged the job hung
    cause: str | None = None  # a monitor's diagnosis (the rendezvous watchdog's)
    ended_by: str | None = None  # the scheduler ended the job for its own reason
    failures: Sequence[RankFailure] = ()  # every rank error, as reported
    losses: Sequence[HostLoss] = ()  # every host lost while the loss could be the cause, in order
    first_failure: HostRun | None = None  # the host whose failure stopped the job
    stopped_by: str | None = None  # someone else stopped it (`ddpctl down`: who, when; a signal to torchrun)
    stopped_at: float | None = None  # when that stop began


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    first_failure: HostRun | None  # the host the headline names
    root_cause: RankFailure | None  # the first rank error in time, on a failed run
    loss: HostLoss | None  # the first host lost, where that (not a rank's own error) is the cause


def outcome(state: FinalState) -> Outcome:
    ok = succeeded(state)
    failures, losses = before_the_stop(state)
    root = None if ok or state.ended_by else root_cause(failures)  # with ended_by, the ranks are victims
    loss = None if ok else cause_loss(losses, root)
    stopped = state.stopped_by is not None and root is None and loss is None
    first = _run(state.runs, loss.host) if loss is not None else \
        _run(state.runs, root.host) if root is not None else None if stopped else state.first_failure
    return Outcome(exit_code(state, ok, stopped), first, root, loss)


def before_the_stop(state: FinalState) -> tuple[Sequence[RankFailure], Sequence[HostLoss]]:
    """The rank errors and host losses that may be a cause: all of them, unless someone else
    stopped the job; then only a rank's own error (not a peer's death) and a loss from before
    that stop began. What fails after it is the stop's consequence."""
    if state.stopped_by is None:
        return state.failures, state.losses
    at = state.stopped_at if state.stopped_at is not None else float("-inf")
    own = [f for f in state.failures if not f.consequence and f.error.timestamp is not None and f.error.timestamp < at]
    return own, [loss for loss in state.losses if loss.at < at]


def succeeded(state: FinalState) -> bool:
    """Every host exited 0 and nothing (a signal, a monitor, the scheduler, someone else) ended the job."""
    return all(r.exit_code == 0 for r in state.runs) and state.signal is None and not state.hung \
        and not state.cause and not state.ended_by and state.stopped_by is None


def exit_code(state: FinalState, ok: bool, stopped: bool = False) -> int:
    """0; 128 + the signal that stopped `up`; EXIT_STOPPED for a stop from outside (`ddpctl down`,
    Slurm's cancel or time limit, a signal to torchrun) with no failure before it; a single host's
    own torchrun exit code; else 1."""
    if ok:
        return 0
    if state.signal is not None:
        return 128 + state.signal
    if stopped or (state.ended_by and not state.losses and not state.hung and not state.cause):
        return EXIT_STOPPED
    own = state.runs[0].exit_code if len(state.runs) == 1 else None
    if own and not state.cause and not state.ended_by:
        return own
    return 1


def cause_loss(losses: Sequence[HostLoss], root: RankFailure | None) -> HostLoss | None:
    """The first loss, unless a rank's own error (not a lost peer) came first, or may have (it has no
    time): then the loss followed from it."""
    loss = losses[0] if losses else None
    if loss is not None and root is not None and not root.consequence and \
            (root.error.timestamp is None or root.error.timestamp < loss.at):
        return None
    return loss


def _run(runs: Sequence[HostRun], host: str) -> HostRun | None:
    return next((r for r in runs if r.host == host), None)
