"""Which hosts exchange data in which round of the link check (pure; no torch).

Every round is a matching: each host is in at most one pair, and all pairs of a round run at
once. `round_robin` is the circle method: n - 1 rounds (n rounds for odd n, one host sitting out
each) meet every pair exactly once. Where all rounds do not fit the time budget, the rounds run
are followed by `recheck_rounds`: each host seen on a slow pair meets the fastest hosts it has not
met yet, so a slow *host* (all its pairs slow) is told from a slow *pair* (one link between two
otherwise fine hosts). The recheck also measures the slow pairs again, full tournament or not: a
pair's figure is the best of its measurements, so a moment of contention is not a finding.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

Pair = tuple[int, int]  # (lower rank, higher rank)

MIN_ROUNDS = 3  # run at least this many tournament rounds, whatever the budget: each host meets 3 others
RECHECK_PARTNERS = 2  # new partners each suspect host meets after the budget ran out
CONFIRM_PER_ROUND = 4  # pairs at once in a recheck round
MAX_RECHECK_ROUNDS = 8  # recheck rounds at most
SLOW_LINK = 5.0  # a pair below 1/SLOW_LINK of the median pair rate is slow


def pair(a: int, b: int) -> Pair:
    return (a, b) if a < b else (b, a)


def round_robin(n: int) -> list[list[Pair]]:
    """Every pair of n hosts exactly once, in rounds that are matchings (the circle method)."""
    seats: list[int | None] = [*range(n), *([None] if n % 2 else [])]
    m = len(seats)
    rounds: list[list[Pair]] = []
    for _ in range(m - 1):
        matched = [(seats[i], seats[m - 1 - i]) for i in range(m // 2)]
        rounds.append(sorted(pair(a, b) for a, b in matched if a is not None and b is not None))
        seats = [seats[0], seats[-1], *seats[1:-1]]
    return [r for r in rounds if r]


def median_rate(rates: Mapping[Pair, float]) -> float:
    return statistics.median(rates.values()) if rates else 0.0


def host_scores(rates: Mapping[Pair, float], n: int) -> dict[int, float]:
    """Each host's best measured link (a slow host's best link is still slow)."""
    best: dict[int, float] = {}
    for (a, b), rate in rates.items():
        for h in (a, b):
            best[h] = max(best.get(h, 0.0), rate)
    return {h: best[h] for h in range(n) if h in best}


def suspects(rates: Mapping[Pair, float], slow: float = SLOW_LINK) -> list[int]:
    """The hosts on a slow pair, slowest pair first."""
    median = median_rate(rates)
    out: list[int] = []
    for (a, b), _rate in sorted(rates.items(), key=lambda item: item[1]):
        if rates[(a, b)] * slow < median:
            out += [h for h in (a, b) if h not in out]
    return out


def slow_pairs(rates: Mapping[Pair, float], slow: float = SLOW_LINK) -> list[Pair]:
    """The pairs below 1/slow of the median, slowest first."""
    median = median_rate(rates)
    return [p for p, rate in sorted(rates.items(), key=lambda item: item[1]) if rate * slow < median]


def recheck_rounds(rates: Mapping[Pair, float], n: int, slow: float = SLOW_LINK,
                   partners: int = RECHECK_PARTNERS, per_round: int = CONFIRM_PER_ROUND) -> list[list[Pair]]:
    """Rounds that measure the slow pairs again, and pair each suspect host with the fastest hosts
    it has not met (`partners` new ones at most, fastest first). A slow pair is confirmed only
    by a second measurement in a round of at most `per_round` pairs, so congestion (in the fabric,
    or on hosts that share cores) is not taken for a bad link; a host on many slow pairs has
    `partners` of them measured again (its own verdict is that every pair of it is slow)."""
    wanted: list[Pair] = []
    again: dict[int, int] = {}
    for p in slow_pairs(rates, slow):
        if all(again.get(h, 0) < partners for h in p):
            wanted.append(p)
            for h in p:
                again[h] = again.get(h, 0) + 1
    scores = host_scores(rates, n)
    fast_first = sorted(range(n), key=lambda h: -scores.get(h, 0.0))
    met = set(rates)
    for host in suspects(rates, slow):
        new = [pair(host, other) for other in fast_first if other != host and pair(host, other) not in met]
        for p in new[:partners]:
            met.add(p)
            wanted.append(p)
    rounds: list[list[Pair]] = []
    for p in wanted:  # first fit: each pair into the first round with room where both hosts are free
        for r in rounds:
            if len(r) < per_round and not {p[0], p[1]} & {h for q in r for h in q}:
                r.append(p)
                break
        else:
            rounds.append([p])
    return [sorted(r) for r in rounds]


def covered(rounds: Sequence[Sequence[Pair]], n: int) -> bool:
    """Whether `rounds` meet every pair of n hosts."""
    return len({p for r in rounds for p in r}) == n * (n - 1) // 2
