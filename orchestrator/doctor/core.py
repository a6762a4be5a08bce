"""doctor's core: one agent session per host (facts, then the TCP probe), the pure checks, a report,
and the run recorded in the host ledger."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from inventory import Host
from orchestrator.checks import catalog
from orchestrator.checks.gather import (
    checkpoint_listings,
    checkpoint_markers,
    close_all,
    open_sessions,
    run_probe,
    settle_addressing,
)
from orchestrator.checks.model import (
    DoctorContext,
    Observations,
    ProbeResults,
    Report,
)
from orchestrator.checks.registry import run_checks
from orchestrator.checks.spec import Runs
from orchestrator.hostops.ledger import record_doctor
from orchestrator.remote.pool import HostPool

TOO_FEW = "fewer than two reachable hosts"


def columns(ctx: DoctorContext) -> list[str]:
    """The table's columns for this job: each check of the facts whose spec shows it for the job."""
    return [spec.name for spec in catalog.specs(Runs.NODE) if spec.shown(ctx)]


def run_doctor(ctx: DoctorContext, pool: HostPool,
               notice: Callable[[str], None] = lambda _: None) -> Report:
    """Gather, probe, check. Host failures become findings; nothing here raises for a host."""
    started = time.monotonic()
    probe = len(ctx.hosts) > 1
    if probe and ctx.checkpoint_dir is not None:
        ctx = replace(ctx, checkpoint_markers=checkpoint_markers(ctx.hosts))
    notice(f"gathering facts from {len(ctx.hosts)} host(s)")
    fan = open_sessions(pool, ctx, probe)
    gathered = time.monotonic()
    try:
        if probe and len(fan.succeeded) > 1:
            notice(f"probing TCP between {len(fan.succeeded)} hosts")
            probes = run_probe(ctx, fan.succeeded)
        else:
            probes = ProbeResults(skipped={"ephemeral": TOO_FEW, "master_port": TOO_FEW})
    finally:
        close_all([o.session for o in fan.succeeded.values()])
    phases = {"facts_s": gathered - started, "probe_s": time.monotonic() - gathered}
    ctx, facts, addressing = settle_addressing(ctx, checkpoint_listings(fan.succeeded))
    if addressing.picked:
        notice(f"master_addr {addressing.master_addr}: {addressing.picked}")
    obs = Observations(ctx=ctx, facts=facts, failed=fan.failed, probes=probes)
    return Report(hosts=[h.name for h in ctx.hosts], checks=columns(ctx),
                  findings=run_checks(obs), unreachable=set(fan.failed),
                  elapsed_s=time.monotonic() - started, phases=phases, facts=facts)


def remember(report: Report, hosts: Sequence[Host]) -> list[str]:
    """Record the run in the host ledger (orchestrator/hostops/ledger.py): each host seen, each
    finding; a finding of a deep check marks its host suspect. The ledger's warnings; never raises."""
    run_id = f"doctor-{time.strftime('%Y%m%d-%H%M%S')}"
    return record_doctor(hosts, report.facts, report.findings, run_id, deep_checks=catalog.names(Runs.DEEP))
