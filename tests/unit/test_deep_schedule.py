"""The link rounds' schedule (train_jobs/hostcheck/schedule.py): every round a matching, the
tournament meets every pair once, and the recheck pairs suspects with the fastest hosts."""

from __future__ import annotations

import pytest

from train_jobs.hostcheck.schedule import (
    covered,
    host_scores,
    pair,
    recheck_rounds,
    round_robin,
    suspects,
)


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


def first_rounds(n: int, k: int, slow_host: int | None = None, slow_pair: tuple[int, int] | None = None,
                 fast: float = 1000.0, slow: float = 10.0) -> dict[tuple[int, int], float]:
    rates = {p: fast for r in round_robin(n)[:k] for p in r}
    for p in rates:
        if (slow_host is not None and slow_host in p) or p == slow_pair:
            rates[p] = slow
    return rates


def test_the_recheck_measures_slow_pairs_again_and_pairs_suspects_with_the_fastest_hosts() -> None:
    rates = first_rounds(32, 3, slow_host=7)
    rates[(0, 1)] = 2000.0  # host 0 and 1 are the fastest
    assert suspects(rates)[0] == 7
    rounds = recheck_rounds(rates, 32)
    assert all(is_matching(r) for r in rounds)
    sevens = [p for r in rounds for p in r if 7 in p]
    again = [p for p in sevens if p in rates]
    new = [p for p in sevens if p not in rates]
    assert len(again) == 2 and len(new) == 2, "two of its slow pairs again, two new partners"
    partners = {a if b == 7 else b for a, b in new}
    best = sorted(host_scores(rates, 32).items(), key=lambda kv: -kv[1])
    assert partners <= {h for h, _ in best[:4]}


def test_after_a_full_tournament_only_the_slow_pairs_are_measured_again() -> None:
    rates = {p: 900.0 for r in round_robin(6) for p in r}
    rates[(1, 4)] = 20.0
    assert recheck_rounds(rates, 6) == [[(1, 4)]]


def test_no_suspect_means_no_recheck() -> None:
    assert suspects(first_rounds(16, 3)) == [] and recheck_rounds(first_rounds(16, 3), 16) == []


def test_a_slow_pair_makes_both_its_hosts_suspects() -> None:
    rates = first_rounds(16, 3, slow_pair=round_robin(16)[1][2])
    a, b = round_robin(16)[1][2]
    assert set(suspects(rates)) == {a, b}
    assert pair(b, a) == (a, b)


def test_rank_zero_plays_the_tournament_while_the_budget_lasts_then_rechecks_once() -> None:
    from train_jobs.hostcheck.check import plan_next
    from train_jobs.hostcheck.schedule import MAX_RECHECK_ROUNDS

    tour = round_robin(32)
    rates = first_rounds(32, 3, slow_host=5)
    assert plan_next(0, tour, {}, 99.0, 20.0, False, 32) == ("tournament", [tour[0]])  # MIN_ROUNDS whatever the budget
    assert plan_next(3, tour, rates, 5.0, 20.0, False, 32) == ("tournament", [tour[3]])  # within the budget
    kind, rounds = plan_next(3, tour, rates, 25.0, 20.0, False, 32)
    assert kind == "recheck" and 0 < len(rounds) <= MAX_RECHECK_ROUNDS and any(5 in p for p in rounds[0])
    assert plan_next(3, tour, rates, 30.0, 20.0, True, 32) == ("done", [])  # one recheck at most
    assert plan_next(3, tour, first_rounds(32, 3), 25.0, 20.0, False, 32) == ("done", [])  # nothing suspect
    full = {p: 900.0 for r in tour for p in r}
    assert plan_next(31, tour, full, 99.0, 20.0, False, 32) == ("done", [])  # every pair met, none slow
    full[(2, 9)] = 10.0
    assert plan_next(31, tour, full, 99.0, 20.0, False, 32) == ("recheck", [[(2, 9)]])  # the slow one again


def test_slow_pairs_are_confirmed_in_small_rounds() -> None:
    from train_jobs.hostcheck.schedule import CONFIRM_PER_ROUND

    rates = {p: 900.0 for r in round_robin(32) for p in r}
    slow = [p for p in round_robin(32)[4]][:12]  # twelve slow pairs of one round: congestion, say
    for p in slow:
        rates[p] = 50.0
    rounds = recheck_rounds(rates, 32)
    assert sorted(p for r in rounds for p in r) == sorted(slow)
    assert all(len(r) <= CONFIRM_PER_ROUND and is_matching(r) for r in rounds) and len(rounds) == 3
