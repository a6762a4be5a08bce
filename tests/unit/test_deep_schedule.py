"""The link rounds' schedule and the coordinator (train_jobs/hostcheck/schedule.py, coordinate.py):
every round a matching, the tournament meets every pair once, the recheck settles what the
figures leave in doubt with hosts known good, and every wait has a deadline, on a fake clock."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from train_jobs.hostcheck import schedule
from train_jobs.hostcheck.coordinate import Coordinator, Settings, SimulatedClock
from train_jobs.hostcheck.schedule import bound, covered, pair, recheck_rounds, round_robin
from train_jobs.hostcheck.verdict import Figure, judge


def is_matching(pairs: list[tuple[int, int]]) -> bool:
    hosts = [h for p in pairs for h in p]
    return len(hosts) == len(set(hosts))


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 15, 16, 33, 128])
def test_the_tournament_meets_every_pair_once_in_matchings(n: int) -> None:
    rounds = round_robin(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    assert all(is_matching(r) for r in rounds)
    every = [p for r in rounds for p in r]
    assert len(every) == len(set(every)) == n * (n - 1) // 2
    assert covered(rounds, n)
    assert all(a < b for a, b in every)


def test_a_single_host_has_no_round() -> None:
    assert round_robin(1) == [] and covered([], 1)


def figures(n: int, slow_host: int | None = None, slow_pair: tuple[int, int] | None = None, k: int | None = None,
            measured: int = 1) -> dict[tuple[int, int], Figure]:
    rates = {p: Figure(1000.0, measured) for r in round_robin(n)[:k] for p in r}
    for p in rates:
        if (slow_host is not None and slow_host in p) or p == slow_pair:
            rates[p] = Figure(10.0, measured)
    return rates


def test_the_bound_is_a_multiple_of_the_finished_ones_with_a_floor() -> None:
    assert bound([], (5.0, 10.0)) == 5.0
    assert bound([0.1, 0.2, 0.3], (5.0, 10.0)) == 5.0
    assert bound([1.0, 2.0, 30.0], (5.0, 10.0)) == 20.0  # the median, not the slowest


def test_a_slow_host_seen_once_is_measured_again_with_its_fastest_partners() -> None:
    rates = figures(8, slow_host=5)
    judged = judge(list(range(8)), rates)
    assert judged.hosts[5].kind == "unconfirmed" and len(judged.unconfirmed) == 2 and judged.doubt == []
    rounds = recheck_rounds(judged, rates, range(8))
    assert sorted(p for r in rounds for p in r) == sorted(judged.unconfirmed)
    assert all(5 in p for r in rounds for p in r)


def test_once_confirmed_a_slow_host_needs_no_more_rounds() -> None:
    rates = figures(8, slow_host=5, measured=2)
    judged = judge(list(range(8)), rates)
    assert judged.hosts[5].kind == "slow" and not judged.doubt and not judged.unconfirmed
    assert recheck_rounds(judged, rates, range(8)) == []


def test_a_host_in_doubt_meets_hosts_known_good_it_has_not_met() -> None:
    rates = figures(16, slow_pair=round_robin(16)[0][0], k=1)  # one round: each host one partner
    a, b = round_robin(16)[0][0]
    rates.update({pair(h, h + 1): Figure(1000.0, 2) for h in range(2, 14, 2)})  # these hosts known good
    judged = judge(list(range(16)), rates)
    assert set(judged.doubt) == {a, b}
    good = set(judged.good())
    new = [p for r in recheck_rounds(judged, rates, range(16)) for p in r]
    for host in (a, b):
        partners = {x for p in new if host in p for x in p if x != host} - {a, b}
        assert len(partners) == schedule.RECHECK_PARTNERS and partners <= good
    assert (a, b) in new, "the slow pair itself is measured again too"


def test_busy_hosts_are_not_paired_and_one_kernel_gets_few_pairs_per_round() -> None:
    rates = {p: Figure(1000.0, 2) for r in round_robin(8) for p in r}
    for p in ((0, 1), (2, 3), (4, 5)):
        rates[p] = Figure(20.0, 1)
    judged = judge(list(range(8)), rates)
    assert sorted(judged.unconfirmed) == [(0, 1), (2, 3), (4, 5)]
    assert [sorted(r) for r in recheck_rounds(judged, rates, [0, 1, 2, 3, 6, 7])] == [[(0, 1), (2, 3)]]
    one_kernel = recheck_rounds(judged, rates, range(8), kernels={h: "boot" for h in range(8)})
    assert sorted(len(r) for r in one_kernel) == [1, 2] and sorted(p for r in one_kernel for p in r) == [
        (0, 1), (2, 3), (4, 5)], f"{schedule.PER_KERNEL} pairs a round on one kernel"


class FakeBoard:
    """The store with scripted hosts on a fake clock: `join_at[rank]` (None: never), and each
    command's reply after `took(rank, command)` seconds (None: never)."""

    def __init__(self, clock: SimulatedClock, join_at: Mapping[int, float | None],
                 took: Callable[[int, dict[str, Any]], float | None],
                 answer: Callable[[int, dict[str, Any]], dict[str, Any]]) -> None:
        self.clock, self.join_at, self.took, self.answer = clock, join_at, took, answer
        self.posted: dict[tuple[int, int], tuple[float, dict[str, Any]]] = {}

    def news(self) -> int:
        return round(self.clock.t * 1000)  # news at every poll: every reply is read as it comes

    def joined(self, rank: int) -> dict[str, Any] | None:
        at = self.join_at.get(rank)
        return {"boot": f"b{rank}"} if at is not None and self.clock.t >= at else None

    def post(self, rank: int, seq: int, command: Mapping[str, Any]) -> None:
        self.posted[(rank, seq)] = (self.clock.t, dict(command))

    def reply(self, rank: int, seq: int) -> dict[str, Any] | None:
        at, command = self.posted[(rank, seq)]
        took = self.took(rank, command)
        return self.answer(rank, command) if took is not None and self.clock.t >= at + took else None


