"""Before launch: one agent session per host (doctor's facts op and its TCP probe, with a
narrower selection) resolves nproc and the master port, and runs the doctor checks that predict
a failed or hung rendezvous, or ranks that cannot start (no torch). An error finding stops the
launch before any rank starts; stale holders of the master port are freed; the oldest run
directories are pruned, on the hosts in the same round trip ([defaults] keep_runs). A launch holds the
sessions open: each host's torchrun then starts in the session that checked it (one SSH session
per host, the agent shipped once)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from inventory import ConfigError, Host, Job
from inventory.fields import is_ip_address
from inventory.gpus import declared_gpus, selection
from node_agent.wire.replies_jobs import PruneReport
from orchestrator.checks.addressing import Addressing, PickedInterfaces, is_loopback
from orchestrator.checks.context import from_job
from orchestrator.checks.gather import (
    close_all,
    open_sessions,
    run_probe,
    settle_addressing,
    settle_interfaces,
)
from orchestrator.checks.master_port import Holder, port_verdict
from orchestrator.checks.model import CheckStatus, Finding, Observations, ProbeResults
from orchestrator.checks.registry import run_checks
from orchestrator.checks.spec import Runs
from orchestrator.errors import HostError, HostErrorKind, HostsFailed, LaunchBlocked
from orchestrator.hostops.prune import (
    HERE,
    launch_request,
    prune_here,
    running_on,
    summary,
    where_text,
)
from orchestrator.launch.plan import Nproc
from orchestrator.remote.agent import call_agent
from orchestrator.remote.pool import HostPool
from orchestrator.remote.session import Session
from orchestrator.remote.wire import HostFacts, parse_report

LAUNCH_FACTS = ("cpu_count", "gpu_count", "python", "workdir", "master_port", "free_port")
# What a job on several hosts reads, checks or not: each host's network, from which master_addr
# and the interfaces are settled (doctor/addressing.py), and the env its processes will see.
NET_FACTS = ("resolution", "interfaces", "routes", "env", "hostname_resolution")
# What the pre-launch checks read, on top of those: no torch import (it costs seconds), only
# whether each host's interpreter finds torch (the python check judges it as doctor does); a host's
# metrics_dir where the inventory gives one (the metrics_dir check: warnings only).
CHECK_FACTS = ("script", "torch_lookup", "metrics_dir")
# nvidia-smi's GPUs and their processes, read only when a host selects GPUs (`gpus = [0, 2]`): the
# gpu check then judges the selection (indices that exist, GPUs another process uses).
SELECTION_FACTS = ("gpus",)
FACTS_TIMEOUT_S = 60.0


class ChecksFailed(LaunchBlocked):
    """A pre-launch check found an error: no rank was started."""

    def __init__(self, findings: list[Finding]) -> None:
        self.findings = findings
        errors = [f for f in findings if f.status == CheckStatus.FAIL]
        super().__init__("pre-launch checks failed (nothing was started):\n" + "\n".join(
            f"[{f.check}] {f.host or 'all hosts'}: {f.message}" + (f"\n  fix: {f.fix}" if f.fix else "")
            for f in errors))


@dataclass(frozen=True)
class Preflight:
    """The launch round trip's answer: every host's facts, the checks' findings, its timing."""

    facts: dict[str, HostFacts]
    findings: list[Finding] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)  # facts_s, probe_s, checks_s
    sessions: dict[str, Session] = field(default_factory=dict)  # held (gather's `hold`), by host
    addressing: Addressing | None = None  # master_addr as settled from the hosts' routes
    interfaces: dict[str, PickedInterfaces] = field(default_factory=dict)  # what ddpctl sets, per host

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.status == CheckStatus.FAIL]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.status == CheckStatus.WARN]


@dataclass(frozen=True)
class PruneAsk:
    """A launch prunes old run directories in this round trip ([defaults] keep_runs): on every host
    (the facts op's `prune` sub-fact) and here in `runs_dir`; one line per place goes to `notice`."""

    runs_dir: Path
    notice: Callable[[str], None]


