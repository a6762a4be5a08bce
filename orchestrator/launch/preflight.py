"""Before launch: one facts round trip per host resolves nproc and the master port; stale holders
of the port are freed. The facts are the same op doctor uses, with a narrower selection."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from inventory import ConfigError, Host, Job
from orchestrator.errors import HostError, HostErrorKind, HostsFailed, LaunchBlocked
from orchestrator.launch.master_port import Holder, judge
from orchestrator.remote.agent import call_agent
from orchestrator.remote.pool import HostPool
from orchestrator.remote.transport import Transport
from orchestrator.remote.wire import HostFacts, parse_report

LAUNCH_FACTS = ("cpu_count", "gpu_count", "python", "workdir", "master_port", "free_port")


def facts_request(job: Job, host: Host) -> dict[str, Any]:
    port = job.rendezvous.master_port
    is_master = host.name == job.master_host.name
    return {"select": list(LAUNCH_FACTS), "python": host.python, "workdir": job.workdir_for(host),
            "master_port": None if port == "auto" else port,
            "check_port": is_master and port != "auto", "pick_port": is_master and port == "auto"}


def gather(job: Job, pool: HostPool) -> dict[str, HostFacts]:
    """Every host's launch facts, in parallel; a missing interpreter or workdir stops here."""

    def one(transport: Transport) -> HostFacts:
        sent = time.time()
        r = call_agent(transport, "facts", facts_request(job, transport.host), timeout=60).result
        return HostFacts(transport.host.name, r.get("facts") or {}, r.get("errors") or {}, sent, time.time())

    fan = pool.map(job.hosts, one)
    if fan.failed:
        raise HostsFailed("pre-flight", list(fan.failed.values()))
    for host in job.hosts:
        facts = fan.succeeded[host.name]
        if not facts.python_found:
            raise HostError(host.name, HostErrorKind.AGENT, f"interpreter {host.python} not found",
                            f"install torch there or set python = ... for {host.name} in the inventory")
        if not facts.workdir_exists:
            raise HostError(host.name, HostErrorKind.AGENT, f"workdir {job.workdir_for(host)} does not exist",
                            "create it (or sync the code there) or set workdir in the inventory")
    return fan.succeeded


def resolve_nprocs(job: Job, facts: dict[str, HostFacts]) -> dict[str, int]:
    """nproc_per_node per host; "gpu" needs GPUs and equal counts, reported before launch."""
    spec = job.nproc_per_node
    out: dict[str, int] = {}
    for host in job.hosts:
        f = facts[host.name]
        gpus = host.gpus if isinstance(host.gpus, int) else f.gpu_count
        if isinstance(spec, int):
            out[host.name] = spec
        elif spec == "gpu":
            if gpus < 1:
                raise ConfigError(f"nproc_per_node = \"gpu\" but {host.name} has no GPU",
                                  file=job.source, key="job.nproc_per_node",
                                  hint="use an integer or \"cpu\", or fix the host's GPUs (ddpctl doctor)")
            out[host.name] = gpus
        elif spec == "cpu":
            out[host.name] = f.cpu_count
        else:  # auto
            out[host.name] = gpus if gpus > 0 else f.cpu_count
    counts = sorted(set(out.values()))
    if spec == "gpu" and len(counts) > 1:
        detail = ", ".join(f"{h}={n}" for h, n in out.items())
        raise ConfigError(f"hosts have unequal GPU counts ({detail})", file=job.source,
                          key="job.nproc_per_node",
                          hint="set an integer nproc_per_node, or select hosts with equal GPUs")
    return out


def settle_master_port(job: Job, pool: HostPool, facts: dict[str, HostFacts], free_foreign: bool,
                       notice: Callable[[str], None]) -> int:
    """The port to use; stale ddpctl holders are killed, anything else stops the launch unless
    `free_foreign` (--free-port) says to free a foreign holder."""
    master = job.master_host
    mf = facts[master.name]
    if job.rendezvous.master_port == "auto":
        if mf.free_port is None:
            raise HostError(master.name, HostErrorKind.AGENT, "the node agent picked no free port",
                            "set an explicit master_port in [rendezvous]")
        notice(f"master port auto: {mf.free_port} is free on {master.name}")
        return mf.free_port
    port = int(job.rendezvous.master_port)
    verdict = judge(master.name, port, mf.master_port)
    if verdict.holder == Holder.FREE:
        return port
    if verdict.holder != Holder.STALE and not (verdict.holder == Holder.FOREIGN and free_foreign):
        raise LaunchBlocked(f"{verdict.message}\n  fix: {verdict.fix}")
    args = {"port": port, "proto": "tcp", "grace": 5.0, "force": False, "dry_run": False,
            "only_ddpctl": verdict.holder == Holder.STALE, "expect_pids": [o.pid for o in verdict.owners]}
    report = parse_report(master.name, call_agent(pool.transport(master), "kill_port", args, timeout=60).result)
    killed = ", ".join(str(k.pid) for k in report.killed)
    jobs = sorted({str(o.ddpctl_job_id) for o in verdict.owners if o.ddpctl_job_id})
    notice(f"freed master port {port} on {master.name}: killed pid(s) {killed or '-'}"
           + (f" of stale job(s) {', '.join(jobs)}" if jobs else ""))
    if not report.free:
        why = "; ".join([r.reason for r in report.refused] + list(report.errors)) or "unknown"
        raise LaunchBlocked(f"master port {port} on {master.name} is still busy after freeing it: {why}")
    return port
