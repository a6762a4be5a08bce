"""`ddpctl doctor` for a Slurm job: does the request fit the controller's partition and config (two
scontrol calls, pure checks), then, in one short allocation, doctor's own node checks on every
allocated node, from the node agent's slurm_check op (its facts and a TCP probe between the nodes)."""

from __future__ import annotations

import math
import secrets
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from inventory import Host, Job
from inventory.sbatch import allocation_options
from inventory.slurm_table import DEFAULT_BASE_PORT, node_hosts
from inventory.specs import SlurmSpec
from node_agent.wire.layout import SLURM_PORT_SPREAD, SLURM_PORT_TRIES, slurm_state_dir
from orchestrator.checks import catalog
from orchestrator.checks.base import fail, listing, ok
from orchestrator.checks.gather import facts_request
from orchestrator.checks.model import (
    DoctorContext,
    Finding,
    Observations,
    ProbeOutcome,
    ProbeResults,
)
from orchestrator.checks.registry import run_checks
from orchestrator.checks.slurm_controller import (
    Controller,
    controller_checks,
    controller_host,
    parse_partitions,
    pick_partition,
    time_limit_s,
    unreachable_finding,
)
from orchestrator.checks.spec import CheckSpec, Runs
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.remote.agent import request_bytes
from orchestrator.remote.slurm_client import SlurmClient, node_script, on_every_node, task_reply
from orchestrator.remote.wire import HostFacts, parse_facts

ALLOC = "alloc"
SPEC = CheckSpec(ALLOC, order=230, runs=Runs.SLURM)
JOB_NAME = "ddpctl-doctor"
POLL_S = 0.5  # squeue while the node-check job is queued or runs
BARRIER_S = 30.0  # how long a node waits for the others' files on the shared filesystem
CANCEL_WAIT_S = 30.0
REPROBE_TIMEOUT_S = 60.0  # the watchdog's probe inside a running job, all nodes together
TOO_FEW = "fewer than two nodes answered"


def node_checks() -> tuple[str, ...]:
    """doctor's checks of the facts that the allocation runs on every node (Runs.SLURM in their specs)."""
    return catalog.names(Runs.NODE | Runs.SLURM)


def check_order() -> tuple[str, ...]:
    """The Slurm doctor's columns: its own checks (the controller's, the allocation's), then the node checks."""
    return tuple(s.name for s in catalog.specs(Runs.SLURM) if Runs.NODE not in s.runs) + node_checks()


# -- the controller: two scontrol calls, the pure checks in checks/slurm.py -----------------------

def read_controller(client: SlurmClient) -> Controller:
    """Two scontrol calls; a missing client or an unreachable controller raises HostError."""
    config = client.config()
    listed = client.run(["scontrol", "-a", "-o", "show", "partition"])
    return Controller(config, parse_partitions(listed.stdout))


def controller_findings(client: SlurmClient, spec: SlurmSpec) -> list[Finding]:
    """What decides whether the job can start, from two scontrol calls (`ddpctl up` runs it too)."""
    where = controller_host(spec)
    try:
        ctrl = read_controller(client)
    except HostError as err:
        return [unreachable_finding(err, where, client.where)]
    return controller_checks(ctrl, spec, where, client.where)


# -- the allocation: one short job whose one task per node runs the slurm_check op -------------

def allocation_minutes(timeout_s: float, job_time_s: float | None, max_time_s: float | None) -> int:
    """The node-check job's --time: the run's timeout and a minute, within the job's own time and
    the partition's MaxTime (a longer one would queue forever)."""
    caps = [c for c in (job_time_s, max_time_s) if c is not None and c != math.inf]
    return max(1, min([math.ceil(timeout_s / 60) + 1, *(math.floor(c / 60) for c in caps)]))


def batch_script(spec: SlurmSpec, state: str) -> str:
    """The job's resource options and extra_sbatch as the launch asks for them (but those that only
    say when it may start: the check starts now), then one srun task per node."""
    return "\n".join([
        "#!/bin/bash", *[f"#SBATCH {option}" for option in spec.resource_options()],
        *[f"#SBATCH {option}" for option in allocation_options(spec.extra_sbatch)],
        "# ddpctl doctor: one task per node runs the node agent's slurm_check op", "set -u",
        f"S={shlex.quote(state)}", 'scontrol show hostnames "$SLURM_JOB_NODELIST" > "$S/nodes"',
        f'srun --nodes={spec.nodes} --ntasks-per-node=1 --input="$S/node.in" --output="$S/node-%t.out" '
        'bash "$S/node.sh"', ""])


