"""`links` (doctor --deep): which host or pair of hosts moves data far slower than the others.

Pure: the figures come from the link rounds (train_jobs/hostcheck/check.py), one per pair
measured, MB/s one way; who is to blame is decided by train_jobs/hostcheck/verdict.py (the same
rules the coordinator used to choose whom to measure again). A *slow host*: its typical link is far
below the median of the links it is not on. A *slow pair*: a link far below the median between two
hosts each checked at pace with their other partners, slow in three measurements. Where gloo moves the data on
the CPU, a host slow at compute explains its slow links. Every verdict carries what it rests on.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from orchestrator.checks.base import info, ok, warn
from orchestrator.checks.model import Basis, Finding
from orchestrator.checks.spec import CheckSpec, Runs
from train_jobs.hostcheck.verdict import SLOW_LINK, Figure, HostVerdict, Judgement, PairVerdict, judge

CHECK = "links"
SPEC = CheckSpec(CHECK, order=180, runs=Runs.DEEP | Runs.JOB, column="link")
HOST_FIX = ("check the host's link: its negotiated speed (`ethtool <if> | grep Speed`, `ibstat`), errors "
            "(`ip -s link`), cable and switch port, and that NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME name "
            "its fast interface; leave it out of the job until it is fixed")
PAIR_FIX = ("both hosts are fine with the others: look between them (the switch ports, a route through a "
            "gateway: `ip route get <peer>` on each, a different interface on one side)")


@dataclass(frozen=True)
class LinkRate:
    """One pair's figure: the best of its timed exchanges, MB/s (1e6 bytes/s) one way."""

    a: str
    b: str
    mbps: float
    measured: int = 1  # how many times (a slow pair is a finding only once measured three times)
    complete: bool = True  # it moved all its bytes at least once within its cap
    missed: bool = False  # no figure by its deadline (0 MB/s)
    first: float | None = None  # its first figure, in a full round: what the medians are taken of

    @classmethod
    def of(cls, a: str, b: str, fig: Figure) -> LinkRate:
        return cls(a, b, fig.mbps, fig.measured, fig.complete, fig.missed, fig.first)

    @property
    def figure(self) -> Figure:
        return Figure(self.mbps, self.measured, self.complete, self.missed, self.first)


@dataclass(frozen=True)
class LinkRounds:
    """What the link rounds measured."""

    rates: tuple[LinkRate, ...]
    rounds: int
    all_pairs: bool  # False: a covering schedule (the tournament did not fit the budget)
    nbytes: int
    backend: str = "gloo"


def _times(value: float, median: float) -> str:
    return f"{median / value:.0f}×" if value > 0 else "∞×"


def mb(value: float) -> str:
    """A rate in MB/s: whole above 10, one decimal below."""
    return f"{value:,.0f} MB/s" if value >= 10 else f"{value:.1f} MB/s"


def judged(hosts: Sequence[str], measured: LinkRounds, slow_compute: Collection[str] = (),
           slow: float = SLOW_LINK) -> Judgement[str]:
    rates = {(r.a, r.b): r.figure for r in measured.rates}
    return judge(list(hosts), rates, slow_compute, measured.backend == "gloo", slow)


def _figure(rate: float, missed: bool) -> str:
    return "no answer" if missed else mb(rate)


def _evidence(v: HostVerdict[str], missed: Collection[frozenset[str]]) -> str:
    pairs = zip(v.partners, v.figures, strict=True)
    return ", ".join(f"{p} {_figure(f, frozenset((v.host, p)) in missed)}" for p, f in pairs)


def _rests_on(v: HostVerdict[str]) -> str:
    slow = len(v.slow_partners)
    return f"{slow} of its {len(v.partners)} partners slow, {v.measurements} measurements"


