"""Doctor's launch-path checks: a gloo all_reduce smoke test and the all_reduce bandwidth table."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from itertools import combinations
from pathlib import Path
from typing import Any, Literal

from inventory import Inventory, Job, Rendezvous
from orchestrator.checks.model import CheckStatus, DoctorContext, Finding
from orchestrator.doctor.collective_jobs import SMOKE_LINE, CollectiveRun, bandwidth, smoke
from orchestrator.errors import HostError, HostsFailed, LaunchBlocked
from orchestrator.launch.backends.base import Backend

MAX_PAIR_HOSTS = 8  # --pairs runs one job per pair: n(n-1)/2 of them
SLOW_PAIR = 0.5  # a pair below this fraction of the median pair bandwidth is flagged


def job_for(ctx: DoctorContext, job: Job | None) -> Job:
    """The job doctor checks, or one made from the inventory (first host is the master)."""
    if job is not None:
        return job
    hosts = tuple(replace(h, workdir=ctx.workdirs.get(h.name, h.workdir)) for h in ctx.hosts)
    port: int | Literal["auto"] = ctx.master_port if ctx.master_port is not None else "auto"
    return Job(name="doctor", inventory=Inventory(hosts), hosts=hosts, script="-",
               rendezvous=Rendezvous(None, port, "static"), env=dict(ctx.env))


def _failure_evidence(run: CollectiveRun) -> str:
    ff = run.result.first_failure
    lines = [f"{ff.host}: {ff.error or ''}"] if ff else []
    for r in run.result.hosts:
        lines += [f"{r.host}: {t}" for t in r.tail[-3:]]
    return "\n".join(lines[-8:])


def _launch_error(check: str, exc: Exception) -> Finding:
    errors = exc.errors if isinstance(exc, HostsFailed) else [exc]
    text = "; ".join(str(e) for e in errors)
    return Finding(check, CheckStatus.FAIL, None, "could not launch through the real launch path",
                   evidence=text, fix="fix the errors above first (ddpctl doctor), then retry")


def smoke_findings(job: Job, backend: Backend, runs_dir: Path) -> list[Finding]:
    try:
        run = smoke(job, backend, runs_dir)
    except (HostError, HostsFailed, LaunchBlocked) as exc:
        return [_launch_error("smoke", exc)]
    oks = {int(m.group(1)) for _h, _r, t in run.output.lines if (m := SMOKE_LINE.search(t)) and m.group(3) == "True"}
    world = run.plan.world_size
    if run.result.exit_code == 0 and len(oks) == world:
        return [Finding("smoke", CheckStatus.OK, None,
                        f"gloo all_reduce across {world} rank(s) on {len(job.hosts)} host(s) succeeded",
                        evidence=f"logs: {run.result.run_dir}")]
    missing = sorted(set(range(world)) - oks)
    return [Finding("smoke", CheckStatus.FAIL, run.result.first_failure.host if run.result.first_failure else None,
                    f"gloo all_reduce smoke test failed (ranks without a result: {missing})",
                    evidence=_failure_evidence(run) + f"\nlogs: {run.result.run_dir}",
                    fix="the TCP probes passed but gloo did not: check GLOO_SOCKET_IFNAME names an interface "
                        "that reaches the other hosts, and that hostnames resolve to routable addresses")]


@dataclass
class BandwidthReport:
    table: dict[str, Any] | None = None  # the BANDWIDTH json across all hosts
    pairs: dict[str, float] = field(default_factory=dict)  # "a<->b" -> peak busbw GB/s
    findings: list[Finding] = field(default_factory=list)


def _peak(bw: dict[str, Any] | None) -> float | None:
    return float(bw["peak_busbw_gbps"]) if bw else None


def bandwidth_report(job: Job, backend: Backend, runs_dir: Path, pairs: bool, max_bytes: str) -> BandwidthReport:
    out = BandwidthReport()
    try:
        run, out.table = bandwidth(job, backend, runs_dir, max_bytes=max_bytes)
    except (HostError, HostsFailed, LaunchBlocked) as exc:
        out.findings.append(_launch_error("bandwidth", exc))
        return out
    if out.table is None:
        out.findings.append(Finding("bandwidth", CheckStatus.FAIL, None, "the all_reduce benchmark printed no result",
                                    evidence=_failure_evidence(run), fix="run ddpctl doctor --smoke first"))
        return out
    t = out.table
    out.findings.append(Finding("bandwidth", CheckStatus.INFO, None,
                                f"all_reduce across {t['world_size']} ranks: "
                                f"peak busbw {t['peak_busbw_gbps']:.3f} GB/s, "
                                f"average {t['avg_busbw_gbps']:.3f} GB/s", evidence=f"logs: {run.result.run_dir}"))
    if pairs:
        out.findings += _pair_findings(job, backend, runs_dir, max_bytes, out.pairs)
    return out


def _pair_findings(job: Job, backend: Backend, runs_dir: Path, max_bytes: str,
                   pairs: dict[str, float]) -> list[Finding]:
    if len(job.hosts) > MAX_PAIR_HOSTS:
        return [Finding("bandwidth", CheckStatus.SKIP, None,
                        f"--pairs measures every pair; skipped for more than {MAX_PAIR_HOSTS} hosts",
                        fix="select up to 8 hosts with --hosts in the job, or -i a smaller inventory")]
    for a, b in combinations(job.hosts, 2):
        sub = replace(job, hosts=(a, b), rendezvous=replace(job.rendezvous, master_addr=None))
        try:
            _run, bw = bandwidth(sub, backend, runs_dir, max_bytes=max_bytes)
        except (HostError, HostsFailed, LaunchBlocked):
            bw = None
        pairs[f"{a.name}<->{b.name}"] = _peak(bw) or 0.0
    if not pairs:
        return []
    median = statistics.median(pairs.values())
    findings = []
    for pair, value in pairs.items():
        if value < SLOW_PAIR * median:
            findings.append(Finding("bandwidth", CheckStatus.WARN, pair.split("<->")[0],
                                    f"pair {pair}: busbw {value:.3f} GB/s is far below the median {median:.3f} GB/s",
                                    evidence=", ".join(f"{k}={v:.3f}" for k, v in pairs.items()),
                                    fix="a slow link or a wrong interface: check NCCL_SOCKET_IFNAME / "
                                        "GLOO_SOCKET_IFNAME and the link speed of both hosts"))
    return findings
