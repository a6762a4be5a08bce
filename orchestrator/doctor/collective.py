"""Doctor's launch-path checks: a gloo all_reduce smoke test and the all_reduce bandwidth table
(`--deep`'s per-pair link rounds are in deep.py)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from inventory import Inventory, Job, Rendezvous
from orchestrator.checks.model import CheckStatus, DoctorContext, Finding
from orchestrator.doctor.collective_jobs import SMOKE_LINE, CollectiveRun, bandwidth, smoke
from orchestrator.errors import HostError, HostsFailed, LaunchBlocked
from orchestrator.launch.backends.base import Backend


def job_for(ctx: DoctorContext, job: Job | None) -> Job:
    """The job doctor checks, or one made from the inventory (first host is the master)."""
    if job is not None:
        return job
    hosts = tuple(replace(h, workdir=ctx.workdirs.get(h.name, h.workdir)) for h in ctx.hosts)
    port: int | Literal["auto"] = ctx.master_port if ctx.master_port is not None else "auto"
    return Job(name="doctor", inventory=Inventory(hosts), hosts=hosts, script="-",
               rendezvous=Rendezvous(None, port, "static"), env=dict(ctx.env))


def failure_evidence(run: CollectiveRun) -> str:
    ff = run.result.first_failure
    lines = [f"{ff.host}: {ff.error or ''}"] if ff else []
    for r in run.result.hosts:
        lines += [f"{r.host}: {t}" for t in r.tail[-3:]]
    return "\n".join(lines[-8:])


def launch_error(check: str, exc: Exception) -> Finding:
    errors = exc.errors if isinstance(exc, HostsFailed) else [exc]
    text = "; ".join(str(e) for e in errors)
    return Finding(check, CheckStatus.FAIL, None, "could not launch through the real launch path",
                   evidence=text, fix="fix the errors above first (ddpctl doctor), then retry")


def smoke_findings(job: Job, backend: Backend, runs_dir: Path) -> list[Finding]:
    try:
        run = smoke(job, backend, runs_dir)
    except (HostError, HostsFailed, LaunchBlocked) as exc:
        return [launch_error("smoke", exc)]
    oks = {int(m.group(1)) for _h, _r, t in run.output.lines if (m := SMOKE_LINE.search(t)) and m.group(3) == "True"}
    world = run.plan.world_size
    if run.result.exit_code == 0 and len(oks) == world:
        return [Finding("smoke", CheckStatus.OK, None,
                        f"gloo all_reduce across {world} rank(s) on {len(job.hosts)} host(s) succeeded",
                        evidence=f"logs: {run.result.run_dir}")]
    missing = sorted(set(range(world)) - oks)
    return [Finding("smoke", CheckStatus.FAIL, run.result.first_failure.host if run.result.first_failure else None,
                    f"gloo all_reduce smoke test failed (ranks without a result: {missing})",
                    evidence=failure_evidence(run) + f"\nlogs: {run.result.run_dir}",
                    fix="the TCP probes passed but gloo did not: check GLOO_SOCKET_IFNAME names an interface "
                        "that reaches the other hosts, and that hostnames resolve to routable addresses")]


@dataclass
class BandwidthReport:
    table: dict[str, Any] | None = None  # the BANDWIDTH json across all hosts
    findings: list[Finding] = field(default_factory=list)


def bandwidth_report(job: Job, backend: Backend, runs_dir: Path, max_bytes: str) -> BandwidthReport:
    out = BandwidthReport()
    try:
        run, out.table = bandwidth(job, backend, runs_dir, max_bytes=max_bytes)
    except (HostError, HostsFailed, LaunchBlocked) as exc:
        out.findings.append(launch_error("bandwidth", exc))
        return out
    if out.table is None:
        out.findings.append(Finding("bandwidth", CheckStatus.FAIL, None, "the all_reduce benchmark printed no result",
                                    evidence=failure_evidence(run), fix="run ddpctl doctor --smoke first"))
        return out
    t = out.table
    out.findings.append(Finding("bandwidth", CheckStatus.INFO, None,
                                f"all_reduce across {t['world_size']} ranks: "
                                f"peak busbw {t['peak_busbw_gbps']:.3f} GB/s, "
                                f"average {t['avg_busbw_gbps']:.3f} GB/s", evidence=f"logs: {run.result.run_dir}"))
    return out
