"""The straggler verdict (orchestrator/watch/straggler.py), fed windows shaped as a real DDP job's
ranks send them: every rank takes the same wall time per step; each rank's own work (input,
forward/backward, the rest) is W, and it waits step - W in the gradient all-reduce. A slow rank
makes every step longer by its delay d, and the others wait d longer for it."""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from orchestrator.remote.wire import StepWindow
from orchestrator.watch.straggler import (
    KEPT_ROUNDS,
    MIN_ROUNDS,
    SIDES,
    WINDOW_SAMPLES,
    Change,
    Comparison,
    RankWindow,
    Slowed,
    StragglerWatch,
    compare,
    measure,
)

THRESHOLD = 0.10
COMM_MS = 20.0  # the all-reduce's own time: a balanced step of 60 ms is W = 40 plus this


@dataclass(frozen=True)
class Work:
    """One rank's own time per step, in ms."""

    data: float = 10.0  # from its previous step to its forward pass
    compute: float = 24.0  # forward + backward
    rest: float = 6.0  # after backward: optimizer, logging

    @property
    def total(self) -> float:
        return self.data + self.compute + self.rest


def ddp_round(works: Sequence[Work], samples: int = 8, hosts: Sequence[str] | None = None,
              steps: int = 8) -> list[RankWindow]:
    """The windows of one second of a DDP job whose rank i does works[i] per step: the step waits for
    the slowest rank's work, each rank waits in the all-reduce for the slowest one plus COMM_MS."""
    slowest = max(w.total for w in works)
    step = slowest + COMM_MS
    out: list[RankWindow] = []
    for rank, work in enumerate(works):
        window = StepWindow(steps=steps, seconds=steps * step / 1000, p50_ms=step, p95_ms=step * 1.05,
                            wait_ms=COMM_MS + slowest - work.total, data_ms=work.data,
                            compute_ms=work.compute, samples=samples)
        out.append(rank_window(out, hosts[rank] if hosts else f"node{rank}", rank, window))
    return out


def rank_window(before: Sequence[RankWindow], host: str, rank: int, window: StepWindow) -> RankWindow:
    """Rank `rank` on `host`, its local rank counted among the ranks before it on that host."""
    return RankWindow(host, sum(w.host == host for w in before), rank, window)


def slow(side: str, d: float, base: Work = Work()) -> Work:
    """The base work with d ms more on one side."""
    if side == "input":
        return Work(base.data + d, base.compute, base.rest)
    if side == "compute":
        return Work(base.data, base.compute + d, base.rest)
    return Work(base.data, base.compute, base.rest + d)


def feed(watch: StragglerWatch, windows: Sequence[RankWindow], now: float = 0.0) -> Comparison | None:
    """One round: every window observed, then the watch asked; the rank it names, if it names one."""
    for w in windows:
        watch.observe(w, now)
    return named(watch.check(now))


def named(changes: Sequence[Change]) -> Comparison | None:
    slowed = [c.comparison for c in changes if isinstance(c, Slowed)]
    assert len(slowed) <= 1
    return slowed[0] if slowed else None


# -- compare(): one round ---------------------------------------------------------------------------


@pytest.mark.parametrize(("side", "expected"), [("input", "input"), ("compute", "compute"),
                                                ("rest", "elsewhere")])
def test_the_slow_rank_and_its_side_are_named(side: str, expected: str) -> None:
    base = Work()
    d = 0.5 * base.total
    found = compare(ddp_round([base, base, slow(side, d), base]))
    assert found is not None
    assert (found.slow.rank, found.slow.host) == (2, "node2")
    assert found.slower == pytest.approx(0.5)
    assert found.lag_ms == pytest.approx(d)
    assert found.side == expected


def test_a_ten_percent_slowdown_is_measured_as_ten_percent() -> None:
    base = Work()
    found = compare(ddp_round([base, slow("input", 0.10 * base.total), base, base]))
    assert found is not None and found.slow.rank == 1
    assert found.slower == pytest.approx(0.10)
    assert found.side == "input"


def test_a_balanced_round_names_nobody() -> None:
    assert compare(ddp_round([Work()] * 4)) is None


def test_world_size_two() -> None:
    base = Work()
    found = compare(ddp_round([slow("compute", 8.0), base]))
    assert found is not None
    assert found.slow.rank == 0 and found.side == "compute"
    assert found.slower == pytest.approx(8.0 / base.total)