def compute_reply(rank: int, command: dict[str, Any]) -> dict[str, Any]:
    return {"devices": [{"device": "cpu", "gpu": None, "model": "cpu", "tflops": 0.1, "seconds": 0.15}]}


def pair_reply(slow: set[int]) -> Callable[[int, dict[str, Any]], dict[str, Any]]:
    def answer(rank: int, command: dict[str, Any]) -> dict[str, Any]:
        if command["op"] == "compute":
            return compute_reply(rank, command)
        mbps = 5.0 if {rank, command["partner"]} & slow else 900.0
        return {"mbps": mbps, "seconds": 2.0 / mbps, "complete": True}
    return answer


def coordinator(n: int, join_at: Mapping[int, float | None], took: Callable[[int, dict[str, Any]], float | None],
                slow: frozenset[int] = frozenset()) -> tuple[Coordinator, SimulatedClock]:
    clock = SimulatedClock()
    board = FakeBoard(clock, join_at, took, pair_reply(set(slow)))
    return Coordinator(n, board, Settings(links_budget=5.0), clock.clock()), clock


def quick(rank: int, command: dict[str, Any]) -> float:
    return 0.3 if command["op"] == "compute" else 0.1


def test_a_host_that_never_joins_is_named_at_the_join_deadline_and_the_rest_goes_on() -> None:
    c, _ = coordinator(6, {0: 0.0, 1: 0.5, 2: 0.5, 3: 0.6, 4: None, 5: 0.7}, quick)
    out = c.run()
    (missed,) = out.missed
    assert missed.phase == "join" and missed.ranks == (4,)
    assert missed.after_s == schedule.JOIN_BOUND[0] and missed.others_s == pytest.approx(0.5, abs=0.06)
    assert out.tested == (0, 1, 2, 3, 5) and out.all_pairs is False
    assert len(out.links) == 10 and all(4 not in (row.a, row.b) for row in out.links)
    assert out.phases.join_s == pytest.approx(schedule.JOIN_BOUND[0], abs=0.1)
    assert all(cmd["op"] == "done" for (rank, _), (_, cmd) in c.board.posted.items() if rank == 4)  # type: ignore[attr-defined]


