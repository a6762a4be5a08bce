"""Who is to blame for a slow link, from the figures alone (pure; no torch): one rule set, used by
the coordinator to decide whom to measure again and by doctor to write its findings
(orchestrator/checks/links.py).

Every figure is a pair's best; the medians it is held against are of first figures, measured in
full rounds (a recheck measures a pair with fewer others at once, which would raise them).

A *slow host* is one whose typical link (the median of its links, not its best) is far below the
median of the links it is not on, with at least MIN_PARTNERS partners and CONFIRM_HOST of its slow
links measured twice: one fast measurement does not clear a host whose other links are slow, and
one slow round does not condemn it. A *slow pair* is named only when both its ends are at
pace with their other partners (checked: each has another partner, and none of its other links is
slow) and it stayed slow in CONFIRM_PAIR measurements. A slow link on a host whose CPU is slow (where gloo
moves data on the CPU) is explained by that host, not turned into a verdict on its peers. Anything
else is in doubt: the host is met again with hosts known good, never blamed on one figure.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

H = TypeVar("H", bound=Hashable)

SLOW_LINK = 5.0  # a link below 1/SLOW_LINK of its reference is slow
SLOW_COMPUTE = 2.0  # a device below half its peers' median is slow
MIN_PARTNERS = 2  # a host's own verdict rests on at least this many partners
CONFIRM_HOST = 2  # ... and on this many of its slow links measured twice
CONFIRM_PAIR = 3  # a slow pair between hosts at pace: slow in this many measurements, in separate rounds


@dataclass(frozen=True)
class Figure:
    """One pair's figure: its best exchange in MB/s one way (0: nothing moved by the deadline)."""

    mbps: float
    measured: int = 1  # how many times
    complete: bool = True  # it moved all its bytes at least once within its cap
    missed: bool = False  # no figure: a host did not answer (or its partner never connected) in time
    first: float | None = None  # its first figure, in a full round (None: `mbps`)

    def __post_init__(self) -> None:
        """One form: a first figure equal to `mbps` is None (so a figure equals its decoded copy)."""
        if self.first is not None and self.first == self.mbps:
            object.__setattr__(self, "first", None)

    @property
    def rounds_figure(self) -> float:
        """What the medians are taken of: the figure of a full round, where every pair competed
        for the fabric (or, here, the cores) as in the others; a recheck round measures fewer pairs
        at once, and its figures would raise the median the others are held against."""
        return self.mbps if self.first is None else self.first

    def again(self, new: Figure) -> Figure:
        """This pair measured once more (`new`, one measurement): its best figure, its first kept."""
        best = new if new.mbps >= self.mbps else self
        return Figure(best.mbps, self.measured + new.measured, self.complete or new.complete,
                      self.missed and new.missed, self.rounds_figure)

    def to_json(self) -> dict[str, Any]:
        return {"mbps": self.mbps, "first_mbps": self.rounds_figure, "measured": self.measured,
                "complete": self.complete, "missed": self.missed}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> Figure:
        first = row.get("first_mbps")
        return cls(float(row["mbps"]), int(row.get("measured", 1)), bool(row.get("complete", True)),
                   bool(row.get("missed", False)), None if first is None else float(first))


@dataclass(frozen=True)
class HostVerdict(Generic[H]):
    """One host's links: `kind` is "slow" (most links far below, confirmed), "unconfirmed" (the same
    before CONFIRM_HOST of its slow links were measured twice), "cpu" (slow, explained by its slow
    CPU under gloo), "fine", "doubt" (a slow link, too few partners to tell) or "unmeasured"."""

    host: H
    kind: str
    typical: float  # the median of its links
    reference: float  # the median of the links it is not on
    partners: tuple[H, ...]  # slowest first
    figures: tuple[float, ...]  # by partner, in the same order
    measurements: int
    slow_partners: tuple[H, ...] = ()


@dataclass(frozen=True)
class PairVerdict(Generic[H]):
    """A slow link between two hosts that are each at pace with their other partners."""

    a: H
    b: H
    mbps: float
    reference: float  # the median of every link
    measured: int
    a_others: float  # the median of a's other links
    b_others: float
    a_partners: int  # how many other partners that rests on
    b_partners: int
    missed: bool = False


@dataclass
class Judgement(Generic[H]):
    """Every host's verdict, the slow pairs, and what the evidence does not settle yet."""

    median: float
    hosts: dict[H, HostVerdict[H]] = field(default_factory=dict)
    pairs: list[PairVerdict[H]] = field(default_factory=list)
    doubt: list[H] = field(default_factory=list)  # hosts to meet with hosts known good
    unconfirmed: list[tuple[H, H]] = field(default_factory=list)  # slow pairs to measure again

    def good(self) -> list[H]:
        """Hosts known good: at pace with MIN_PARTNERS partners or more, on no slow link."""
        return [h for h, v in self.hosts.items()
                if v.kind == "fine" and len(v.partners) >= MIN_PARTNERS and not v.slow_partners]


def slow_among_peers(models: Sequence[str], figures: Sequence[float],
                     slow: float = SLOW_COMPUTE) -> dict[int, float]:
    """index -> its peers' median, for each item below 1/slow of the median of the other items of
    its model (a GPU's name; a CPU's model and threads): the compute rule, for the coordinator and
    for doctor's findings."""
    by_model: dict[str, list[int]] = {}
    for i, model in enumerate(models):
        by_model.setdefault(model, []).append(i)
    out: dict[int, float] = {}
    for group in by_model.values():
        for i in group:
            peers = [figures[j] for j in group if j != i]
            if peers and figures[i] * slow < statistics.median(peers):
                out[i] = statistics.median(peers)
    return out