def test_ranks_without_ddp_samples_are_ignored() -> None:
    """A rank with no DDP model (wait_ms None) or no sampled iteration would otherwise look as if it
    never waited: the slowest of all."""
    base = Work()
    windows = ddp_round([base, base, slow("input", 10.0), base])
    no_ddp = RankWindow("node9", 0, 4, StepWindow(8, 0.5, 70.0, 72.0))
    no_samples = RankWindow("node9", 1, 5, StepWindow(8, 0.5, 70.0, 72.0, wait_ms=0.0, data_ms=0.0,
                                                      compute_ms=0.0, samples=0))
    found = compare([no_ddp, no_samples, *windows])
    assert found is not None and found.slow.rank == 2
    assert found.lag_ms == pytest.approx(10.0)


def test_fewer_than_two_ranks_with_samples_compare_nothing() -> None:
    only = ddp_round([slow("input", 10.0), Work()])[:1]
    no_ddp = RankWindow("node1", 0, 1, StepWindow(8, 0.5, 70.0, 72.0))
    assert compare([*only, no_ddp]) is None
    assert compare([]) is None


def test_the_text_names_rank_host_percentage_and_side() -> None:
    base = Work()
    windows = ddp_round([base, base, base, slow("input", 0.25 * base.total)],
                        hosts=["gpu-a", "gpu-a", "gpu-b", "gpu-b"])
    found = compare(windows)
    assert found is not None
    text = found.text()
    assert "rank 3 on gpu-b" in text
    assert "25% slower" in text
    assert "10 ms more per step" in text
    assert SIDES["input"] in text and "data loading" in text
    assert "all-reduce" in text
    assert found.short() == "rank 3 on gpu-b +25% (input)"


@pytest.mark.parametrize(("side", "words"), [("compute", "forward/backward pass (compute)"),
                                             ("rest", "the optimizer")])
def test_the_text_says_the_side(side: str, words: str) -> None:
    found = compare(ddp_round([Work(), slow(side, 20.0)]))
    assert found is not None and words in found.text()


def test_a_rank_without_a_global_rank_is_named_by_its_local_rank() -> None:
    windows = [RankWindow(w.host, 3, None, w.window) for w in ddp_round([slow("input", 10.0), Work()])]
    found = compare(windows)
    assert found is not None and "local rank 3 on node0" in found.text()


# -- StragglerWatch: rounds -------------------------------------------------------------------------


def slow_rounds(d: float, rank: int = 2, world: int = 4, side: str = "input", samples: int = 8) -> list[RankWindow]:
    works = [Work()] * world
    works[rank] = slow(side, d)
    return ddp_round(works, samples=samples)