def gather(job: Job, pool: HostPool, checks: bool = True, hold: bool = False,
           prune: PruneAsk | None = None) -> Preflight:
    """Every host's launch facts in one agent session per host, and (checks) the TCP probe of the
    master port and between the hosts, then the launch checks. A host that cannot be reached, a
    missing interpreter or (without checks) a missing workdir stops here. `hold`: when all is
    well the sessions stay open, each waiting to start its host's torchrun (`sessions`); else,
    and whatever stops the launch, they are closed. `prune`: the oldest run directories go too."""
    started = time.monotonic()
    ctx = from_job(job, timeout_s=FACTS_TIMEOUT_S)
    probe = checks and len(job.hosts) > 1
    extra = {"prune": launch_request(job.inventory.keep_runs, prune.runs_dir)} if prune is not None else None
    select = launch_facts(job, checks) + (("prune",) if prune is not None else ())
    fan = open_sessions(pool, ctx, probe, select, hold, extra=extra)
    sessions = {name: o.session for name, o in fan.succeeded.items()}
    gathered = time.monotonic()
    keep = False
    try:
        if prune is not None:
            report_pruned(job, {name: o.facts for name, o in fan.succeeded.items()}, prune)
        if fan.failed:
            raise HostsFailed("pre-flight", list(fan.failed.values()))
        probes = run_probe(ctx, fan.succeeded) if probe else ProbeResults()
        probed = time.monotonic()
        ctx, facts, addressing = settle_addressing(ctx, {name: o.facts for name, o in fan.succeeded.items()})
        findings = run_checks(Observations(ctx, facts, {}, probes), Runs.LAUNCH) if checks else []
        pre = Preflight(facts, findings, {"facts_s": gathered - started, "probe_s": probed - gathered,
                                          "checks_s": time.monotonic() - probed}, sessions if hold else {},
                        addressing if len(job.hosts) > 1 else None, settle_interfaces(ctx, facts, addressing))
        if pre.errors:
            raise ChecksFailed(pre.findings)
        for host in job.hosts:
            hf = facts[host.name]
            if not hf.python_found:
                raise HostError(host.name, HostErrorKind.AGENT, f"interpreter {host.python} not found",
                                f"install torch there or set python = ... for {host.name} in the inventory")
            if not hf.workdir_exists and job.sync is None:  # with [sync], a launch has made it by now
                raise HostError(host.name, HostErrorKind.AGENT, f"workdir {job.workdir_for(host)} does not exist",
                                "create it (or sync the code there) or set workdir in the inventory")
        keep = hold
        return pre
    finally:
        if not keep:
            close_all(list(sessions.values()))  # also frees the probe's listeners


def report_pruned(job: Job, facts: Mapping[str, HostFacts], ask: PruneAsk) -> None:
    """Each host's pruning in one line (a host that could not prune: a warning, never a stop), then
    this machine's runs/, judged with what the hosts run."""
    reports: dict[str, PruneReport] = {}
    for name, hf in facts.items():
        if hf.errors.get("prune"):
            ask.notice(f"warning: old runs on {name} were not pruned: {hf.errors['prune']}")
        elif hf.facts.prune is None:
            ask.notice(f"warning: old runs on {name} were not pruned: the node agent sent no prune report")
        else:
            reports[name] = hf.facts.prune
    here = prune_here(ask.runs_dir, max(job.inventory.keep_runs - 1, 0), running_on(reports))
    for name, report in [*reports.items(), (HERE, here)]:
        line = summary(name, report)
        if line is not None:
            ask.notice(line)
        for error in report.errors:
            ask.notice(f"warning: {where_text(name, report)}, {error}")


def needs_hosts(job: Job) -> bool:
    """Only the hosts can tell the master's address: the job names none and the master's inventory
    address is a name (it may not resolve on the hosts) or loopback (this machine)."""
    if len(job.hosts) < 2 or job.rendezvous.master_addr is not None or all(h.is_local for h in job.hosts):
        return False
    address = job.master_host.address
    return not is_ip_address(address) or is_loopback(address)


