"""Check 5: the master port is free on the master host, or who holds it and what to do.

The verdict comes from checks/master_port.py, the same verdict `ddpctl up` acts on."""

from __future__ import annotations

from orchestrator.checks.base import fail, ok, warn
from orchestrator.checks.master_port import Holder, port_verdict
from orchestrator.checks.model import Finding, Observations
from orchestrator.checks.spec import CheckSpec, Runs, implements

CHECK = "port"
SPEC = CheckSpec(CHECK, order=100, runs=Runs.NODE)


@implements(SPEC)
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
    verdict = port_verdict(master, ctx.master_port, hf.facts.master_port)
    if verdict.holder == Holder.FREE:
        return [ok(CHECK, master, verdict.message)]
    if verdict.holder == Holder.STALE:
        return [warn(CHECK, master, verdict.message, verdict.evidence, verdict.fix)]
    return [fail(CHECK, master, verdict.message, verdict.evidence, verdict.fix)]
