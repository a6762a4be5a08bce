"""Who dials whom in doctor's TCP probe. Up to EXACT_UP_TO hosts, every host dials every other
(N² dials: at 128 hosts 16,256 of them took 0.27 s of the probe phase, bench/doctor_fanout.py, so
all pairs stay exact well past that). Above it, a covering sample: every host dials the master and
PEERS others at ring offsets 1, 2, 4, … (so every host is dialled by PEERS peers too), plus, for
every pair of subnets (racks) that no dial joins yet, one host of the one dials one of the other.
The report says when it sampled. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

EXACT_UP_TO = 256
PEERS = 8


@dataclass(frozen=True)
class DialPlan:
    peers: Mapping[str, tuple[str, ...]]  # host -> the hosts it dials
    sampled: str = ""  # how it sampled ("" where every pair is dialled)


def dial_plan(hosts: Sequence[str], master: str, subnet: Mapping[str, str],
              exact_up_to: int = EXACT_UP_TO, peers: int = PEERS) -> DialPlan:
    """The dials for `hosts` (in node-rank order); `subnet`: each host's network (its dial address's
    CIDR), whose every pair the sample covers."""
    n = len(hosts)
    if n <= exact_up_to:
        return DialPlan({h: tuple(p for p in hosts if p != h) for h in hosts})
    offsets = [1 << i for i in range(peers) if (1 << i) < n]
    dials: dict[str, list[str]] = {}
    for i, host in enumerate(hosts):
        chosen = [master] if host != master else []
        chosen += [hosts[(i + off) % n] for off in offsets]
        dials[host] = list(dict.fromkeys(p for p in chosen if p != host))
    members: dict[str, list[str]] = {}
    for host in hosts:
        members.setdefault(subnet.get(host, ""), []).append(host)
    joined = {(subnet.get(a, ""), subnet.get(b, "")) for a, ps in dials.items() for b in ps}
    spread = 0
    for a_net, a_hosts in members.items():
        for b_net, b_hosts in members.items():
            if (a_net, b_net) in joined or (a_net == b_net and len(a_hosts) < 2):
                continue
            a = a_hosts[spread % len(a_hosts)]
            b = next(h for h in b_hosts[spread % len(b_hosts):] + b_hosts if h != a)
            dials[a].append(b)
            spread += 1
    return DialPlan({h: tuple(dict.fromkeys(ps)) for h, ps in dials.items()},
                    f"{n} hosts: each dialled the master and {len(offsets)} peers, every pair of its "
                    f"{len(members)} subnet(s) covered (all pairs up to {exact_up_to} hosts)")