def launch_facts(job: Job, checks: bool) -> tuple[str, ...]:
    """The sub-facts the launch asks every host for: the network where the job spans hosts;
    nvidia-smi only where a host selects GPUs."""
    net = NET_FACTS if len(job.hosts) > 1 or checks else ()
    if not checks:
        return LAUNCH_FACTS + net
    selects = any(selection(h) is not None for h in job.hosts)
    return LAUNCH_FACTS + net + CHECK_FACTS + (SELECTION_FACTS if selects else ())


def resolve_nprocs(job: Job, facts: Mapping[str, HostFacts]) -> dict[str, int]:
    """Processes per host (Nproc: the count and what decided it): the job's nproc_per_node, else the
    host's slots, else 1; "gpu" needs GPUs and equal counts, reported before launch. A host's GPUs
    are its selection (`gpus = [0, 2]`: 2), else its declared count, else those detected."""
    gpus = {h.name: _first_known(declared_gpus(h), facts[h.name].gpu_count) for h in job.hosts}
    return _per_host(job, gpus, {h.name: facts[h.name].cpu_count for h in job.hosts})


def static_nprocs(job: Job) -> dict[str, int] | None:
    """Processes per host where the job and the inventory alone decide it (a number, from the job
    or the host's slots; "gpu" or "auto" on hosts whose GPUs the inventory gives), so a dry run
    asks no host; else None."""
    specs = {h.name: job.nproc_of(h) for h in job.hosts}
    if all(isinstance(n.spec, int) for n in specs.values()):
        return {name: Nproc(int(n.spec), n.source) for name, n in specs.items()}
    declared = {h.name: declared_gpus(h) for h in job.hosts}
    gpus = {name: n for name, n in declared.items() if n is not None}
    if job.nproc_per_node == "cpu" or len(gpus) < len(declared) or \
            (job.nproc_per_node == "auto" and 0 in gpus.values()):
        return None
    return _per_host(job, gpus, {})


def _first_known(declared: int | None, detected: int) -> int:
    return declared if declared is not None else detected


def _one_host(job: Job, host: Host, gpus: int, cpus: Mapping[str, int]) -> Nproc:
    rule = job.nproc_of(host)
    spec = rule.spec
    if isinstance(spec, int):
        return Nproc(spec, rule.source)
    if spec == "gpu":
        if gpus < 1:
            raise ConfigError(f"nproc_per_node = \"gpu\" but {host.name} has no GPU",
                              file=job.source, key="job.nproc_per_node",
                              hint="use an integer or \"cpu\", or fix the host's GPUs (ddpctl doctor)")
        return Nproc(gpus, "gpu: its GPUs")
    if spec == "cpu":
        return Nproc(cpus[host.name], "cpu: its CPUs")
    return Nproc(gpus, "auto: GPUs") if gpus > 0 else Nproc(cpus[host.name], "auto: CPUs, no GPU")


def _per_host(job: Job, gpus: Mapping[str, int], cpus: Mapping[str, int]) -> dict[str, int]:
    out: dict[str, int] = {h.name: _one_host(job, h, gpus[h.name], cpus) for h in job.hosts}
    counts = sorted(set(out.values()))
    if job.nproc_per_node == "gpu" and len(counts) > 1:
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
        if mf.facts.free_port is None:
            raise HostError(master.name, HostErrorKind.AGENT, "the node agent picked no free port",
                            "set an explicit master_port in [rendezvous]")
        notice(f"master port auto: {mf.facts.free_port} is free on {master.name}")
        return mf.facts.free_port
    port = int(job.rendezvous.master_port)
    verdict = port_verdict(master.name, port, mf.facts.master_port)
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
        unbound = [f"no process holds it, yet it does not bind ({report.bind_error})"] if report.bind_error else []
        why = "; ".join([r.reason for r in report.refused] + list(report.errors) + unbound) or "unknown"
        raise LaunchBlocked(f"master port {port} on {master.name} is still busy after freeing it: {why}")
    return port
