"""Which rank holds the others back, and for how long. A DDP job's ranks all take the same wall
time per step (the gradient all-reduce waits for the slowest), so step time cannot name the slow
one; DDP's own timings can: the slow rank is the one that waits least in the all-reduce after its
backward pass, and the others wait for it by as much as it is behind. Where its time goes says which
side is slow: before its forward pass (the input: data loading, preprocessing) or inside
forward/backward (compute).

The rank wrapper sends, about twice a second, each rank's medians over its last steps
(orchestrator/remote/wire.py StepWindow). A round is complete when every rank has sent one; it
measures each rank against the median of the others. One round is noise on a busy host (a window
of two steps, a lost scheduler slice), so a rank is judged on the median of its last
WINDOW_SAMPLES sampled iterations (its last rounds, each counted as many times as it has
iterations). Nothing is named in the warm-up (the first seconds after the first window: DDP
rebuilds its buckets after its first iteration, and the ranks finish their imports and fill their
input queues unevenly). Then a rank slower by the threshold, and by MIN_LAG_MS, is named: a
straggler episode starts. It ends when the rank is back under half the threshold for the recovery
window: the gap between the two levels and the window keep it from flapping. A rank that slows
again is named again."""

from __future__ import annotations

import bisect
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from orchestrator.remote.wire import StepWindow

WINDOW_SAMPLES = 60  # a rank is judged on its last rounds that hold this many sampled iterations...
MIN_ROUNDS = 3  # ...and at least this many rounds
KEPT_ROUNDS = WINDOW_SAMPLES  # the most rounds kept per rank (a round holds a sampled iteration or more)
MIN_LAG_MS = 2.0  # a lag below this is timer and scheduling noise, whatever the ratio
BACK_FRACTION = 0.5  # back to pace: under this fraction of the threshold
SIDES = {
    "input": "before its forward pass (input: data loading or preprocessing)",
    "compute": "in its forward/backward pass (compute)",
    "elsewhere": "outside its forward/backward pass and its input (after backward: the optimizer, logging)",
}

Key = tuple[str, int]  # (host, local rank)


@dataclass(frozen=True)
class RankWindow:
    host: str
    local_rank: int
    rank: int | None
    window: StepWindow

    @property
    def key(self) -> Key:
        return (self.host, self.local_rank)

    def label(self) -> str:
        rank = f"rank {self.rank}" if self.rank is not None else f"local rank {self.local_rank}"
        return f"{rank} on {self.host}"


@dataclass(frozen=True)
class Comparison:
    """One rank of one round against the others: by how much it is slower (the slowest, for compare())."""

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


