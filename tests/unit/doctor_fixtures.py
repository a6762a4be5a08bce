"""Synthetic, recorded-shape facts for the doctor check tests (a clean 3-host cluster)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from inventory import Host
from orchestrator.checks.addressing import HostNet
from orchestrator.checks.model import DoctorContext, Observations, ProbeResults, Report
from orchestrator.errors import HostError
from orchestrator.remote.pool import HostPool
from orchestrator.remote.wire import HostFacts, parse_facts, parse_net

HOSTS = tuple(Host(name=f"node{i}", address=f"198.18.0.{10 + i}") for i in range(3))
NOW = 1_800_000_000.0


def clean_facts(i: int) -> dict[str, Any]:
    addr = f"198.18.0.{10 + i}"
    local = i == 0
    return {
        "hostname": f"node{i}",
        "python": {"requested": "python3", "found": "/usr/bin/python3", "path_env": "/usr/bin"},
        "torch": {"importable": True, "version": "2.13.0", "cuda": "12.4", "nccl": "2.21.5",
                  "python": "3.11.7", "cuda_available": True, "device_count": 2},
        "gpus": {"gpus": [{"index": g, "uuid": f"GPU-{i}{g}", "name": "NVIDIA H100",
                           "memory_total_mib": 81559.0, "memory_used_mib": 0.0}
                          for g in range(2)], "apps": []},
        "interfaces": [
            {"name": "lo", "up": True, "addresses": [{"family": "inet", "address": "127.0.0.1",
                                                      "prefixlen": 8, "scope": "host"}]},
            {"name": "eth0", "up": True, "addresses": [{"family": "inet", "address": addr,
                                                        "prefixlen": 24, "scope": "global"}]},
        ],
        "routes": [{"dst": "default", "dev": "eth0", "src": None, "gateway": "198.18.0.1", "metric": 0},
                   {"dst": "198.18.0.0/24", "dev": "eth0", "src": addr, "gateway": None, "metric": 0}],
        "resolution": {"master": [{"family": "inet", "address": "198.18.0.10"}],
                       "routes": {"198.18.0.10": {"dev": "lo" if local else "eth0",
                                                  "src": addr, "gateway": None,
                                                  "type": "local" if local else None}}},
        "hostname_resolution": [{"family": "inet", "address": addr}],
        "firewall": {"iptables": {"policy": "ACCEPT", "rules": [], "touching_port": [],
                                  "blocking": []}, "nft": None, "ufw": None},
        "workdir": {"path": "/srv/job", "exists": True, "free_bytes": 50 << 30,
                    "total_bytes": 100 << 30, "writable": True},
        "script": {"path": "/srv/job/train.py", "exists": True, "sha256": "a" * 64},
        "infiniband": [],
        "cpu_count": 16,
        "memlock": {"soft": 65536, "hard": 65536},
        "env": {},
        "master_port": {"port": 29500, "bindable": True, "owners": []},
        "time": NOW,
        "elapsed_s": 1.0,
    }


def host_facts(name: str, facts: Mapping[str, Any], errors: Mapping[str, str] | None = None,
               sent_at: float = NOW - 1.1, received_at: float = NOW + 0.1) -> HostFacts:
    return parse_facts(name, {"facts": dict(facts), "errors": dict(errors or {})}, sent_at, received_at)


def host_net(interfaces: Sequence[Mapping[str, Any]], routes: Sequence[Mapping[str, Any]] = (),
             source: str | None = None, master_ip: str | None = None) -> HostNet:
    """A host's network from its tables as the agent sends them."""
    net = parse_net("", {"interfaces": list(interfaces), "routes": list(routes)})
    return HostNet(net.interfaces, net.routes, source, master_ip)


def context(**over: Any) -> DoctorContext:
    base: dict[str, Any] = {
        "hosts": HOSTS, "master": HOSTS[0], "master_addr": "198.18.0.10", "master_port": 29500,
        "workdirs": {h.name: "/srv/job" for h in HOSTS}, "script": "train.py",
        "env": {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0",
                "NCCL_IB_DISABLE": "1"},
        "nproc_per_node": "gpu",
    }
    base.update(over)
    return DoctorContext(**base)


def observe(changes: Mapping[int, Mapping[str, Any]] | None = None,
            errors: Mapping[int, Mapping[str, str]] | None = None,
            failed: Mapping[str, HostError] | None = None,
            probes: ProbeResults | None = None, **ctx: Any) -> Observations:
    """A clean cluster, with `changes[i]` merged into host i's facts."""
    facts = {}
    for i, h in enumerate(HOSTS):
        if failed and h.name in failed:
            continue
        f = copy.deepcopy(clean_facts(i))
        f.update((changes or {}).get(i, {}))
        facts[h.name] = host_facts(h.name, f, (errors or {}).get(i))
    return Observations(ctx=context(**ctx), facts=facts, failed=dict(failed or {}),
                        probes=probes or ProbeResults())


def doctor_here(ctx: DoctorContext) -> Report:
    """Doctor run for real on `ctx`'s hosts (this machine's, through the local transport)."""
    from orchestrator.doctor import run_doctor

    pool = HostPool()
    try:
        return run_doctor(ctx, pool)
    finally:
        pool.close()
