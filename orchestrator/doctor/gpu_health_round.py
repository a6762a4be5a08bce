"""doctor --deep's GPU health round: the gpu_health op on every host at once, each host's report
checked against its GPU selection (orchestrator/checks/gpu_health.py). A host that does not answer
is one finding naming it and its error; nothing here raises for a host."""

from __future__ import annotations

from collections.abc import Iterable

from inventory import Host
from inventory.gpus import selection
from orchestrator.checks.gpu_health import gpu_health_findings, unreachable
from orchestrator.checks.model import Finding
from orchestrator.remote.gpu_health_call import call_gpu_health
from orchestrator.remote.pool import HostPool


def gpu_health_round(pool: HostPool, hosts: Iterable[Host], timeout: float) -> list[Finding]:
    """The GPU health findings of every host, in the hosts' order (at most pool.max_parallel at once)."""
    hosts = list(hosts)
    fan = pool.map(hosts, lambda t: call_gpu_health(t, timeout))
    findings: list[Finding] = []
    for host in hosts:
        failed = fan.failed.get(host.name)
        if failed is not None:
            findings.append(unreachable(host.name, failed))
            continue
        try:
            findings.extend(gpu_health_findings(host.name, fan.succeeded[host.name], selection(host)))
        except Exception as exc:  # a check that crashes is that host's FAIL finding, not doctor's crash
            findings.append(unreachable(host.name, exc))
    return findings
