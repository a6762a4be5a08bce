"""Check 5: the master port is free on the master host, or who holds it and what to do."""

from __future__ import annotations

from typing import Any

from orchestrator.doctor.checks.base import fail, ok, warn
from orchestrator.doctor.model import Finding, Observations

CHECK = "port"


def describe(owner: dict[str, Any]) -> str:
    cmd = " ".join(owner.get("cmdline") or [owner.get("name") or "?"])
    job = f", ddpctl job {owner['ddpctl_job_id']}" if owner.get("ddpctl_job_id") else ""
    return f"pid {owner.get('pid')} (user {owner.get('user')}{job}): {cmd[:160]}"


def check(obs: Observations) -> list[Finding]:
    ctx = obs.ctx
    master = ctx.master.name
    if ctx.master_port is None:
        return [ok(CHECK, master, 'master_port = "auto": a free port is picked at launch')]
    hf = obs.facts.get(master)
    if hf is None:
        return []
    if hf.errors.get("master_port"):
        return [warn(CHECK, master, f"could not inspect port {ctx.master_port}",
                     hf.errors["master_port"])]
    mp: dict[str, Any] = hf.get("master_port") or {}
    port = ctx.master_port
    if mp.get("bindable", True):
        return [ok(CHECK, master, f"master port {port} is free on {master}")]
    owners = [o for o in mp.get("owners") or [] if isinstance(o, dict)]
    evidence = "; ".join(describe(o) for o in owners) or str(mp.get("bind_error", ""))
    if owners and all(o.get("ddpctl_job_id") for o in owners):
        return [warn(CHECK, master, f"master port {port} on {master} is held by a stale ddpctl job",
                     evidence, "`ddpctl up` frees it (it kills the stale job's processes)")]
    if owners:
        who = f"held by {describe(owners[0])}"
    elif mp.get("owners") is None:
        who = "in use (this agent cannot list port owners)"
    else:
        who = "in use (owner not visible: run doctor as root or as the owner)"
    return [fail(CHECK, master, f"master port {port} on {master} is {who}", evidence,
                 f"ddpctl kill-port {port} --host {master} (if it is yours), or set "
                 'master_port = "auto" in [rendezvous], or pick another --master-port')]