def sbatch_argv(spec: SlurmSpec, state: str, minutes: int) -> list[str]:
    return ["sbatch", "--parsable", f"--job-name={JOB_NAME}", f"--nodes={spec.nodes}", "--ntasks-per-node=1",
            f"--time={minutes}", "--no-requeue", f"--chdir={state}", f"--output={state}/batch.out",
            f"{state}/job.sbatch"]


@dataclass
class NodeRun:
    """The allocation's outcome: its nodes in task order, each one's reply or error, its findings."""

    where: str
    state: str = ""
    slurm_id: str | None = None
    nodes: list[str] = field(default_factory=list)
    replies: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    failed: dict[str, HostError] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    submitted_at: float = 0.0  # wall clock, for the clock check's bounds
    ended_at: float = 0.0
    ended: bool = False  # seen out of the queue's active states


@dataclass
class Waited:
    state: str
    reason: str
    queued_s: float
    ran_s: float
    timed_out: bool


def wait_job(client: SlurmClient, slurm_id: str, timeout_s: float, notice: Callable[[str], None]) -> Waited:
    """Poll squeue until the job ends, or `timeout_s` passes in the queue or, once it runs, running."""
    start = time.monotonic()
    deadline, running_since, said = start + timeout_s, None, ""
    while True:
        job = client.job(slurm_id)
        now = time.monotonic()
        if job is not None and job.state == "RUNNING" and running_since is None:
            running_since, deadline = now, now + timeout_s
            notice(f"Slurm job {slurm_id} runs on {job.nodes} after {now - start:.1f}s in the queue")
        elif job is not None and job.queued and job.reason not in (said, "None", ""):
            said = job.reason
            notice(f"Slurm job {slurm_id} queued ({job.reason})")
        ran = now - running_since if running_since is not None else 0.0
        queued = (running_since or now) - start
        if job is None or not job.active or now >= deadline:
            return Waited(job.state if job else "ENDED", job.reason if job else "", queued, ran,
                          job is not None and job.active)
        time.sleep(POLL_S)


def cancel(client: SlurmClient, slurm_id: str) -> bool:
    """scancel, then wait (bounded) until the job has left the active states."""
    client.cancel(slurm_id)
    deadline = time.monotonic() + CANCEL_WAIT_S
    while time.monotonic() < deadline:
        job = client.job(slurm_id)
        if job is None or not job.active:
            return True
        time.sleep(POLL_S)
    return False


def read_replies(client: SlurmClient, run: NodeRun, n: int) -> None:
    """Each task's output file, decoded as the agent's reply (or that node's error)."""
    listed = (client.read(f"{run.state}/nodes") or "").split()
    run.nodes = listed[:n] if len(listed) >= n else [f"node{i}" for i in range(n)]
    batch = (client.read(f"{run.state}/batch.out") or "").strip().splitlines()[-3:]
    for rank, name in enumerate(run.nodes):
        text = client.read(f"{run.state}/node-{rank}.out")
        if text is None:
            run.failed[name] = HostError(name, HostErrorKind.AGENT, "the task wrote no output; the job's output: "
                                         + (" / ".join(batch) or "(none)"), "")
            continue
        try:
            run.replies[name] = task_reply(name, rank, text)
        except HostError as err:
            run.failed[name] = err


def timed_out_finding(run: NodeRun, waited: Waited, timeout_s: float, cancelled: bool) -> Finding:
    gone = "cancelled it" if cancelled else f"scancel did not end it: check `squeue -j {run.slurm_id}`"
    if waited.ran_s == 0.0:
        return fail(ALLOC, run.where, f"Slurm job {run.slurm_id} was still queued after {timeout_s:.0f}s "
                    f"({waited.reason}); {gone}", f"state {waited.state}, reason {waited.reason}",
                    "rerun when nodes are free (sinfo shows them), raise --timeout, or pick a partition with "
                    "idle nodes")
    return fail(ALLOC, run.where, f"the node checks did not finish within {timeout_s:.0f}s of Slurm job "
                f"{run.slurm_id} starting; {gone}", f"state {waited.state}",
                "raise --timeout (importing torch on a cold filesystem can take minutes)")