def _key(a: H, b: H, rates: Mapping[tuple[H, H], Figure]) -> tuple[H, H]:
    return (a, b) if (a, b) in rates else (b, a)


def _index(rates: Mapping[tuple[H, H], Figure]) -> dict[H, dict[H, Figure]]:
    """host -> partner -> figure, in one pass."""
    out: dict[H, dict[H, Figure]] = {}
    for (a, b), fig in rates.items():
        out.setdefault(a, {})[b] = fig
        out.setdefault(b, {})[a] = fig
    return out


def _median(values: Sequence[float], default: float) -> float:
    return statistics.median(values) if values else default


def _median_without(every: Sequence[float], own: Sequence[float], default: float) -> float:
    """The median of `every` (sorted) with `own` (sorted, a sub-multiset of it) taken out, in one
    walk: a host's reference is the links it is not on."""
    n = len(every) - len(own)
    if n <= 0:
        return default
    wanted = {(n - 1) // 2, n // 2}
    found: list[float] = []
    j = k = 0
    for value in every:
        if j < len(own) and own[j] == value:
            j += 1
            continue
        if k in wanted:
            found.append(value)
        k += 1
        if k > n // 2:
            break
    return sum(found) / len(found)


def judge(hosts: Sequence[H], rates: Mapping[tuple[H, H], Figure], slow_compute: Collection[H] = (),
          cpu_links: bool = True, slow: float = SLOW_LINK) -> Judgement[H]:
    """The verdicts of `rates` (pair -> figure). `slow_compute`: hosts found slow at compute;
    `cpu_links`: the links move data on the CPU (gloo), so a slow CPU explains a slow link."""
    every = sorted(f.rounds_figure for f in rates.values())
    median = _median(every, 0.0)
    out: Judgement[H] = Judgement(median)
    cpu = set(slow_compute) if cpu_links else set()
    index = _index(rates)
    for host in hosts:
        own = index.get(host, {})
        if not own:
            out.hosts[host] = HostVerdict(host, "unmeasured", 0.0, median, (), (), 0)
            continue
        order = sorted(own, key=lambda p: own[p].mbps)
        reference = _median_without(every, sorted(own[p].rounds_figure for p in order), median)
        typical = _median([own[p].mbps for p in order], 0.0)
        slow_partners = tuple(p for p in order if own[p].mbps * slow < reference)
        if len(own) >= MIN_PARTNERS and typical * slow < reference:
            kind = "cpu" if host in cpu else "slow"
            again = [p for p in order if own[p].mbps * slow < reference and own[p].measured < 2]
            confirmed = sum(1 for p in order if own[p].mbps * slow < reference and own[p].measured >= 2)
            if kind == "slow" and confirmed < CONFIRM_HOST:  # one round's noise is not a verdict: measure
                kind = "unconfirmed"  # its slow links again, with its fastest partners first
                fastest = sorted(again, key=lambda p: -own[p].mbps)[:CONFIRM_HOST - confirmed]
                out.unconfirmed += [k for k in (_key(host, p, rates) for p in fastest) if k not in out.unconfirmed]
        elif slow_partners and len(own) < MIN_PARTNERS:
            kind = "doubt"
        else:
            kind = "fine"
        out.hosts[host] = HostVerdict(host, kind, typical, reference, tuple(order),
                                      tuple(own[p].mbps for p in order), sum(f.measured for f in own.values()),
                                      slow_partners)
    _judge_pairs(out, rates, index, cpu, slow)
    return out


def _judge_pairs(out: Judgement[H], rates: Mapping[tuple[H, H], Figure], index: Mapping[H, Mapping[H, Figure]],
                 cpu: set[H], slow: float) -> None:
    """Each slow link: explained by a slow host (or CPU), a pair verdict once both ends are checked
    at pace and it was measured twice, else a doubt to settle."""
    # a slow host (or one waiting for its confirmation) explains its links, to it and to the others
    blamed = {h for h, v in out.hosts.items() if v.kind in ("slow", "cpu", "unconfirmed")} | cpu
    for (a, b), fig in sorted(rates.items(), key=lambda item: item[1].mbps):
        if fig.mbps * slow >= out.median:
            continue
        if (a, b) in out.unconfirmed:
            continue  # measured again first (a host's verdict in doubt)
        if {a, b} & blamed:
            continue  # explained by that host
        a_others = [f.mbps for p, f in index[a].items() if p != b and p not in blamed]
        b_others = [f.mbps for p, f in index[b].items() if p != a and p not in blamed]
        for end, figures in ((a, a_others), (b, b_others)):
            if not figures and end not in out.doubt:
                out.doubt.append(end)  # no other partner to check it against: it meets hosts known good
        if fig.measured < CONFIRM_PAIR:
            out.unconfirmed.append((a, b))  # one figure is not a verdict: measured again first
            continue
        at_pace = bool(a_others) and bool(b_others)
        for end, figures in ((a, a_others), (b, b_others)):
            if figures and (_median(figures, 0.0) * slow < out.median or min(figures) * slow < out.median):
                at_pace = False  # this end is slow with another partner too: not the pair's fault
                if end not in out.doubt:
                    out.doubt.append(end)
        if not at_pace:
            continue
        out.pairs.append(PairVerdict(a, b, fig.mbps, out.median, fig.measured, _median(a_others, 0.0),
                                     _median(b_others, 0.0), len(a_others), len(b_others), fig.missed))
    for host, verdict in out.hosts.items():
        if verdict.kind == "doubt" and host not in out.doubt:
            out.doubt.append(host)