def _median_without(ordered: Sequence[float], value: float) -> float:
    """The median of `ordered` (sorted, holding `value`) without one `value`: each rank against the
    others in O(log n), not O(n)."""
    skip = bisect.bisect_left(ordered, value)
    n = len(ordered) - 1

    def at(k: int) -> float:
        return ordered[k if k < skip else k + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def _usable(windows: Sequence[RankWindow]) -> list[RankWindow]:
    """The windows with DDP timings: a rank without them would look as if it never waited."""
    return [w for w in windows if w.window.wait_ms is not None and w.window.samples > 0]


def measure(windows: Sequence[RankWindow]) -> dict[Key, Comparison]:
    """Every rank with DDP timings against the median of the others (a lag below 0: not the slow
    one); none with fewer than two such ranks."""
    usable = _usable(windows)
    if len(usable) < 2:
        return {}
    waits = sorted(w.window.wait_ms or 0.0 for w in usable)
    data = sorted(v for w in usable if (v := w.window.data_ms) is not None)
    compute = sorted(v for w in usable if (v := w.window.compute_ms) is not None)
    step = _median([w.window.p50_ms for w in usable])
    found = {}
    for w in usable:
        mine = w.window.wait_ms or 0.0
        others_wait = _median_without(waits, mine)
        lag, work = others_wait - mine, step - others_wait  # work: the others' own time per step
        if work > 0:
            side = _side(_excess(w.window.data_ms, data), _excess(w.window.compute_ms, compute), lag)
            found[w.key] = Comparison(w, lag / work, lag, side)
    return found


def compare(windows: Sequence[RankWindow]) -> Comparison | None:
    """The rank that waits least in the all-reduce, against the median of the others."""
    usable = _usable(windows)
    if len(usable) < 2:
        return None
    found = measure(usable).get(min(usable, key=lambda w: w.window.wait_ms or 0.0).key)
    return found if found is not None and found.lag_ms > 0 else None


def _excess(mine: float | None, ordered: Sequence[float]) -> float:
    """How much more than the others' median (`ordered`: every rank's value, sorted) one rank's is."""
    return mine - _median_without(ordered, mine) if mine is not None and len(ordered) > 1 else 0.0


def _side(before: float, compute: float, lag: float) -> str:
    if max(before, compute) < lag / 2:
        return "elsewhere"
    return "input" if before >= compute else "compute"


# -- episodes over time -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Slowed:
    """A rank named: slower than the threshold over its window (`comparison` holds its medians),
    since `since` (the watch's clock: time.monotonic(), or the caller's)."""

    comparison: Comparison
    since: float


@dataclass(frozen=True)
class BackToPace:
    """A named rank back under half the threshold since `until`, for the recovery window."""

    slow: RankWindow
    since: float  # when it slowed (its Slowed's)
    until: float

    def text(self) -> str:
        return f"{self.slow.label()} back to pace after {self.until - self.since:.0f} s"


Change = Slowed | BackToPace


@dataclass(frozen=True, slots=True)
class Round:
    """One rank in one round, as its window keeps it (small: a rank keeps up to KEPT_ROUNDS)."""

    at: float
    slower: float
    lag_ms: float
    side: str
    samples: int


@dataclass
class _Rank:
    """One rank's last rounds, and its episode."""

    latest: Comparison
    rounds: deque[Round] = field(default_factory=lambda: deque(maxlen=KEPT_ROUNDS))
    named_since: float | None = None  # named, not back to pace yet
    under_since: float | None = None  # named, and its level back under half the threshold since
    back_from: float = 0.0  # ...and its rounds back since


def _window(rounds: Sequence[Round]) -> list[Round]:
    """The newest rounds that hold WINDOW_SAMPLES sampled iterations and MIN_ROUNDS rounds (all
    there are, when fewer)."""
    taken: list[Round] = []
    samples = 0
    for found in reversed(rounds):
        taken.append(found)
        samples += found.samples
        if len(taken) >= MIN_ROUNDS and samples >= WINDOW_SAMPLES:
            break
    return taken[::-1]


def _full(window: Sequence[Round]) -> bool:
    return len(window) >= MIN_ROUNDS and sum(r.samples for r in window) >= WINDOW_SAMPLES


def _weighted_median(values: Sequence[tuple[float, int]]) -> float:
    """The median of values each counted `weight` times."""
    ordered = sorted(values)
    half, seen = sum(w for _, w in ordered) / 2, 0
    for value, weight in ordered:
        seen += weight
        if seen >= half:
            return value
    return ordered[-1][0]


def _start(window: Sequence[Round], flag: Callable[[float, float], bool]) -> float:
    """When what `flag` (slower, lag) says began: the earliest round it holds for, from which on it
    holds for at least as many sampled iterations as not (a stray round before the change does not
    move it)."""
    start, balance = window[-1].at, 0
    for found in reversed(window):
        holds = flag(found.slower, found.lag_ms)
        balance += found.samples if holds else -found.samples
        if balance >= 0 and holds:
            start = found.at
    return start


class StragglerWatch:
    """Rounds of every rank's latest window. After `warmup` seconds, a rank slower than `threshold`
    over its last rounds (the median of their sampled iterations) is named (Slowed); once that median
    is under half the threshold for `recovery` seconds, it is back to pace (BackToPace), and may be
    named again. Times are time.monotonic() unless the caller gives its own."""

    def __init__(self, threshold: float, warmup: float = 0.0, recovery: float = 0.0) -> None:
        self.threshold = threshold
        self.warmup = warmup
        self.recovery = recovery
        self.first_seen: float | None = None  # the first window's time: the warm-up counts from it
        self.latest: dict[Key, RankWindow] = {}
        self.fresh: set[Key] = set()  # ranks with a window since the last round
        self.current: Comparison | None = None  # the slowest rank now (the status line's)
        self.ranks: dict[Key, _Rank] = {}

    def observe(self, window: RankWindow, now: float | None = None) -> None:
        if self.first_seen is None:
            self.first_seen = time.monotonic() if now is None else now
        self.latest[window.key] = window
        self.fresh.add(window.key)

    def forget(self, host: str) -> None:
        """A host that is gone (lost, or its ranks ended) no longer takes part in the rounds; its
        ranks' episodes stay unended."""
        for key in [k for k in self.latest if k[0] == host]:
            del self.latest[key]
            self.fresh.discard(key)
            self.ranks.pop(key, None)

    def check(self, now: float | None = None) -> list[Change]:
        """What changed, once every rank has sent a window since the last round."""
        now = time.monotonic() if now is None else now
        if len(self.latest) < 2 or self.fresh != set(self.latest):
            return []
        self.fresh = set()
        windows = list(self.latest.values())
        if self.first_seen is None or now - self.first_seen < self.warmup:
            self.current = compare(windows)
            return []
        for key, found in measure(windows).items():
            rank = self.ranks.setdefault(key, _Rank(found))
            rank.latest = found
            rank.rounds.append(Round(now, found.slower, found.lag_ms, found.side, found.slow.window.samples))
        levels = [(rank, window, self.level(rank, window)) for rank in self.ranks.values()
                  if (window := _window(rank.rounds))]
        slowest = max((level for _, _, level in levels), key=lambda c: c.slower, default=None)
        self.current = slowest if slowest is not None and slowest.lag_ms > 0 else None
        changes = [self._change(rank, window, level, now) for rank, window, level in levels]
        return [c for c in changes if c is not None]

    def level(self, rank: _Rank, window: Sequence[Round]) -> Comparison:
        """A rank over its window: the medians of its slowness and lag (each round counted as many
        times as it has sampled iterations), its latest window, and the side most of its slow rounds
        were on."""
        sides = [r.side for r in window if self._slow(r.slower, r.lag_ms)] or [window[-1].side]
        return Comparison(rank.latest.slow, _weighted_median([(r.slower, r.samples) for r in window]),
                          _weighted_median([(r.lag_ms, r.samples) for r in window]),
                          max(reversed(sides), key=sides.count))

    def _slow(self, slower: float, lag_ms: float) -> bool:
        return slower >= self.threshold and lag_ms >= MIN_LAG_MS

    def _back(self, slower: float, lag_ms: float) -> bool:
        return slower < self.threshold * BACK_FRACTION or lag_ms < MIN_LAG_MS

    def _change(self, rank: _Rank, window: Sequence[Round], level: Comparison, now: float) -> Change | None:
        if rank.named_since is None:
            if not _full(window) or not self._slow(level.slower, level.lag_ms):
                return None
            rank.named_since = _start(window, self._slow)
            return Slowed(level, rank.named_since)
        if not self._back(level.slower, level.lag_ms):
            rank.under_since = None
            return None
        if rank.under_since is None:
            rank.under_since, rank.back_from = now, _start(window, self._back)
        if now - rank.under_since < self.recovery:
            return None
        back = BackToPace(level.slow, rank.named_since, rank.back_from)
        rank.named_since = rank.under_since = None
        return back
