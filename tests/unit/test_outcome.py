"""`up`'s exit code and headline as a pure function of the supervision's final state
(orchestrator/launch/outcome.py), one row per way a job ends."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

import pytest

from orchestrator.launch.outcome import EXIT_STOPPED, FinalState, outcome
from orchestrator.launch.result import HostLoss, HostRun, RankFailure, RunState
from orchestrator.remote.wire import RankError

T0 = 1_000_000.0


def host(name: str, code: int | None, state: RunState | None = None, node_rank: int = 0) -> HostRun:
    default = RunState.EXITED if code == 0 else RunState.FAILED if code is not None else RunState.LOST
    return HostRun(name, node_rank, "torchrun ...", state or default, code)


def error(host_name: str, message: str = "boom", kind: str = "ValueError", at: float | None = T0) -> RankFailure:
    return RankFailure(host_name, 0, RankError(0, message, "Traceback ...", at, None, 0, kind))


DOWN = "stopped by `ddpctl down` (by root on vm at 11:46:40)"
PEER_DIED = ("Connection closed by peer", "DistNetworkError")


@dataclass(frozen=True)
class Case:
    """A final state (hosts by name; failures and losses name them), and what `up` says of it."""

    hosts: tuple[tuple[str, int | None], ...]
    code: int
    first: str | None = None  # the host the headline names
    root: str | None = None  # the root cause's host
    loss: str | None = None  # the loss's host
    signal: int | None = None
    hung: bool = False
    cause: str | None = None
    ended_by: str | None = None
    failures: tuple[RankFailure, ...] = ()
    losses: tuple[HostLoss, ...] = ()
    stopped_for: str | None = None  # the host whose failure stopped the job
    stopped_by: str | None = None  # someone else stopped it (`ddpctl down`), at T0
    states: dict[str, RunState] = field(default_factory=dict)


CASES = {
    "clean exit": Case((("a", 0), ("b", 0)), 0),
    "clean exit on one host": Case((("a", 0),), 0),
    "one host: torchrun's own exit code": Case((("a", 3),), 3, first="a", stopped_for="a"),
    "one host: its rank's error is the root cause": Case((("a", 1),), 1, first="a", root="a",
                                                         failures=(error("a"),), stopped_for="a"),
    "two hosts: a failed host exits 1": Case((("a", 0), ("b", 7)), 1, first="b", stopped_for="b"),
    "the earliest rank error is the root cause": Case(
        (("a", 1), ("b", 1)), 1, first="b", root="b", stopped_for="a",
        failures=(error("a", "late", at=T0 + 5), error("b", "early", at=T0 + 1))),
    "a consequence error is never the root cause": Case(
        (("a", 1), ("b", 1)), 1, first="b", root="b", stopped_for="a",
        failures=(error("a", *PEER_DIED, at=T0), error("b", "real", at=T0 + 9))),
    "only consequence errors: the earliest": Case(
        (("a", 1), ("b", 1)), 1, first="a", root="a", stopped_for="b",
        failures=(error("b", *PEER_DIED, at=T0 + 2), error("a", *PEER_DIED, at=T0 + 1))),
    "SIGINT: 130": Case((("a", 143), ("b", 143)), 130, signal=signal.SIGINT),
    "SIGTERM: 143": Case((("a", 0), ("b", 0)), 143, signal=signal.SIGTERM),
    "SIGHUP on one host: 129, not torchrun's code": Case((("a", 143),), 129, signal=signal.SIGHUP),
    "a hang stop: 1": Case((("a", 143), ("b", 143)), 1, hung=True),
    "a hang reported, ranks exit 0: still 1": Case((("a", 0), ("b", 0)), 1, hung=True),
    "a hang on one host: torchrun's code": Case((("a", 143),), 143, hung=True),
    "the watchdog's cause: 1": Case((("a", 143), ("b", 143)), 1, cause="the ranks did not all join"),
    "the watchdog's cause on one host: 1, not torchrun's code": Case((("a", 143),), 1, cause="did not join"),
    "the scheduler's end (a time limit): stopped, 3, no rank blamed": Case((("a", 0), ("b", 15)), EXIT_STOPPED,
                                                                      ended_by="DUE TO TIME LIMIT",
                                                   failures=(error("b"),)),
    "the scheduler's end (a cancel) on one host: stopped, 3": Case((("a", 15),), EXIT_STOPPED, ended_by="CANCELLED"),
    "the scheduler's failed node: the loss names it": Case(
        (("a", 0), ("b", None)), 1, first="b", loss="b", ended_by="NODE_FAIL",
        losses=(HostLoss("b", "NODE_FAIL", T0),)),
    "a host loss before any rank error is the cause": Case(
        (("a", 1), ("b", None)), 1, first="b", root="a", loss="b", stopped_for="b",
        failures=(error("a", "real", at=T0 + 5),), losses=(HostLoss("b", "no contact", T0),)),
    "a rank's own error before the loss is the cause": Case(
        (("a", 1), ("b", None)), 1, first="a", root="a", stopped_for="a",
        failures=(error("a", "real", at=T0 - 5),), losses=(HostLoss("b", "no contact", T0),)),
    "a rank's error with no time is taken to come first": Case(
        (("a", 1), ("b", None)), 1, first="a", root="a", stopped_for="a",
        failures=(error("a", "real", at=None),), losses=(HostLoss("b", "no contact", T0),)),
    "a loss outranks the consequence errors it causes": Case(
        (("a", 1), ("b", None)), 1, first="b", root="a", loss="b", stopped_for="a",
        failures=(error("a", *PEER_DIED, at=T0 - 5),), losses=(HostLoss("b", "no contact", T0),)),
    "the first of several losses": Case(
        (("a", 1), ("b", None), ("c", None)), 1, first="c", loss="c", stopped_for="c",
        losses=(HostLoss("c", "gone", T0), HostLoss("b", "gone", T0 + 1))),
    "ddpctl down: stopped, 3, and its peers' errors after it are no first failure": Case(
        (("a", 1), ("b", 143)), EXIT_STOPPED, stopped_for="a", stopped_by=DOWN,
        failures=(error("a", "Read error ... Connection reset by peer", "RuntimeError", at=T0 + 0.2),
                  error("b", "Process got signal 15", "SignalException", at=T0 + 0.3))),
    "ddpctl down: a rank's own error after it is its consequence too": Case(
        (("a", 1), ("b", 143)), EXIT_STOPPED, stopped_for="a", stopped_by=DOWN, failures=(error("a", at=T0 + 1),)),
    "ddpctl down after a rank's own error: that error is the first failure": Case(
        (("a", 1), ("b", 143)), 1, first="a", root="a", stopped_for="a", stopped_by=DOWN,
        failures=(error("a", at=T0 - 3),)),
    "ddpctl down after a host was lost: the loss is the cause": Case(
        (("a", 143), ("b", None)), 1, first="b", loss="b", stopped_for="b", stopped_by=DOWN,
        losses=(HostLoss("b", "gone", T0 - 3),)),
    "ddpctl down, every rank exits 0 on SIGTERM: still stopped, 3": Case(
        (("a", 0), ("b", 0)), EXIT_STOPPED, stopped_by=DOWN),
    "Ctrl-C and ddpctl down: the signal to up wins, 130": Case(
        (("a", 143), ("b", 143)), 130, signal=signal.SIGINT, stopped_by=DOWN),
    "interrupted while a host was lost: 130, the loss named": Case(
        (("a", 143), ("b", None)), 130, first="b", loss="b", signal=signal.SIGINT, stopped_for="b",
        losses=(HostLoss("b", "gone", T0),)),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_exit_code_and_headline_follow_from_the_final_state(case: Case) -> None:
    runs = [host(name, code, node_rank=i) for i, (name, code) in enumerate(case.hosts)]
    by_name = {r.host: r for r in runs}
    state = FinalState(runs, case.signal, case.hung, case.cause, case.ended_by, case.failures, case.losses,
                       by_name[case.stopped_for] if case.stopped_for else None, case.stopped_by,
                       T0 if case.stopped_by else None)
    end = outcome(state)
    assert end.exit_code == case.code
    assert (end.first_failure.host if end.first_failure else None) == case.first
    assert (end.root_cause.host if end.root_cause else None) == case.root
    assert (end.loss.host if end.loss else None) == case.loss


def test_a_clean_run_names_nothing_even_with_errors_on_record() -> None:
    runs = [host("a", 0), host("b", 0, node_rank=1)]
    end = outcome(FinalState(runs, failures=(error("a"),), losses=(HostLoss("b", "blip", T0),)))
    assert (end.exit_code, end.first_failure, end.root_cause, end.loss) == (0, None, None, None)