def run_allocation(client: SlurmClient, spec: SlurmSpec, request: Mapping[str, Any], timeout_s: float,
                   minutes: int, where: str, notice: Callable[[str], None]) -> NodeRun:
    """Submit, wait (bounded), read every node's reply; scancel on any way out but a finished job."""
    run = NodeRun(where)
    try:
        run.state = slurm_state_dir(client.home(), f"doctor-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}")
        client.write(f"{run.state}/node.in", request_bytes("slurm_check", dict(request, dir=run.state)))
        client.write(f"{run.state}/node.sh", node_script(spec).encode(), 0o700)
        client.write(f"{run.state}/job.sbatch", batch_script(spec, run.state).encode(), 0o700)
        run.submitted_at = time.time()
        run.slurm_id = client.submit(sbatch_argv(spec, run.state, minutes))
        notice(f"submitted Slurm job {run.slurm_id}: the node checks on {spec.nodes} node(s), --time={minutes}")
        waited = wait_job(client, run.slurm_id, timeout_s, notice)
        run.ended_at = time.time()
        if waited.timed_out:
            run.ended = cancel(client, run.slurm_id)
            run.findings.append(timed_out_finding(run, waited, timeout_s, run.ended))
            if waited.ran_s:
                read_replies(client, run, spec.nodes)  # the nodes that did finish still count
            return run
        run.ended = True
        read_replies(client, run, spec.nodes)
        run.findings.append(ok(ALLOC, where, f"Slurm job {run.slurm_id} ran on {len(run.nodes)} node(s) after "
                               f"{waited.queued_s:.1f}s in the queue, for {waited.ran_s:.1f}s",
                               f"ended {waited.state}"))
    except HostError as err:
        refused = "the request does not fit the cluster: check [slurm] partition, account, qos, gpus_per_node, " \
                  "mem, constraint and extra_sbatch"
        run.findings.append(fail(ALLOC, where, f"the node-check job failed: {err.message}",
                                 f"Slurm job {run.slurm_id or '(not submitted)'}",
                                 err.fix or (refused if run.slurm_id is None else "")))
    finally:
        if run.slurm_id is not None and not run.ended:
            cancel(client, run.slurm_id)
        if run.state:
            client.run(["rm", "-rf", "--", run.state], check=False)
    return run


def reprobe_job(client: SlurmClient, spec: SlurmSpec, slurm_id: str, state: str, endpoint: str,
                nodes: Sequence[str], timeout_s: float = REPROBE_TIMEOUT_S) -> ProbeResults:
    """doctor's TCP probe inside a running job's allocation: every node dials the job's rendezvous
    endpoint, held by its store, and every other node. `nodes`: names in task order."""
    replies, errors = on_every_node(client, spec, slurm_id, nodes, "slurm_check", {
        "master": endpoint, "facts": False, "wait": BARRIER_S / 2}, f"{state}/reprobe", timeout_s)
    out = probe_results(list(nodes), replies)
    out.errors.update({name: err.message for name, err in errors.items()})
    return out


# -- the node checks: doctor's own, over the nodes' replies ------------------------------------

def probe_results(nodes: Sequence[str], replies: Mapping[str, Mapping[str, Any]]) -> ProbeResults:
    """The nodes' dials as doctor's probe outcomes (the rendezvous port is the "master_port")."""
    out = ProbeResults()
    if len(replies) < 2:
        out.skipped = {"ephemeral": TOO_FEW, "master_port": TOO_FEW}
        return out
    for name, reply in replies.items():
        probe = reply.get("probe")
        if not isinstance(probe, Mapping):
            out.errors[name] = "the node agent sent no probe results"
            continue
        unseen = [nodes[r] for r in probe.get("missing") or [] if r < len(nodes) and nodes[r] in replies]
        if unseen:
            out.errors[name] = (f"{listing(unseen)} ran but {name} never saw their files: do the nodes share "
                                f"the home directory ({probe.get('dir', 'the job directory')})?")
        for r in probe.get("results") or []:
            rank = int(r.get("rank", -1))
            out.outcomes.append(ProbeOutcome(name, nodes[rank] if 0 <= rank < len(nodes) else str(r.get("hostname")),
                                             str(r.get("hostname")), int(r.get("port") or 0), str(r.get("purpose")),
                                             bool(r.get("ok")), str(r.get("kind")), str(r.get("error") or "")))
    head = replies.get(nodes[0], {}).get("probe") if nodes else None
    rdzv = [x for x in (head or {}).get("listeners") or [] if x.get("purpose") == "master_port"]
    if not nodes or nodes[0] not in replies:
        out.skipped["master_port"] = "the first node did not answer"
    elif rdzv and rdzv[0].get("port") is None:
        out.skipped["master_port"] = f"no free port in the rendezvous range on {nodes[0]}: {rdzv[0].get('error')}"
    return out