def to_fill(samples: int = 8) -> int:
    """The rounds of `samples` sampled iterations each that fill a rank's window."""
    return max(MIN_ROUNDS, -(-WINDOW_SAMPLES // samples))


def test_a_ten_percent_straggler_is_announced_once_its_window_is_full() -> None:
    watch = StragglerWatch(THRESHOLD)
    d = 0.10 * Work().total
    said = [feed(watch, slow_rounds(d)) for _ in range(to_fill())]
    assert said[:-1] == [None] * (to_fill() - 1)
    found = said[-1]
    assert found is not None
    assert (found.slow.rank, found.slow.host, found.side) == (2, "node2", "input")
    assert found.slower == pytest.approx(0.10) and found.lag_ms == pytest.approx(d)


def test_just_under_the_threshold_is_never_announced() -> None:
    watch = StragglerWatch(THRESHOLD)
    d = 0.09 * Work().total
    assert all(feed(watch, slow_rounds(d)) is None for _ in range(3 * to_fill()))
    assert watch.current is not None and watch.current.slow.rank == 2  # still the slowest, for the status


def test_a_round_completes_only_when_every_rank_sent_a_window() -> None:
    watch = StragglerWatch(THRESHOLD)
    for _ in range(to_fill() - 1):
        assert feed(watch, slow_rounds(20.0)) is None and watch.current is not None
    watch.current = None
    last = slow_rounds(20.0)
    for w in last[:3]:
        watch.observe(w)
        watch.observe(w)  # a rank that sends twice does not stand in for another
    assert watch.check() == []
    assert watch.current is None  # no round was compared
    watch.observe(last[3])
    found = named(watch.check())
    assert found is not None and found.slow.rank == 2


@pytest.mark.parametrize(("pattern", "expected"), [((True, False, False), None), ((True, True, False), 2)])
def test_a_rank_is_judged_on_the_median_of_its_window(pattern: tuple[bool, ...], expected: int | None) -> None:
    """Slow in one round of three: a few bad records, nobody named; in two of three: named."""
    watch = StragglerWatch(THRESHOLD)
    said = [feed(watch, slow_rounds(20.0) if pattern[n % 3] else ddp_round([Work()] * 4)) for n in range(30)]
    assert [f.slow.rank for f in said if f is not None] == ([expected] if expected is not None else [])


def test_two_slow_ranks_are_each_named() -> None:
    watch = StragglerWatch(THRESHOLD)
    works = [Work(), slow("input", 20.0), Work(), slow("compute", 20.0)]
    changes = [c for _ in range(to_fill()) for c in feed_all(watch, ddp_round(works))]
    assert sorted((c.comparison.slow.rank, c.comparison.side) for c in changes if isinstance(c, Slowed)) == [
        (1, "input"), (3, "compute")]


def feed_all(watch: StragglerWatch, windows: Sequence[RankWindow]) -> list[Change]:
    for w in windows:
        watch.observe(w, 0.0)
    return watch.check(0.0)


def test_the_window_needs_its_sampled_iterations() -> None:
    per_round = 1
    rounds_needed = to_fill(per_round)
    assert rounds_needed > MIN_ROUNDS  # else this test shows nothing
    watch = StragglerWatch(THRESHOLD)
    said = [feed(watch, slow_rounds(20.0, samples=per_round)) for _ in range(rounds_needed)]
    assert said[:-1] == [None] * (rounds_needed - 1)
    assert said[-1] is not None and said[-1].slow.rank == 2


def test_a_rank_that_stays_slow_is_announced_once() -> None:
    watch = StragglerWatch(THRESHOLD)
    said = [feed(watch, slow_rounds(20.0)) for _ in range(5 * to_fill())]
    assert sum(s is not None for s in said) == 1
    # another rank turning slow later is still announced
    said = [feed(watch, slow_rounds(20.0, rank=0)) for _ in range(to_fill())]
    assert [s.slow.rank for s in said if s is not None] == [0]


def test_a_lag_below_min_lag_ms_is_noise() -> None:
    """30 % of a 2 ms step's work is 0.6 ms: under MIN_LAG_MS, whatever the ratio."""
    tiny = Work(0.5, 1.0, 0.5)
    watch = StragglerWatch(THRESHOLD)
    for _ in range(2 * to_fill()):
        assert feed(watch, ddp_round([tiny, tiny, slow("input", 0.6, tiny), tiny])) is None
    assert watch.current is not None and watch.current.slower == pytest.approx(0.3)


def test_world_size_two_is_announced() -> None:
    watch = StragglerWatch(THRESHOLD)
    said = [feed(watch, slow_rounds(6.0, rank=1, world=2, side="compute")) for _ in range(to_fill())]
    assert said[-1] is not None
    assert (said[-1].slow.rank, said[-1].side) == (1, "compute")


def test_forget_drops_a_hosts_ranks_from_the_rounds() -> None:
    watch = StragglerWatch(THRESHOLD)
    hosts = ["node0", "node0", "gone", "gone"]
    feed(watch, ddp_round([Work(), Work(), slow("input", 20.0), Work()], hosts=hosts))
    assert watch.current is not None and watch.current.slow.host == "gone"
    watch.forget("gone")
    assert set(watch.latest) == {("node0", 0), ("node0", 1)}
    # the rounds go on with the ranks left: they complete without "gone", and name node0's slow rank
    said = [feed(watch, ddp_round([slow("compute", 20.0), Work()], hosts=hosts[:2])) for _ in range(to_fill())]
    assert [(f.slow.host, f.slow.local_rank, f.side) for f in said if f is not None] == [("node0", 0, "compute")]


def test_a_forgotten_host_that_never_sent_does_not_hold_the_round() -> None:
    watch = StragglerWatch(THRESHOLD)
    for _ in range(to_fill() - 1):
        windows = ddp_round([slow("input", 20.0), Work(), Work()], hosts=["a", "b", "c"])
        assert feed(watch, windows) is None and watch.current is not None  # a complete round
    watch.current = None
    windows = ddp_round([slow("input", 20.0), Work(), Work()], hosts=["a", "b", "c"])
    watch.observe(windows[0])
    watch.observe(windows[1])
    assert watch.check() == [] and watch.current is None  # "c" has not sent yet
    watch.forget("c")
    found = named(watch.check())
    assert found is not None and found.slow.host == "a"


# -- noise ------------------------------------------------------------------------------------------


def noisy_round(rnd: random.Random, noise: float, world: int, steps: int, late: int | None = None,
                d: float = 0.0) -> list[RankWindow]:
    """A job's window: each rank's input, compute and rest jittered by +-noise at every step (rank
    `late` spends d ms more on its input), the step waiting for that step's slowest rank; each
    window holds the medians of its steps, as the rank wrapper sends them."""
    per_rank: list[list[tuple[float, float, float, float]]] = [[] for _ in range(world)]
    base = Work()
    for _ in range(steps):
        works = [Work(*(x * (1 + rnd.uniform(-noise, noise)) for x in (base.data, base.compute, base.rest)))
                 for _ in range(world)]
        if late is not None:
            works[late] = slow("input", d, works[late])
        slowest = max(w.total for w in works)
        for rank, w in enumerate(works):
            per_rank[rank].append((slowest + COMM_MS, COMM_MS + slowest - w.total, w.data, w.compute))
    out = []
    for rank, rows in enumerate(per_rank):
        p50, wait, data, compute = (statistics.median(col) for col in zip(*rows, strict=True))
        window = StepWindow(steps, steps * p50 / 1000, p50, max(r[0] for r in rows), wait, data, compute, steps)
        out.append(RankWindow(f"node{rank}", 0, rank, window))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_balanced_job_with_fifteen_percent_step_noise_names_nobody(seed: int) -> None:
    rnd = random.Random(seed)
    watch = StragglerWatch(THRESHOLD)
    names = [f.short() for f in (feed(watch, noisy_round(rnd, 0.15, 4, steps=8)) for _ in range(200)) if f]
    assert names == []


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_ten_percent_straggler_stands_out_of_the_same_noise(seed: int) -> None:
    rnd = random.Random(seed)
    watch = StragglerWatch(THRESHOLD)
    d = 0.10 * Work().total
    found = [f for f in (feed(watch, noisy_round(rnd, 0.15, 4, steps=8, late=1, d=d)) for _ in range(20)) if f]
    assert [(f.slow.rank, f.side) for f in found] == [(1, "input")]


def per_window_noise_round(rnd: random.Random, noise: float) -> list[RankWindow]:
    base = Work()
    works = [Work(*(x * (1 + rnd.uniform(-noise, noise)) for x in (base.data, base.compute, base.rest)))
             for _ in range(4)]
    return ddp_round(works)


# -- every rank at once, and bounds -------------------------------------------------------------------


def naive(target: RankWindow, windows: Sequence[RankWindow]) -> tuple[float, float, str] | None:
    """One rank against the others, written out the slow way: (slower, lag, side)."""
    usable = [w for w in windows if w.window.wait_ms is not None and w.window.samples > 0]
    if target not in usable or len(usable) < 2:
        return None
    others = [w for w in usable if w is not target]
    others_wait = statistics.median(w.window.wait_ms or 0.0 for w in others)
    lag = others_wait - (target.window.wait_ms or 0.0)
    work = statistics.median(w.window.p50_ms for w in usable) - others_wait
    if work <= 0:
        return None

    def excess(field: str) -> float:
        mine = getattr(target.window, field)
        theirs = [getattr(w.window, field) for w in others if getattr(w.window, field) is not None]
        return float(mine - statistics.median(theirs)) if mine is not None and theirs else 0.0

    before, compute = excess("data_ms"), excess("compute_ms")
    side = "elsewhere" if max(before, compute) < lag / 2 else "input" if before >= compute else "compute"
    return lag / work, lag, side


@pytest.mark.parametrize("seed", range(20))
def test_every_rank_is_measured_against_the_median_of_the_others(seed: int) -> None:
    """measure() takes each rank out of the sorted round (O(log n) a rank): the same as doing it by hand,
    ties, missing timings and all."""
    rnd = random.Random(seed)

    def maybe(low: float, high: float) -> float | None:
        return None if rnd.random() < 0.2 else float(rnd.randint(int(low), int(high)))  # integers: ties

    windows = [RankWindow(f"node{i}", 0, i, StepWindow(8, 0.5, float(rnd.randint(50, 80)), 90.0, maybe(0, 30),
                                                       maybe(5, 15), maybe(20, 30), rnd.choice([0, 8, 8, 8])))
               for i in range(rnd.randint(1, 9))]
    found = measure(windows)
    for w in windows:
        expected = naive(w, windows)
        got = found.get(w.key)
        assert (got.slower, got.lag_ms, got.side) == pytest.approx(expected) if got else expected is None


def test_a_rank_keeps_a_bounded_number_of_rounds() -> None:
    watch = StragglerWatch(THRESHOLD)
    for _ in range(3 * KEPT_ROUNDS):
        feed(watch, slow_rounds(20.0, samples=1))
    assert all(len(rank.rounds) <= KEPT_ROUNDS for rank in watch.ranks.values())
