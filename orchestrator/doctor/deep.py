"""`ddpctl doctor --deep`: after the usual checks pass, the active checks that find the host that
would slow or break the job: a timed matrix multiply on every host and GPU (`compute`), link rounds
between the hosts (`links`), and each GPU's health facts (`gpu_health`).

The first two are one short program through the real launch path, run by each host on its own
(torchrun --standalone) and coordinated by node 0 through a store at the master port, shipped with
the agent (train_jobs/hostcheck: the hosts need torch, not this repository). Every wait has a
deadline derived from the hosts that finished (train_jobs/hostcheck/schedule.py), and a host that
misses it is named while the rest goes on, with what it printed where it did not start. Doctor's
side (deep_watch.py) stops the hosts still at it once node 0 prints the figures, and bounds the
start where node 0 itself cannot coordinate.

The figures are one message, declared once in train_jobs/hostcheck/figures.py (`DeepFigures`): node 0
prints its JSON (`DDPCTL-DEEP <json>`), this module decodes it once (`from_json`; a line that does not
fit is no result) and adds the hosts by rank and the logs; the analysis (pure: orchestrator/checks/
links.py, compute.py), the CLI's table and `--json`'s "deep" read its attributes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from inventory import Job
from orchestrator.checks import catalog
from orchestrator.checks.compute import DeviceRate, Late, compute_findings, late_finding, slow_devices
from orchestrator.checks.links import LinkRate, LinkRounds, link_findings
from orchestrator.checks.model import CheckStatus, Finding
from orchestrator.checks.spec import Runs
from orchestrator.doctor.collective import failure_evidence, launch_error
from orchestrator.doctor.collective_jobs import CollectiveRun, result_text, run_collective
from orchestrator.doctor.deep_watch import HostCheckWatch, HostStart, StartReport
from orchestrator.doctor.gpu_health_round import gpu_health_round
from orchestrator.errors import HostError, HostsFailed, LaunchBlocked
from orchestrator.launch.backends.base import Backend
from orchestrator.launch.inline import InlineProgram, shipped_program
from orchestrator.launch.monitor_api import Monitor
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.plan import LaunchPlan
from orchestrator.remote.pool import HostPool
from orchestrator.watch.factory import standard_monitors
from train_jobs.hostcheck.figures import RESULT, DeepFigures, Missed

LINKS_BUDGET_S = 20.0  # seconds of tournament rounds before the covering schedule takes over
EXCHANGE_BYTES = 2 << 20  # each way, per timed exchange
DEADLINE_S = 120.0  # the job is stopped after this long without a line of output
FILES = ("hostcheck/verdict.py", "hostcheck/figures.py", "hostcheck/schedule.py", "hostcheck/coordinate.py",
         "hostcheck/check.py")  # under train_jobs/; the last is the main module


@dataclass
class DeepReport:
    """The figures (`--json`'s "deep") and the findings."""

    figures: DeepFigures | None = None  # None: the host check printed none (or one that does not decode)
    findings: list[Finding] = field(default_factory=list)


def job_checks() -> tuple[str, ...]:
    """The deep checks the host-check job answers (Runs.JOB in their specs)."""
    return catalog.names(Runs.DEEP | Runs.JOB)


def checks() -> tuple[str, ...]:
    """--deep's columns: the checks read from the hosts meanwhile (gpu_health), whose findings come
    first, then the host-check job's."""
    return tuple(s.name for s in catalog.specs(Runs.DEEP) if Runs.JOB not in s.runs) + job_checks()


def program(links_budget: float, nbytes: int) -> InlineProgram:
    return shipped_program(FILES, ("--links-budget", f"{links_budget:g}", "--bytes", str(nbytes)), per_host=True)


def _late(hosts: list[str], missed: Sequence[Missed], starts: StartReport | None,
          tails: Mapping[str, Sequence[str]], store: str) -> list[Late]:
    """The hosts that missed the join or a compute deadline, in words."""
    out = []
    for m in missed:
        if m.phase == "compute":
            took = "" if m.others_s is None else f"; the others took {m.others_s:.1f} s"
            out += [Late(hosts[r], f"did not finish its compute test in {m.after_s:.0f} s{took} (a starved or "
                                   "overloaded host)", m.after_s, m.others_s) for r in m.ranks]
        elif m.phase == "join":
            node0 = starts.hosts.get(hosts[0]) if starts else None
            deadline = None if node0 is None or node0.started is None else node0.started + m.after_s
            out += [_not_joined(hosts[r], m, starts.hosts.get(hosts[r]) if starts else None, deadline, tails, store)
                    for r in m.ranks]
    return out


def _not_joined(host: str, m: Missed, start: HostStart | None, deadline: float | None,
                tails: Mapping[str, Sequence[str]], store: str) -> Late:
    """A host the coordinator named at its join deadline (`deadline`: when that was, on the watch's
    clock), told apart by what the watch saw of it: it could not start (its node ended on its own),
    or it started in time and never reached node 0's store while the check ran (both errors: a job
    could not start there either), or it was late (a warning: a starved or overloaded host)."""
    evidence = printed(host, tails)
    if start is not None and start.ended is not None and start.started is None:
        return Late(host, f"could not start its host check ({start.ended})", m.after_s, m.others_s, True, evidence)
    if (start is not None and start.started is not None and not start.joined
            and (deadline is None or start.started <= deadline)):
        took = "" if m.others_s is None else f"; the others joined in {m.others_s:.1f} s"
        return Late(host, f"started its host check but did not reach node 0's store at {store} in {m.after_s:.0f} s"
                          f"{took}", m.after_s, m.others_s, True, evidence)
    took = "" if m.others_s is None else f"; the others started in {m.others_s:.1f} s"
    return Late(host, f"did not start its host check in {m.after_s:.0f} s{took} (a starved or overloaded host)",
                m.after_s, m.others_s, False, evidence)


def printed(host: str, tails: Mapping[str, Sequence[str]], lines: int = 8) -> str:
    """The tail of what a host's check printed (the evidence of a start that failed)."""
    tail = list(tails.get(host, ()))[-lines:]
    return f"{host} printed:\n" + "\n".join(f"  {line}" for line in tail) if tail else f"{host} printed nothing"


def analyse(hosts: list[str], figures: DeepFigures, starts: StartReport | None = None,
            tails: Mapping[str, Sequence[str]] | None = None, store: str = "the master port") -> list[Finding]:
    """The compute and links findings of one run's figures (`hosts`: by rank; `starts`, `tails`:
    what the watch saw of each host's start and what each printed last; `store`: node 0's)."""
    devices = [DeviceRate(hosts[row.rank], row.device, row.model, row.tflops, gpu=row.gpu is not None,
                          windows=len(row.windows) or 1) for row in figures.compute]
    rates = tuple(LinkRate.of(hosts[row.a], hosts[row.b], row.figure) for row in figures.links)
    rounds = LinkRounds(rates, figures.rounds, figures.all_pairs, figures.nbytes, figures.backend)
    slow_cpus = {d.host for d in slow_devices(devices) if not d.gpu}
    late = _late(hosts, figures.missed, starts, tails or {}, store)
    tested = [hosts[r] for r in figures.tested]
    return (compute_findings(hosts, devices, late=late)
            + link_findings(hosts if len(tested) > 2 else tested, rounds, slow_cpus))


def deep_report(job: Job, backend: Backend, pool: HostPool, runs_dir: Path, timeout: float,
                notice: Callable[[str], None] = lambda _: None, links_budget: float = LINKS_BUDGET_S,
                nbytes: int = EXCHANGE_BYTES) -> DeepReport:
    """Each host's GPU health facts, read while the host check runs on the job's hosts (a host
    slow to answer one holds neither): the findings, and the host check's figures."""
    notice(f"reading the GPU health facts of {len(job.hosts)} host(s), and timing compute on each host and "
           f"the links between them in rounds")
    with ThreadPoolExecutor(1, thread_name_prefix="gpu-health") as pool_of_one:
        health = pool_of_one.submit(gpu_health_round, pool, job.hosts, timeout)
        out = host_check(job, backend, runs_dir, links_budget, nbytes)
        out.findings = health.result() + out.findings
    return out


def host_check(job: Job, backend: Backend, runs_dir: Path, links_budget: float, nbytes: int) -> DeepReport:
    """The compute and links findings of the host check, and its figures."""
    out = DeepReport()
    watches: list[HostCheckWatch] = []

    def monitors(plan: LaunchPlan, options: LaunchOptions) -> Sequence[Monitor]:
        watches.append(HostCheckWatch([h.host.name for h in sorted(plan.hosts, key=lambda h: h.node_rank)]))
        return [*standard_monitors(plan, options), watches[-1]]

    try:
        run = run_collective(job, backend, "ddpctl-deep", program(links_budget, nbytes), runs_dir, DEADLINE_S,
                             monitors=monitors)
    except (HostError, HostsFailed, LaunchBlocked) as exc:
        out.findings += [launch_error(check, exc) for check in job_checks()]
        return out
    starts = watches[0].report() if watches else None
    tails = {r.host: r.tail for r in run.result.hosts}
    if starts is not None and starts.no_coordinator:  # node 0 never coordinated: no figures, the start named
        out.findings += [late_finding(Late(n.host, n.text, n.after_s, n.others_s, n.failed, printed(n.host, tails)))
                         for n in starts.named] + no_result(run, coordinator=starts.named[0].host)
        return out
    text = result_text(run, RESULT)
    try:
        figures = None if text is None else DeepFigures.from_json(json.loads(text))
    except ValueError as exc:  # a line cut short or of another shape: no result, said in the evidence
        out.findings += no_result(run, f"\nits result line does not decode ({exc})")
        return out
    if figures is None:
        out.findings += no_result(run)
        return out
    names = [h.host.name for h in sorted(run.plan.hosts, key=lambda h: h.node_rank)]
    out.figures = replace(figures, hosts=tuple(names), logs=str(run.result.run_dir))
    out.findings += analyse(names, out.figures, starts, tails, f"{run.plan.master_addr}:{run.plan.master_port}")
    return out


def no_result(run: CollectiveRun, why: str = "", coordinator: str | None = None) -> list[Finding]:
    """Each job check's failure where the host check printed no figures (`why`: none that decode);
    `coordinator`: node 0 never coordinated, named under compute already, so links alone says so."""
    if coordinator is not None:
        return [Finding("links", CheckStatus.FAIL, coordinator, "the host check printed no result",
                        evidence=f"node 0 ({coordinator}) coordinates the host check and did not (see its compute "
                                 f"finding)\nlogs: {run.result.run_dir}",
                        fix=f"make the host check start on {coordinator}, or put another host first in the job")]
    return [Finding(check, CheckStatus.FAIL, run.result.first_failure.host if run.result.first_failure else None,
                    "the host check printed no result",
                    evidence=failure_evidence(run) + why + f"\nlogs: {run.result.run_dir}",
                    fix="run ddpctl doctor --smoke: a collective across the hosts must work first")
            for check in job_checks()]
