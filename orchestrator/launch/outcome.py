"""How a supervised job ended, as a pure function of its final state: `up`'s exit code, the host to
name first, the root cause among the ranks' errors and the host loss that outranks it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.launch.result import HostLoss, HostRun, RankFailure, root_cause


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


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    first_failure: HostRun | None  # the host the headline names
    root_cause: RankFailure | None  # the first rank error in time, on a failed run
    loss: HostLoss | None  # the first host lost, where that (not a rank's own error) is the cause


def outcome(state: FinalState) -> Outcome:
    ok = succeeded(state)
    root = None if ok or state.ended_by else root_cause(state.failures)  # with ended_by, the ranks are victims
    loss = None if ok else cause_loss(state.losses, root)
    first = _run(state.runs, loss.host) if loss is not None else \
        _run(state.runs, root.host) if root is not None else state.first_failure
    return Outcome(exit_code(state, ok), first, root, loss)


def succeeded(state: FinalState) -> bool:
    """Every host exited 0 and nothing (a signal, a monitor, the scheduler) ended the job."""
    return all(r.exit_code == 0 for r in state.runs) and state.signal is None and not state.hung \
        and not state.cause and not state.ended_by


def exit_code(state: FinalState, ok: bool) -> int:
    """0; a single host's own torchrun exit code; 128 + the signal that stopped `up`; else 1."""
    if ok:
        return 0
    own = state.runs[0].exit_code if len(state.runs) == 1 else None
    if own and state.signal is None and not state.cause and not state.ended_by:
        return own
    return 128 + state.signal if state.signal is not None else 1


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
