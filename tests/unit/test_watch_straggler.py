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
    CONFIRM_ROUNDS,
    MIN_SAMPLES,
    SIDES,
    Comparison,
    RankWindow,
    StragglerWatch,
    compare,
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


def feed(watch: StragglerWatch, windows: Sequence[RankWindow]) -> Comparison | None:
    """One round: every window observed, then the watch asked."""
    for w in windows:
        watch.observe(w)
    return watch.check()


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


def test_a_ten_percent_straggler_is_announced_after_the_confirming_rounds() -> None:
    watch = StragglerWatch(THRESHOLD)
    d = 0.10 * Work().total
    said = [feed(watch, slow_rounds(d)) for _ in range(CONFIRM_ROUNDS)]
    assert said[:-1] == [None] * (CONFIRM_ROUNDS - 1)
    found = said[-1]
    assert found is not None
    assert (found.slow.rank, found.slow.host, found.side) == (2, "node2", "input")


def test_just_under_the_threshold_is_never_announced() -> None:
    watch = StragglerWatch(THRESHOLD)
    d = 0.09 * Work().total
    assert all(feed(watch, slow_rounds(d)) is None for _ in range(10))
    assert watch.current is not None and watch.current.slow.rank == 2  # still the slowest, for the status


def test_a_round_completes_only_when_every_rank_sent_a_window() -> None:
    watch = StragglerWatch(THRESHOLD)
    first = slow_rounds(20.0)
    assert feed(watch, first) is None and watch.current is not None
    watch.current = None
    second = slow_rounds(20.0)
    for w in second[:3]:
        watch.observe(w)
        watch.observe(w)  # a rank that sends twice does not stand in for another
    assert watch.check() is None
    assert watch.current is None  # no round was compared
    watch.observe(second[3])
    found = watch.check()
    assert found is not None and found.slow.rank == 2


def test_a_balanced_round_between_breaks_the_streak() -> None:
    watch = StragglerWatch(THRESHOLD)
    assert feed(watch, slow_rounds(20.0)) is None
    assert feed(watch, ddp_round([Work()] * 4)) is None
    assert feed(watch, slow_rounds(20.0)) is None  # the streak starts again
    assert feed(watch, slow_rounds(20.0)) is not None


def test_another_rank_being_slowest_breaks_the_streak() -> None:
    watch = StragglerWatch(THRESHOLD)
    assert feed(watch, slow_rounds(20.0, rank=1)) is None
    assert feed(watch, slow_rounds(20.0, rank=3)) is None
    found = feed(watch, slow_rounds(20.0, rank=3))
    assert found is not None and found.slow.rank == 3


def test_the_rounds_need_min_samples_of_the_slow_rank() -> None:
    per_round = 2
    rounds_needed = -(-MIN_SAMPLES // per_round)
    assert rounds_needed > CONFIRM_ROUNDS  # else this test shows nothing
    watch = StragglerWatch(THRESHOLD)
    said = [feed(watch, slow_rounds(20.0, samples=per_round)) for _ in range(rounds_needed)]
    assert said[:-1] == [None] * (rounds_needed - 1)
    assert said[-1] is not None and said[-1].slow.rank == 2


def test_a_rank_is_announced_once() -> None:
    watch = StragglerWatch(THRESHOLD)
    said = [feed(watch, slow_rounds(20.0)) for _ in range(20)]
    assert sum(s is not None for s in said) == 1
    # another rank turning slow later is still announced
    said = [feed(watch, slow_rounds(20.0, rank=0)) for _ in range(CONFIRM_ROUNDS)]
    assert said[-1] is not None and said[-1].slow.rank == 0


def test_a_lag_below_a_millisecond_is_timer_noise() -> None:
    """30 % of a 2 ms step's work is 0.6 ms: under MIN_LAG_MS, whatever the ratio."""
    tiny = Work(0.5, 1.0, 0.5)
    watch = StragglerWatch(THRESHOLD)
    for _ in range(5):
        assert feed(watch, ddp_round([tiny, tiny, slow("input", 0.6, tiny), tiny])) is None
    assert watch.current is not None and watch.current.slower == pytest.approx(0.3)


def test_world_size_two_is_announced() -> None:
    watch = StragglerWatch(THRESHOLD)
    said = [feed(watch, slow_rounds(6.0, rank=1, world=2, side="compute")) for _ in range(CONFIRM_ROUNDS)]
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
    said = [feed(watch, ddp_round([slow("compute", 20.0), Work()], hosts=hosts[:2])) for _ in range(CONFIRM_ROUNDS)]
    assert said[-1] is not None
    assert (said[-1].slow.host, said[-1].slow.local_rank, said[-1].side) == ("node0", 0, "compute")


def test_a_forgotten_host_that_never_sent_does_not_hold_the_round() -> None:
    watch = StragglerWatch(THRESHOLD)
    windows = ddp_round([slow("input", 20.0), Work(), Work()], hosts=["a", "b", "c"])
    assert feed(watch, windows) is None and watch.current is not None  # round 1 complete
    watch.current = None
    windows = ddp_round([slow("input", 20.0), Work(), Work()], hosts=["a", "b", "c"])
    watch.observe(windows[0])
    watch.observe(windows[1])
    assert watch.check() is None and watch.current is None  # "c" has not sent yet
    watch.forget("c")
    found = watch.check()
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
    named = [f.short() for f in (feed(watch, noisy_round(rnd, 0.15, 4, steps=8)) for _ in range(200)) if f]
    assert named == []


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
