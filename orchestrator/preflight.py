"""Before launch: one round trip per host to resolve nproc and the master port, free stale ports."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inventory import ConfigError, Host, Job
from orchestrator.agent import call_agent
from orchestrator.errors import HostError, HostErrorKind, HostsFailed
from orchestrator.hosts import HostPool


@dataclass(frozen=True)
class HostFacts:
    host: str
    hostname: str
    cpu_count: int
    gpu_count: int
    python_found: bool
    cwd_exists: bool
    port: dict[str, Any] | None  # the master port's owners, on the master host only
    free_port: int | None


class LaunchBlocked(Exception):
    """The launch cannot start; the message names the host and the fix."""


def gather(job: Job, pool: HostPool) -> dict[str, HostFacts]:
    master = job.master_host
    port = job.rendezvous.master_port

    def one(transport: Any) -> HostFacts:
        host: Host = transport.host
        is_master = host.name == master.name
        args = {"python": host.python, "cwd": job.workdir_for(host),
                "check_port": port if is_master and port != "auto" else None,
                "pick_port": is_master and port == "auto"}
        r = call_agent(transport, "preflight", args, timeout=60).result
        return HostFacts(host.name, r["hostname"], int(r["cpu_count"] or 1), int(r["gpu_count"]),
                         bool(r["python_found"]), bool(r["cwd_exists"]), r.get("port"), r.get("free_port"))

    fan = pool.map(job.hosts, one)
    if fan.failed:
        raise HostsFailed("pre-flight", list(fan.failed.values()))
    for facts in fan.succeeded.values():
        host = job.inventory.get(facts.host) or master
        if not facts.python_found:
            raise HostError(facts.host, HostErrorKind.AGENT, f"interpreter {host.python} not found",
                            f"install torch there or set python = ... for {facts.host} in the inventory")
        if not facts.cwd_exists:
            raise HostError(facts.host, HostErrorKind.AGENT, f"workdir {job.workdir_for(host)} does not exist",
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


def describe_owner(owner: dict[str, Any]) -> str:
    cmd = " ".join(owner.get("cmdline") or [owner.get("name") or "?"])
    return f"pid {owner.get('pid')} (user {owner.get('user')}): {cmd[:120]}"


def settle_master_port(job: Job, pool: HostPool, facts: dict[str, HostFacts], free_foreign: bool,
                       notice: Callable[[str], None]) -> int:
    """The port to use; stale ddpctl holders are killed, foreign ones stop the launch."""
    master = job.master_host
    mf = facts[master.name]
    if job.rendezvous.master_port == "auto":
        assert mf.free_port is not None
        notice(f"master port auto: {mf.free_port} is free on {master.name}")
        return mf.free_port
    port = int(job.rendezvous.master_port)
    owners = [o for o in ((mf.port or {}).get("owners") or []) if o.get("pid")]
    if not owners:
        return port
    live = [o for o in owners if o.get("job_live")]
    if live:
        job = live[0]["ddpctl_job_id"]
        raise LaunchBlocked(
            f"master port {port} on {master.name} is used by running ddpctl job {job} "
            f"({describe_owner(live[0])})\n  fix: ddpctl down {job}, or set master_port = \"auto\"")
    stale = all(o.get("ddpctl_job_id") for o in owners)
    if not stale and not free_foreign:
        who = "; ".join(describe_owner(o) for o in owners)
        raise LaunchBlocked(
            f"master port {port} on {master.name} is held by {who}\n"
            f"  fix: ddpctl kill-port {port} --host {master.name}, or pass --free-port, "
            "or set master_port = \"auto\"")
    args = {"port": port, "proto": "tcp", "grace": 5.0, "force": False, "dry_run": False,
            "only_ddpctl": stale, "expect_pids": [o["pid"] for o in owners]}
    result = call_agent(pool.transport(master), "kill_port", args, timeout=60).result
    killed = ", ".join(str(k.get("pid")) for k in result.get("killed", []))
    jobs = sorted({str(o.get("ddpctl_job_id")) for o in owners if o.get("ddpctl_job_id")})
    notice(f"freed master port {port} on {master.name}: killed pid(s) {killed or '-'}"
           + (f" of stale job(s) {', '.join(jobs)}" if jobs else ""))
    if not result.get("free_after", False):
        raise LaunchBlocked(f"master port {port} on {master.name} is still busy after freeing it: "
                            f"{result.get('refused') or result.get('errors')}")
    return port
