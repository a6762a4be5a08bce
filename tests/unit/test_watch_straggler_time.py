"""Stragglers over time (orchestrator/watch/straggler.py StragglerWatch), fed a synthetic job's step
timings as its ranks' wrappers send them: every half second each rank's medians over the steps it
took since, on the job's own clock. Each step, rank r does its own work (input, compute, rest),
jittered, plus whatever delay the scenario gives it at that time; the step waits for the slowest
rank, and each rank waits in the all-reduce for that one plus the all-reduce's own time."""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from orchestrator.remote.wire import StepWindow
from orchestrator.watch.straggler import BackToPace, Change, RankWindow, Slowed, StragglerWatch

THRESHOLD = 0.10
WORK_MS = (10.0, 24.0, 6.0)  # input, compute, rest: 40 ms of a rank's own work per step
COMM_MS = 20.0
WARMUP = 5.0
RECOVERY = 5.0
NAMED_WITHIN = 5.0  # seconds: WINDOW_SAMPLES (60) steps of 60 ms are 3.6 s, half of them slow suffice
HOSTS = ("node0", "node0", "node1", "node1")  # 2 hosts x 2 ranks: rank r is local rank r % 2

Delay = Callable[[int, float], float]  # (rank, seconds into the job) -> ms more on its input


def steady(_rank: int, _t: float) -> float:
    return 0.0


@dataclass
class Job:
    """A job's clock and its ranks' steps since their last record."""

    delay: Delay
    noise: float = 0.15  # each part of a rank's work jittered by up to this fraction at every step
    hiccups: float = 0.0  # the chance that a rank loses a scheduler slice (HICCUP_MS) in a step
    seed: int = 0

    def __post_init__(self) -> None:
        self.random = random.Random(self.seed)

    def window(self, t: float) -> list[RankWindow]:
        """Every rank's record for the half second before `t` (a loaded box: 2 to 8 steps in it)."""
        steps = self.random.randint(2, 8)
        rows: list[list[tuple[float, float, float, float]]] = [[] for _ in HOSTS]
        for _ in range(steps):
            works = [self._work(rank, t) for rank in range(len(HOSTS))]
            slowest = max(sum(w) for w in works)
            for rank, (data, compute, rest) in enumerate(works):
                rows[rank].append((slowest + COMM_MS, COMM_MS + slowest - (data + compute + rest), data, compute))
        out = []
        for rank, per_step in enumerate(rows):
            p50, wait, data, compute = (statistics.median(col) for col in zip(*per_step, strict=True))
            window = StepWindow(steps, steps * p50 / 1000, p50, max(r[0] for r in per_step), wait, data, compute,
                                steps)
            out.append(RankWindow(HOSTS[rank], rank % 2, rank, window))
        return out

    def _work(self, rank: int, t: float) -> tuple[float, float, float]:
        data, compute, rest = (x * (1 + self.random.uniform(-self.noise, self.noise)) for x in WORK_MS)
        if self.random.random() < self.hiccups:
            data += HICCUP_MS
        return data + self.delay(rank, t), compute, rest


HICCUP_MS = 30.0


def run(job: Job, seconds: float, warmup: float = WARMUP, recovery: float = RECOVERY) -> list[tuple[float, Change]]:
    """Every change the watch reports over `seconds` of the job, with when it said it."""
    watch = StragglerWatch(THRESHOLD, warmup, recovery)
    said: list[tuple[float, Change]] = []
    t = 0.5
    while t <= seconds:
        for w in job.window(t):
            watch.observe(w, t)
        said += [(t, change) for change in watch.check(t)]
        t += 0.5
    return said


def slowed_between(rank: int, ms: float, *spans: tuple[float, float]) -> Delay:
    def delay(r: int, t: float) -> float:
        return ms if r == rank and any(start <= t < end for start, end in spans) else 0.0
    return delay


