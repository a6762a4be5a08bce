"""Which hosts exchange data in which round of the link check, and how long a phase may wait (pure;
no torch).

Every round is a matching: each host is in at most one pair, and all pairs of a round run at
once. `round_robin` is the circle method: n - 1 rounds (n rounds for odd n, one host sitting out
each) meet every pair exactly once. After the tournament (all of it, or what fit the budget),
`recheck_rounds` settles what the figures leave in doubt (verdict.py): a slow pair between two
hosts at pace is measured again, and a host on a slow link with too few partners to tell meets
hosts known good it has not met (different ones each time), as the pairwise suites do, until
the verdict holds or the recheck rounds run out.

A host slow with every partner after MIN_ROUNDS rounds sits out the rest of the tournament
(`sitting_out`): its pairs would only cost their cap, and its verdict is settled by the recheck.

`bound` is every wait's deadline: a multiple of what the hosts that finished took, with a floor;
a host (or pair) past it is named, and the rest goes on without it. `start_deadline` is doctor's own
bound on the start, where node 0 (the one that names the others) has not started to coordinate.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Collection, Mapping, Sequence

from train_jobs.hostcheck.verdict import Judgement

Pair = tuple[int, int]  # (lower rank, higher rank)

MIN_ROUNDS = 3  # run at least this many tournament rounds, whatever the budget: each host meets 3 others
RECHECK_PARTNERS = 2  # known-good partners a host in doubt meets per recheck
CONFIRM_PER_ROUND = 4  # pairs at once in a recheck round ...
PER_KERNEL = 2  # ... and at most this many on hosts of one kernel (they share its cores)
MAX_RECHECK_ROUNDS = 16  # recheck rounds at most ...
RECHECK_BUDGET_S = 10.0  # ... and seconds of them

# Deadlines: (floor seconds, multiple of the median time of those that finished)
JOIN_BOUND = (10.0, 3.0)  # every host's check started (torch imported, the coordinator reached)
COMPUTE_BOUND = (5.0, 10.0)  # one timing window on every device of a host
LINK_BOUND = (1.0, 10.0)  # one pair's exchanges: the pair stops itself past it, with what it moved
LINK_SLACK = 3.0  # seconds past a pair's cap before it is named for not answering
# Doctor's side (orchestrator/doctor/deep_start.py), where node 0 has not started to coordinate: no
# host's check has started this long after the first torchrun did (torchrun and the check each import
# torch: seconds on a loaded host); a start broken everywhere is named then.
START_FLOOR_S = 60.0


def bound(finished: Sequence[float], limits: tuple[float, float]) -> float:
    """The deadline: `limits[1]` times the median time of those that finished, at least `limits[0]`."""
    floor, factor = limits
    return max(floor, factor * statistics.median(finished)) if finished else floor


def start_deadline(delays: Sequence[float]) -> float:
    """Doctor's deadline, in seconds after the first torchrun started, for node 0 to serve the store
    the others join (`delays`: how long each host whose check has started took, from that moment):
    the join deadline on those times, and at least JOIN_BOUND's floor after the first of them;
    START_FLOOR_S while none has started."""
    if not delays:
        return START_FLOOR_S
    return max(bound(delays, JOIN_BOUND), min(delays) + JOIN_BOUND[0])


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


def recheck_rounds(judged: Judgement[int], met: Collection[Pair], free: Collection[int],
                   partners: int = RECHECK_PARTNERS, per_round: int = CONFIRM_PER_ROUND,
                   kernels: Mapping[int, str] | None = None) -> list[list[Pair]]:
    """Rounds that settle the doubt in `judged`: each unconfirmed slow pair again, and each host in
    doubt with `partners` hosts known good it has not met (the fastest first). Only `free` hosts
    (not still busy with an earlier exchange) are paired. Each round a matching of `per_round`
    pairs at most, so a pair is not measured in a crowd, and PER_KERNEL pairs at most on hosts of
    one kernel (`kernels`: rank -> boot id; hosts on one machine share its cores)."""
    free = set(free)
    wanted = [p for p in judged.unconfirmed if set(p) <= free]
    good = sorted((h for h in judged.good() if h in free),
                  key=lambda h: -judged.hosts[h].typical)
    seen = set(met) | set(wanted)
    for host in judged.doubt:
        if host not in free:
            continue
        new = [pair(host, g) for g in good if g != host and pair(host, g) not in seen][:partners]
        seen.update(new)
        wanted += new
    kernel = (lambda h: kernels.get(h, str(h))) if kernels is not None else str
    rounds: list[list[Pair]] = []
    for p in wanted:  # first fit: each pair into the first round with room where both hosts are free
        for r in rounds:
            on = Counter(kernel(h) for q in r for h in set(q))
            hosts = {h for q in r for h in q}
            if (len(r) < per_round and not set(p) & hosts
                    and all(on[k] < 2 * PER_KERNEL for k in {kernel(p[0]), kernel(p[1])})):
                r.append(p)
                break
        else:
            rounds.append([p])
    return [sorted(r) for r in rounds]


def sitting_out(judged: Judgement[int], partners: int = MIN_ROUNDS) -> set[int]:
    """Hosts slow with every one of `partners` partners or more: they sit out the rest of the
    tournament (their verdict is settled by the recheck), so a link that barely moves does not
    cost every round its cap."""
    return {h for h, v in judged.hosts.items()
            if len(v.partners) >= partners and len(v.slow_partners) == len(v.partners)}


def covered(rounds: Sequence[Sequence[Pair]], n: int) -> bool:
    """Whether `rounds` meet every pair of n hosts."""
    return len({p for r in rounds for p in r}) == n * (n - 1) // 2