def node_findings(run: NodeRun) -> list[Finding]:
    out = []
    for rank, name in enumerate(run.nodes):
        if name in run.failed:
            err = run.failed[name]
            out.append(fail(ALLOC, name, err.message, f"task {rank} of Slurm job {run.slurm_id}",
                            err.fix or "check that python3 (>= 3.8) runs on the node"))
        elif name in run.replies:
            out.append(ok(ALLOC, name, "the node agent answered", f"task {rank} of Slurm job {run.slurm_id}"))
    return out


def node_address(name: str, hf: HostFacts | None) -> str:
    """Where peers reach a node: the first non-loopback address its hostname resolves to there."""
    for entry in (hf.facts.hostname_resolution or ()) if hf is not None else ():
        if not entry.address.startswith("127.") and entry.address != "::1":
            return entry.address
    return name


def node_observations(ctx: DoctorContext, run: NodeRun) -> Observations:
    """Doctor's observations of the allocated nodes (named as Slurm names them, in task order)."""
    facts = {n: parse_facts(n, r, run.submitted_at, run.ended_at) for n, r in run.replies.items()}
    hosts = tuple(replace(h, name=n, address=node_address(n, facts.get(n)))
                  for h, n in zip(ctx.hosts, run.nodes, strict=False))
    ctx = replace(ctx, hosts=hosts, master=hosts[0], master_addr=hosts[0].name,
                  workdirs={h.name: ctx.workdirs[old.name] for h, old in zip(hosts, ctx.hosts, strict=False)})
    return Observations(ctx, facts, run.failed, probe_results(run.nodes, run.replies))


def node_context(job: Job, hosts: tuple[Host, ...], timeout_s: float, use_cache: bool) -> DoctorContext:
    """The context of the node checks before Slurm names the nodes (the launch's node0.., in task order)."""
    return DoctorContext(hosts=hosts, master=hosts[0], master_addr="", master_port=None,
                         workdirs={h.name: job.workdir_for(h) for h in hosts}, script=job.script,
                         env=dict(job.env), nproc_per_node=job.nproc_or_one, rdzv_backend="c10d",
                         timeout_s=timeout_s, use_cache=use_cache, session="Slurm task (srun)",
                         python_key='[slurm] python = "/absolute/path/to/python" (the interpreter on the nodes)')


def node_request(ctx: DoctorContext, base_port: int) -> dict[str, Any]:
    """The facts op's request (task 0's hostname becomes master_addr there), and the probe's."""
    return {**facts_request(ctx, ctx.hosts[0], probe=False), "wait": BARRIER_S,
            "connect_timeout": ctx.connect_timeout_s, "rdzv_base": base_port, "rdzv_spread": SLURM_PORT_SPREAD,
            "rdzv_tries": SLURM_PORT_TRIES}


def node_phase(client: SlurmClient, job: Job, ctrl: Controller, timeout_s: float, use_cache: bool,
               notice: Callable[[str], None]) -> tuple[NodeRun, list[Finding]]:
    """One allocation, then doctor's node checks over what its nodes answered."""
    assert job.slurm is not None
    spec, port = job.slurm, job.rendezvous.master_port
    part = pick_partition(ctrl.partitions, (spec.partition or "").split(",")[0] or None)
    minutes = allocation_minutes(timeout_s, spec.time_s, time_limit_s((part or {}).get("MaxTime")))
    ctx = node_context(job, node_hosts(job, spec), timeout_s, use_cache)
    request = node_request(ctx, port if isinstance(port, int) else DEFAULT_BASE_PORT)
    run = run_allocation(client, spec, request, timeout_s, minutes, controller_host(spec), notice)
    findings = run.findings + node_findings(run)
    if run.replies:
        findings += run_checks(node_observations(ctx, run), Runs.SLURM)
    return run, findings
