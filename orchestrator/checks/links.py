"""`links` (doctor --deep): which host or pair of hosts moves data far slower than the others.

Pure: the figures come from the link rounds (train_jobs/hostcheck/check.py), one per pair
measured, MB/s one way. A *slow host* is one whose best link is still far below the median of the
links it is not on (a degraded NIC, a cable, a wrong interface: every pair it is in is slow); a
*slow pair* is a link far below the median between two hosts whose other links are fine (a
switch port, a route). Where gloo moves the data on the CPU, a host already named slow by
`compute` gets its slow links explained by that, not a second verdict.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from orchestrator.checks.base import info, ok, warn
from orchestrator.checks.model import Finding
from train_jobs.hostcheck.schedule import SLOW_LINK  # the rounds recheck what this check will call slow

CHECK = "links"
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
    measured: int = 1  # how many times (a slow pair is a finding only once measured again: schedule.py)


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


def _mb(value: float) -> str:
    return f"{value:,.0f} MB/s" if value >= 10 else f"{value:.1f} MB/s"


def slow_hosts(hosts: Sequence[str], rates: Sequence[LinkRate], slow: float = SLOW_LINK) -> dict[str, float]:
    """host -> the median of the links it is not on, for each host whose best link (of two or
    more partners) is below 1/slow of that median."""
    out: dict[str, float] = {}
    for host in hosts:
        own = [r.mbps for r in rates if host in (r.a, r.b)]
        others = [r.mbps for r in rates if host not in (r.a, r.b)]
        if len(own) >= 2 and others and max(own) * slow < statistics.median(others):
            out[host] = statistics.median(others)
    return out


def link_findings(hosts: Sequence[str], measured: LinkRounds, slow_compute: Collection[str] = (),
                  slow: float = SLOW_LINK) -> list[Finding]:
    """One verdict per host (slow, on a slow pair, or fine) and one line about the schedule."""
    rates = measured.rates
    if len(hosts) < 3 or not rates:
        figure = f"; its figure: {_mb(rates[0].mbps)}" if rates else ""
        return [info(CHECK, None, f"{len(hosts)} host(s): nothing to compare one link with (a slow host or link "
                     f"shows against three hosts or more){figure}")]
    median = statistics.median(r.mbps for r in rates)
    pairs = len({frozenset((r.a, r.b)) for r in rates})
    total = len(hosts) * (len(hosts) - 1) // 2
    how = (f"all {total} pairs in {measured.rounds} rounds" if measured.all_pairs else
           f"{pairs} of {total} pairs in {measured.rounds} rounds (a covering schedule: the slowest hosts "
           "met the fastest again)")
    out = [info(CHECK, None, f"links: {how}, {measured.nbytes >> 20} MiB each way, median {_mb(median)}")]
    bad_hosts = slow_hosts(hosts, rates, slow)
    for host in hosts:
        own = sorted((r for r in rates if host in (r.a, r.b)), key=lambda r: r.mbps)
        evidence = ", ".join(f"{r.b if r.a == host else r.a} {_mb(r.mbps)}" for r in own)
        if host in bad_hosts:
            best, ref = own[-1].mbps, bad_hosts[host]
            text = f"every link {_times(best, ref)} below the median ({_mb(best)} at best vs {_mb(ref)})"
            if host in slow_compute and measured.backend == "gloo":
                out.append(info(CHECK, host, f"{text}: its CPU is slow too (compute), and gloo moves data on "
                                "the CPU", evidence, "see its compute finding"))
            else:
                out.append(warn(CHECK, host, f"{text}: a degraded NIC or cable", evidence, HOST_FIX))
            continue
        slow_pairs = [r for r in own if r.mbps * slow < median and r.measured > 1 and not ({r.a, r.b} & set(bad_hosts))]
        for r in slow_pairs:
            peer = r.b if r.a == host else r.a
            out.append(warn(CHECK, host, f"the link {host} <-> {peer} is {_times(r.mbps, median)} below the "
                            f"median ({_mb(r.mbps)} vs {_mb(median)}); both hosts' other links are fine",
                            evidence, PAIR_FIX))
        if not slow_pairs and own:
            out.append(ok(CHECK, host, f"{len(own)} link(s), {_mb(own[0].mbps)} to {_mb(own[-1].mbps)}", evidence))
    return out