def test_a_host_that_does_not_finish_its_compute_window_is_named_and_left_out_of_the_links() -> None:
    def took(rank: int, command: dict[str, Any]) -> float | None:
        return None if rank == 2 and command["op"] == "compute" else quick(rank, command)

    c, clock = coordinator(5, dict.fromkeys(range(5), 0.0), took)
    out = c.run()
    (missed,) = out.missed
    assert missed.phase == "compute" and missed.ranks == (2,)
    assert missed.after_s == pytest.approx(schedule.COMPUTE_BOUND[0])
    assert missed.others_s == pytest.approx(0.3, abs=0.06)
    assert out.tested == (0, 1, 3, 4) and sorted(r.rank for r in out.compute) == [0, 1, 3, 4]
    assert clock.t < 3 * 5 * 0.4 + schedule.COMPUTE_BOUND[0] + 10, "one deadline, not one per window"


def test_a_pair_that_does_not_answer_is_named_its_hosts_sit_out_and_the_run_stays_bounded() -> None:
    stuck = {6}

    def took(rank: int, command: dict[str, Any]) -> float | None:
        if command["op"] == "pair" and stuck & {rank, command["partner"]}:
            return 60.0  # far past any deadline
        return quick(rank, command)

    c, clock = coordinator(8, dict.fromkeys(range(8), 0.0), took)
    out = c.run()
    links = [m for m in out.missed if m.phase == "links"]
    assert links and all(6 in m.ranks for m in links)
    assert len(links) == 1, "a busy host is not paired again until it answers"
    (row,) = [r for r in out.links if 6 in (r.a, r.b)]
    assert row.figure.missed and row.figure.mbps == 0.0
    assert clock.t < 30, clock.t  # the healthy pairs took 0.1 s a round; the stuck one its deadline once


def test_a_slow_host_sits_out_is_confirmed_by_a_second_measurement_and_its_peers_are_cleared() -> None:
    c, _ = coordinator(8, dict.fromkeys(range(8), 0.0), quick, slow=frozenset({3}))
    out = c.run()
    rates = {(r.a, r.b): Figure(r.figure.mbps, r.figure.measured) for r in out.links}
    judged = judge(list(range(8)), rates)
    assert judged.hosts[3].kind == "slow" and judged.pairs == [] and judged.doubt == []
    assert sum(1 for p, f in rates.items() if 3 in p and f.measured >= 2) >= 2
    # slow with each of its first partners, it sat out the rest of the tournament
    assert len([p for p in rates if 3 in p]) == schedule.MIN_ROUNDS and out.all_pairs is False
    assert len([p for p in rates if 3 not in p]) == 21, "the others met every other host"


def test_a_host_that_looks_slow_at_compute_gets_more_windows_before_a_verdict() -> None:
    from train_jobs.hostcheck.coordinate import AGAIN_WINDOWS, WINDOWS

    done: dict[int, int] = {}

    def answer(rank: int, command: dict[str, Any]) -> dict[str, Any]:
        if command["op"] != "compute":
            return pair_reply(set())(rank, command)
        done[rank] = done.get(rank, 0) + 1
        slow = (rank == 2 and done[rank] <= WINDOWS) or rank == 4  # 2: a burst of someone's load; 4: for good
        return {"devices": [{"device": "cpu", "gpu": None, "model": "cpu", "tflops": 0.01 if slow else 0.1}]}

    clock = SimulatedClock()
    c = Coordinator(6, FakeBoard(clock, dict.fromkeys(range(6), 0.0), quick, answer), Settings(links_budget=5.0),
                    clock.clock())
    c.run()
    best = {row.rank: row.tflops for row in c.compute_rows}
    assert best[2] == 0.1 and best[4] == 0.01, "the burst is cleared, the slow host stays slow"
    assert done[2] == WINDOWS + 1 and done[4] == WINDOWS + AGAIN_WINDOWS and done[0] == WINDOWS
