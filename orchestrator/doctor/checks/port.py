"""Check 5: the master port is free on the master host, or who holds it and what to do.

The verdict comes from launch.master_port.judge, the same judge `ddpctl up` acts on."""

from __future__ import annotations

from orchestrator.doctor.checks.base import fail, ok, warn
from orchestrator.doctor.model import Finding, Observations
from orchestrator.launch.master_port import Holder, judge

CHECK = "port"


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
    verdict = judge(master, ctx.master_port, hf.master_port)
    if verdict.holder == Holder.FREE:
        return [ok(CHECK, master, verdict.message)]
    if verdict.holder == Holder.STALE:
        return [warn(CHECK, master, verdict.message, verdict.evidence, verdict.fix)]
    return [fail(CHECK, master, verdict.message, verdict.evidence, verdict.fix)]
