"""Which rank holds the others back. A DDP job's ranks all take the same wall time per step (the
gradient all-reduce waits for the slowest), so step time cannot name the slow one; DDP's own
timings can: the slow rank is the one that waits least in the all-reduce after its backward pass,
and the others wait for it by as much as it is behind. Where its time goes says which side is slow:
before its forward pass (the input: data loading, preprocessing) or inside forward/backward (compute).

The rank wrapper sends, about twice a second, each rank's medians over its last steps
(orchestrator/remote/wire.py StepWindow). A round is complete when every rank has sent one; a rank
that is the slowest by at least the threshold in two rounds in a row, over enough sampled
iterations, is named once."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.remote.wire import StepWindow

CONFIRM_ROUNDS = 2  # rounds in a row that name the same rank before it is announced
MIN_SAMPLES = 5  # DDP iterations of the slow rank behind the rounds that name it
MIN_LAG_MS = 1.0  # a lag below this is timer noise, whatever the ratio
SIDES = {
    "input": "before its forward pass (input: data loading or preprocessing)",
    "compute": "in its forward/backward pass (compute)",
    "elsewhere": "outside its forward/backward pass and its input (after backward: the optimizer, logging)",
}


@dataclass(frozen=True)
class RankWindow:
    host: str
    local_rank: int
    rank: int | None
    window: StepWindow

    def label(self) -> str:
        rank = f"rank {self.rank}" if self.rank is not None else f"local rank {self.local_rank}"
        return f"{rank} on {self.host}"


@dataclass(frozen=True)
class Comparison:
    """The slowest rank of one round, and by how much."""

    slow: RankWindow
    slower: float  # its work per step over the others', minus 1 (0.25: 25 % slower)
    lag_ms: float  # how much longer the others wait for it in the all-reduce, per step
    side: str  # a key of SIDES

    def text(self) -> str:
        return (f"straggler: {self.slow.label()} is {self.slower:.0%} slower than the others: "
                f"{self.lag_ms:.0f} ms more per step {SIDES[self.side]}; the others wait for it in the "
                "gradient all-reduce")

    def short(self) -> str:
        return f"{self.slow.label()} +{self.slower:.0%} ({self.side})"


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def compare(windows: Sequence[RankWindow]) -> Comparison | None:
    """The rank that waits least in the all-reduce, against the median of the others."""
    usable = [w for w in windows if w.window.wait_ms is not None and w.window.samples > 0]
    if len(usable) < 2:
        return None
    slow = min(usable, key=lambda w: w.window.wait_ms or 0.0)
    others = [w for w in usable if w is not slow]
    others_wait = _median([w.window.wait_ms or 0.0 for w in others])
    lag = others_wait - (slow.window.wait_ms or 0.0)
    work = _median([w.window.p50_ms for w in usable]) - others_wait  # the others' own time per step
    if work <= 0 or lag <= 0:
        return None
    return Comparison(slow, lag / work, lag, _side(slow, others, lag))


def _excess(slow: RankWindow, others: Sequence[RankWindow], field: str) -> float:
    mine = getattr(slow.window, field)
    theirs = [getattr(w.window, field) for w in others if getattr(w.window, field) is not None]
    return mine - _median(theirs) if mine is not None and theirs else 0.0


def _side(slow: RankWindow, others: Sequence[RankWindow], lag: float) -> str:
    before = _excess(slow, others, "data_ms")
    compute = _excess(slow, others, "compute_ms")
    if max(before, compute) < lag / 2:
        return "elsewhere"
    return "input" if before >= compute else "compute"


class StragglerWatch:
    """Rounds of every rank's latest window; a rank slower than `threshold` in CONFIRM_ROUNDS rounds
    in a row is announced once."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.latest: dict[tuple[str, int], RankWindow] = {}
        self.fresh: set[tuple[str, int]] = set()  # ranks with a window since the last round
        self.current: Comparison | None = None  # the last round's
        self.streak: list[Comparison] = []
        self.named: set[tuple[str, int]] = set()

    def observe(self, window: RankWindow) -> None:
        key = (window.host, window.local_rank)
        self.latest[key] = window
        self.fresh.add(key)

    def forget(self, host: str) -> None:
        """A host that is gone (lost, or its ranks ended) no longer takes part in the rounds."""
        for key in [k for k in self.latest if k[0] == host]:
            del self.latest[key]
            self.fresh.discard(key)

    def check(self) -> Comparison | None:
        """A new finding, once every rank has sent a window since the last round."""
        if len(self.latest) < 2 or self.fresh != set(self.latest):
            return None
        self.fresh = set()
        found = compare(list(self.latest.values()))
        self.current = found
        if found is None or found.slower < self.threshold or found.lag_ms < MIN_LAG_MS:
            self.streak = []
            return None
        key = (found.slow.host, found.slow.local_rank)
        same = [c for c in self.streak if (c.slow.host, c.slow.local_rank) == key]
        self.streak = [*same, found]
        samples = sum(c.slow.window.samples for c in self.streak)
        if len(self.streak) < CONFIRM_ROUNDS or samples < MIN_SAMPLES or key in self.named:
            return None
        self.named.add(key)
        return found
