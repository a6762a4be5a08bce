"""`ddpctl doctor --deep`: after the usual checks pass, the active checks that find the host that
would slow or break the job: a timed matrix multiply on every host and GPU (`compute`), link rounds
between the hosts (`links`), and each GPU's health facts (`gpu_health`).

The first two are one short job through the real launch path, one rank per host, shipped inline
(train_jobs/hostcheck: the hosts need torch, not this repository); the analysis is pure
(orchestrator/checks/links.py, compute.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inventory import Job
from orchestrator.checks.compute import CHECK as COMPUTE
from orchestrator.checks.compute import DeviceRate, compute_findings, slow_devices
from orchestrator.checks.links import CHECK as LINKS
from orchestrator.checks.links import LinkRate, LinkRounds, link_findings
from orchestrator.checks.model import CheckStatus, Finding
from orchestrator.doctor.collective import failure_evidence, launch_error
from orchestrator.doctor.collective_jobs import result_line, run_collective
from orchestrator.doctor.gpu_health import gpu_health_round
from orchestrator.errors import HostError, HostsFailed, LaunchBlocked
from orchestrator.launch.backends.base import Backend
from orchestrator.launch.inline import InlineProgram, train_jobs_sources
from orchestrator.remote.pool import HostPool

RESULT = "DDPCTL-DEEP "
CHECKS = ("gpu_health", COMPUTE, LINKS)
JOB_CHECKS = (COMPUTE, LINKS)  # the two the host-check job answers
LINKS_BUDGET_S = 20.0  # seconds of tournament rounds before the covering schedule takes over
EXCHANGE_BYTES = 2 << 20  # each way, per timed exchange
DEADLINE_S = 120.0  # the job is stopped after this long without a line of output


@dataclass
class DeepReport:
    """The figures (`--json`'s "deep") and the findings."""

    figures: dict[str, Any] | None = None
    findings: list[Finding] = field(default_factory=list)


def program(links_budget: float, nbytes: int) -> InlineProgram:
    sources = train_jobs_sources("hostcheck/__init__.py", "hostcheck/schedule.py", "hostcheck/check.py")
    return InlineProgram(sources, "train_jobs.hostcheck.check",
                         ("--links-budget", f"{links_budget:g}", "--bytes", str(nbytes)))


def analyse(hosts: list[str], figures: dict[str, Any]) -> list[Finding]:
    """The compute and links findings of one run's figures (`hosts`: by rank)."""
    devices = [DeviceRate(hosts[row["rank"]], row["device"], row["model"], float(row["tflops"]),
                          gpu=row["gpu"] is not None) for row in figures["compute"]]
    rates = tuple(LinkRate(hosts[row["a"]], hosts[row["b"]], float(row["mbps"]), int(row.get("measured", 1)))
                  for row in figures["links"])
    rounds = LinkRounds(rates, int(figures["rounds"]), bool(figures["all_pairs"]), int(figures["bytes"]),
                        str(figures["backend"]))
    slow_cpus = {d.host for d in slow_devices(devices) if not d.gpu}
    return compute_findings(hosts, devices) + link_findings(hosts, rounds, slow_cpus)


def deep_report(job: Job, backend: Backend, pool: HostPool, runs_dir: Path, timeout: float,
                notice: Callable[[str], None] = lambda _: None, links_budget: float = LINKS_BUDGET_S,
                nbytes: int = EXCHANGE_BYTES) -> DeepReport:
    """Each host's GPU health facts, then the host check on the job's hosts: the findings, and
    the host check's figures."""
    notice(f"reading the GPU health facts of {len(job.hosts)} host(s)")
    out = DeepReport(findings=gpu_health_round(pool, job.hosts, timeout))
    notice(f"timing compute on each host and the links between {len(job.hosts)} hosts in rounds")
    try:
        run = run_collective(job, backend, "ddpctl-deep", program(links_budget, nbytes), runs_dir, DEADLINE_S)
    except (HostError, HostsFailed, LaunchBlocked) as exc:
        out.findings += [launch_error(check, exc) for check in JOB_CHECKS]
        return out
    out.figures = result_line(run, RESULT)
    if out.figures is None:
        out.findings += [Finding(check, CheckStatus.FAIL, run.result.first_failure.host if run.result.first_failure
                                 else None, "the host check printed no result",
                                 evidence=failure_evidence(run) + f"\nlogs: {run.result.run_dir}",
                                 fix="run ddpctl doctor --smoke: a collective across the hosts must work first")
                         for check in JOB_CHECKS]
        return out
    by_rank = sorted(run.plan.hosts, key=lambda h: h.node_rank)
    names = [h.host.name for h in by_rank]
    out.figures["hosts"] = names
    out.figures["logs"] = str(run.result.run_dir)
    out.findings += analyse(names, out.figures)
    return out