def link_findings(hosts: Sequence[str], measured: LinkRounds, slow_compute: Collection[str] = (),
                  slow: float = SLOW_LINK) -> list[Finding]:
    """One verdict per host (slow, on a slow pair, in doubt, or fine) and one line about the schedule."""
    rates = measured.rates
    if len(hosts) < 3 or not rates:
        figure = f"; its figure: {mb(rates[0].mbps)}" if rates else ""
        return [info(CHECK, None, f"{len(hosts)} host(s): nothing to compare one link with (a slow host or link "
                     f"shows against three hosts or more){figure}")]
    verdicts = judged(hosts, measured, slow_compute, slow)
    pairs = len({frozenset((r.a, r.b)) for r in rates})
    total = len(hosts) * (len(hosts) - 1) // 2
    how = (f"all {total} pairs in {measured.rounds} rounds" if measured.all_pairs else
           f"{pairs} of {total} pairs in {measured.rounds} rounds (a covering schedule: the budget ran out or a "
           "host slow with every partner sat out the rest; verdicts in doubt were measured again)")
    out = [info(CHECK, None, f"links: {how}, {measured.nbytes >> 20} MiB each way, median {mb(verdicts.median)}",
                basis=Basis(sum(r.measured for r in rates), (), (), verdicts.median, "MB/s"))]
    missed = {frozenset((r.a, r.b)) for r in rates if r.missed}
    by_host: dict[str, list[PairVerdict[str]]] = {}
    for p in verdicts.pairs:
        by_host.setdefault(p.a, []).append(p)
        by_host.setdefault(p.b, []).append(p)
    for host in hosts:
        out += _host_findings(verdicts.hosts[host], by_host.get(host, []), host in verdicts.doubt, missed)
    return out


def _basis(v: HostVerdict[str]) -> Basis:
    return Basis(v.measurements, v.partners, v.figures, v.reference, "MB/s")


def _host_findings(v: HostVerdict[str], pairs: list[PairVerdict[str]], doubt: bool,
                   missed: Collection[frozenset[str]]) -> list[Finding]:
    host, evidence = v.host, _evidence(v, missed)
    if v.kind == "unmeasured":
        return [info(CHECK, host, "not measured: it did not finish its compute test in time (see compute)")]
    if v.kind in ("slow", "cpu"):
        text = (f"its links are {_times(v.typical, v.reference)} below the others' median "
                f"(typically {mb(v.typical)} vs {mb(v.reference)}; {_rests_on(v)})")
        if v.kind == "cpu":
            return [info(CHECK, host, f"{text}: its CPU is slow too (compute), and gloo moves data on the CPU",
                         evidence, "see its compute finding", basis=_basis(v))]
        return [warn(CHECK, host, f"{text}: a degraded NIC or cable", evidence, HOST_FIX, basis=_basis(v))]
    out = []
    for p in pairs:
        peer = p.b if p.a == host else p.a
        mine, theirs = (p.a_others, p.b_others) if p.a == host else (p.b_others, p.a_others)
        n_mine, n_theirs = (p.a_partners, p.b_partners) if p.a == host else (p.b_partners, p.a_partners)
        figure = "no answer in time" if p.missed else mb(p.mbps)
        out.append(warn(CHECK, host, f"the link {host} <-> {peer} is {_times(p.mbps, p.reference)} below the median "
                        f"({figure} vs {mb(p.reference)}, measured {p.measured}×); {host} is at pace with its "
                        f"{n_mine} other partner(s) (median {mb(mine)}) and {peer} with its {n_theirs} "
                        f"(median {mb(theirs)})", evidence, PAIR_FIX,
                        basis=Basis(p.measured, (peer,), (p.mbps,), p.reference, "MB/s")))
    if out:
        return out
    if v.kind == "unconfirmed":
        return [info(CHECK, host, f"in doubt: its links look {_times(v.typical, v.reference)} below the others' "
                     f"median (typically {mb(v.typical)} vs {mb(v.reference)}), but not confirmed by a second "
                     "measurement in time, so it is not blamed", evidence,
                     "run ddpctl doctor --deep again, or on fewer hosts", basis=_basis(v))]
    if doubt or v.kind == "doubt":
        return [info(CHECK, host, f"in doubt: slow with {', '.join(v.slow_partners)} ({len(v.partners)} "
                     f"partner(s), {v.measurements} measurements); the figures do not settle which end is at "
                     "fault, so no host is blamed", evidence,
                     "run ddpctl doctor --deep again, or on fewer hosts so every pair is measured",
                     basis=_basis(v))]
    slow_with = f"; slow only with {', '.join(v.slow_partners)} (explained by that host)" if v.slow_partners else ""
    return [ok(CHECK, host, f"{len(v.partners)} link(s), typically {mb(v.typical)} ({mb(min(v.figures))} to "
               f"{mb(max(v.figures))}){slow_with}", evidence, basis=_basis(v))]