@pytest.mark.parametrize("seed", range(5))
def test_a_steady_job_with_jitter_and_hiccups_names_nobody(seed: int) -> None:
    """Ten minutes of +-15 % per step, 2 to 8 steps per record, and a lost scheduler slice (30 ms) in
    5 % of a rank's steps: what a loaded 2-core box does to a balanced job."""
    assert run(Job(steady, noise=0.15, hiccups=0.05, seed=seed), 600.0) == []


def test_a_transient_straggler_is_named_then_back_to_pace() -> None:
    """Rank 1 20 ms slower from 10 s to 30 s, then at pace to the end."""
    said = run(Job(slowed_between(1, 20.0, (10.0, 30.0)), seed=1), 70.0)
    assert [type(c) for _, c in said] == [Slowed, BackToPace]
    (named_at, slowed), (back_at, back) = said
    assert isinstance(slowed, Slowed) and isinstance(back, BackToPace)
    assert (slowed.comparison.slow.rank, slowed.comparison.slow.host, slowed.comparison.side) == (1, "node0", "input")
    assert 10.0 <= slowed.since <= 11.0  # from its first slow round...
    assert named_at <= slowed.since + NAMED_WITHIN  # ...named once its window holds more slow steps than not
    assert 30.0 <= back.until <= 31.0
    assert back_at >= back.until + RECOVERY  # said once the recovery window is over
    assert back.text() == f"rank 1 on node0 back to pace after {back.until - back.since:.0f} s"
    assert 19 <= back.until - back.since <= 21


def test_a_rank_that_slows_again_is_named_again() -> None:
    said = run(Job(slowed_between(3, 20.0, (10.0, 25.0), (45.0, 60.0)), seed=2), 80.0)
    assert [type(c) for _, c in said] == [Slowed, BackToPace, Slowed, BackToPace]
    starts = [c.since for _, c in said if isinstance(c, Slowed)]
    assert 10.0 <= starts[0] <= 11.0 and 45.0 <= starts[1] <= 46.0
    assert all(isinstance(c, Slowed) and c.comparison.slow.rank == 3 for _, c in said[::2])


def test_a_short_dip_inside_the_recovery_window_does_not_end_it() -> None:
    """Slow from 10 s to 40 s, but at pace for 2 s in the middle (less than the recovery window): one
    episode, not two."""
    said = run(Job(slowed_between(2, 20.0, (10.0, 24.0), (26.0, 40.0)), seed=3), 60.0)
    assert [type(c) for _, c in said] == [Slowed, BackToPace]
    back = said[1][1]
    assert isinstance(back, BackToPace) and 40.0 <= back.until <= 41.0


def test_a_straggler_still_slow_at_the_end_is_never_back() -> None:
    said = run(Job(slowed_between(0, 20.0, (10.0, 1e9)), seed=4), 60.0)
    assert [type(c) for _, c in said] == [Slowed]


def warmup_spikes(rank: int, t: float) -> float:
    """Start-up: rank 3 fills its input queue for the first 8 s (40 ms more per step), rank 0 is slow
    on and off while its imports finish."""
    if rank == 3 and t < 8.0:
        return 40.0
    return 30.0 if rank == 0 and t < 6.0 and int(t * 2) % 3 else 0.0


def test_warm_up_spikes_name_nobody() -> None:
    assert run(Job(warmup_spikes, seed=5), 60.0, warmup=10.0) == []
    named = run(Job(warmup_spikes, seed=5), 60.0, warmup=0.0)  # what the warm-up keeps out
    assert named and {c.comparison.slow.rank for _, c in named if isinstance(c, Slowed)} <= {0, 3}


def test_a_straggler_from_the_start_is_named_once_the_warm_up_is_over() -> None:
    said = run(Job(slowed_between(2, 20.0, (0.0, 1e9)), seed=6), 30.0)
    assert [type(c) for _, c in said] == [Slowed]
    assert WARMUP <= said[0][0] <= WARMUP + 8.0  # its window full: 60 steps, 5 a record on average
