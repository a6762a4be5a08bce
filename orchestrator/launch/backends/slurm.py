"""The Slurm backend: one batch job (sbatch) whose one task per node is that node's supervisor;
its output files on the shared filesystem are followed live and decoded exactly as the SSH
backend decodes a node's stream. Slurm commands run here or on the `[slurm] login` node."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from inventory import Host, Job
from inventory.slurm_table import DEFAULT_BASE_PORT, node_hosts, nproc_for
from inventory.specs import SlurmSpec
from node_agent.wire.layout import (
    SLURM_DOWN_MARK,
    SLURM_FOLLOW_PATTERN,
    SLURM_NODE_FILE,
    SLURM_REQUEUE_FILE,
    slurm_state_dir,
)
from node_agent.wire.replies import wire
from orchestrator.checks.model import CheckStatus, ProbeResults
from orchestrator.checks.slurm_nodes import controller_findings, reprobe_job
from orchestrator.errors import HostError
from orchestrator.hostops.slurm_jobs import SLURM_STACKS_TIMEOUT_S
from orchestrator.hostops.stacks import StacksReport, assemble
from orchestrator.launch.backends.base import DetachReport, Emit, Fenced, Notice, Resolved, supervise_request
from orchestrator.launch.backends.node_messages import NodeMessages
from orchestrator.launch.backends.slurm_events import (
    Kind,
    SlurmEvent,
    SlurmSaid,
    down_nodes,
    queue_seconds,
    slurm_event_of,
    slurm_said,
)
from orchestrator.launch.backends.slurm_script import render_batch, sbatch_argv
from orchestrator.launch.events import (
    Alive,
    Ended,
    Exited,
    Lost,
    Milestone,
    Output,
    Problem,
    Reported,
    Scheduled,
    Started,
)
from orchestrator.launch.events import Notice as NoticeEvent
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.plan import LaunchPlan, mask_env
from orchestrator.launch.preflight import ChecksFailed
from orchestrator.launch.signals import stop_signals_deferred
from orchestrator.remote.agent import (
    AgentEvent,
    AgentResult,
    AgentStream,
    agent_payload,
    decode,
    start_agent,
)
from orchestrator.remote.pool import HostPool
from orchestrator.remote.slurm_client import QueuedJob, node_script, on_every_node, slurm_client
from orchestrator.remote.transport import OutputLine
from orchestrator.sync.core import Progress, SyncReport

POLL_S = 1.0  # squeue, while the job runs
WIND_DOWN_S = 120.0  # after the last node ended, how long to wait for Slurm to end the job
RENDEZVOUS_LINE = re.compile(r"rendezvous (?P<endpoint>\S+:\d+)$")  # the batch script's own line
RUN_LINE = re.compile(r"^ddpctl: run (?P<run>\d+) of Slurm job")  # the batch script's first line per run
CLEAN_EXIT_FRESH_S = 1.0  # a clean node exit trusts Slurm's answer this old (N nodes end at once)
SHOW_TRIES, SHOW_RETRY_S = 4, 0.5  # scontrol show job, while slurmctld does not answer


def exit_code_of(show: dict[str, str]) -> int:
    """`scontrol show job`'s ExitCode=code:signal as one exit status (1 when it says nothing)."""
    code, _, sig = show.get("ExitCode", "").partition(":")
    if code.isdigit() and int(code):
        return int(code)
    if sig.isdigit() and int(sig):
        return 128 + int(sig)
    return 1


@dataclass(frozen=True)
class Submission:
    plan: LaunchPlan
    state: str  # the job's directory on the cluster
    slurm_id: str
    record: Path  # slurm.json in the local run directory

    def write_record(self, login: str | None, node_names: dict[str, str]) -> None:
        """What `ddpctl` and the user need to find the job again: ids, where, which node is which."""
        self.record.write_text(json.dumps(
            {"job_id": self.plan.job_id, "slurm_job_id": self.slurm_id, "login": login, "state_dir": self.state,
             "nodes": len(self.plan.hosts), "node_names": node_names}, indent=2))


def batch_request(plan: LaunchPlan, spec: SlurmSpec, options: LaunchOptions) -> dict[str, object]:
    """The one request every node's supervisor reads (its node rank is SLURM_PROCID)."""
    request = replace(supervise_request(plan, plan.hosts[0], options, detach=False), batch=True,
                      node_rank_env="SLURM_PROCID", heartbeat_timeout=0,
                      forward_signals=(spec.signal_name,) if spec.requeue else ())
    return {"op": "supervise", **{k: v for k, v in wire(request).items() if k != "node_rank"}}  # SLURM_PROCID's


class SlurmBackend:
    """Runs a plan as one Slurm job; `ddpctl up`'s supervision sees its nodes as it sees hosts."""

    name = "slurm"

    def __init__(self, pool: HostPool, job: Job) -> None:
        assert job.slurm is not None
        self.spec = job.slurm
        self.client = slurm_client(pool, self.spec.login, job.inventory)
        self.submitted: Submission | None = None
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self.gone = threading.Event()  # the job has left Slurm's running states (or never started)
        self.follower: AgentStream | None = None
        self.requeued: set[int] = set()  # runs that ended for a requeue (ours, an admin's, a preemption)
        self.exited: set[int] = set()  # nodes whose final report came
        self.run = 0  # the run (SLURM_RESTART_COUNT) whose output is newest
        self.batch_run = 0  # the run the batch shell's lines belong to
        self.said: dict[int, list[SlurmSaid]] = {}  # run -> Slurm's own lines in the job's output
        self.ended: SlurmEvent | None = None  # Slurm ended the job for a reason of its own
        self.cancelling = False  # ddpctl asked Slurm to end the job: a CANCELLED state is ours
        self.asked: tuple[float, SlurmEvent | None] | None = None  # the last verdict and when
        self.judging = threading.Lock()  # the follower and a stop may both ask
        self.held: list[tuple[int, int, str]] = []  # (run, node, line): ends told once Slurm says why
        self.final = False  # the job has left Slurm's active states: no more waiting for its word
        self.emit: Emit = lambda _event: None
        self.runs_seen: set[tuple[int, int]] = set()
        self.endpoint: str | None = None  # host:port of the current run's rendezvous (from the batch shell)
        self.node_names: dict[str, str] = {}  # node0.. -> the Slurm node it ran on (last run)
        self.messages: dict[str, NodeMessages] = {}  # node0.. -> its messages decoded (faults reported once)

    # -- before launch ----------------------------------------------------------------------
    def sync(self, job: Job, options: LaunchOptions, progress: Progress) -> SyncReport | None:
        return None  # a Slurm cluster's nodes share its filesystem: the job's directory is there

    def resolve(self, job: Job, options: LaunchOptions, notice: Notice, settle: bool) -> Resolved:
        hosts = node_hosts(job, self.spec)
        port = job.rendezvous.master_port
        nproc = nproc_for(job, self.spec)
        if settle and options.checks:  # doctor's controller checks: the client answers, the request fits
            findings = controller_findings(self.client, self.spec)
            if any(f.status is CheckStatus.FAIL for f in findings):
                raise ChecksFailed(findings)
            for f in findings:
                if f.status is CheckStatus.WARN:
                    fix = f" (fix: {f.fix})" if f.fix else ""
                    notice(f"warning [{f.check}] {f.host or 'slurm'}: {f.message}{fix}")
        return Resolved({h.name: nproc for h in hosts}, port if isinstance(port, int) else DEFAULT_BASE_PORT,
                        hosts)

    def files(self, plan: LaunchPlan, options: LaunchOptions, home: str) -> dict[str, tuple[bytes, int]]:
        """path -> (content, mode) of what the job needs on the cluster."""
        state = slurm_state_dir(home, plan.job_id)
        request = json.dumps(batch_request(plan, self.spec, options)).encode() + b"\n"
        return {
            f"{state}/node.in": (agent_payload() + request, 0o600),  # the job env: never on a command line
            f"{state}/node.sh": (node_script(self.spec).encode(), 0o700),
            f"{state}/job.sbatch": (render_batch(plan, self.spec, state, plan.master_port).encode(), 0o700),
        }

    def dry_run(self, plan: LaunchPlan) -> tuple[list[str], str, dict[str, str]]:
        """The sbatch command, the batch script and the (masked) env that goes to every node in
        its 0600 request."""
        state = slurm_state_dir(self.client.home(), plan.job_id)
        return (sbatch_argv(state, plan.hosts[0].cwd), render_batch(plan, self.spec, state, plan.master_port),
                mask_env(plan.hosts[0].env))

    def submit(self, plan: LaunchPlan, options: LaunchOptions) -> Submission:
        state = slurm_state_dir(self.client.home(), plan.job_id)
        for path, (data, mode) in self.files(plan, options, self.client.home()).items():
            self.client.write(path, data, mode)
        slurm_id = self.client.submit(sbatch_argv(state, plan.hosts[0].cwd))
        run_dir = options.run_dir_of(plan.job_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        sub = Submission(plan, state, slurm_id, run_dir / "slurm.json")
        sub.write_record(self.spec.login, {})
        return sub

    # -- running ----------------------------------------------------------------------------
    def start(self, plan: LaunchPlan, options: LaunchOptions, emit: Emit) -> None:
        """Submit (a refusal raises HostError: nothing was started), then follow in the background."""
        with stop_signals_deferred():  # a Ctrl-C or SIGTERM lands once the job is known and followed
            try:
                sub = self.submit(plan, options)
            except BaseException:
                self.gone.set()
                raise
            with self.lock:
                self.submitted, self.emit = sub, emit
            emit(NoticeEvent(plan.hosts[0].host.name,
                             f"submitted Slurm job {sub.slurm_id} on {self.client.where}; its files: {sub.state}"))
            threading.Thread(target=self._run, args=(sub, emit), daemon=True).start()

    def _run(self, sub: Submission, emit: Emit) -> None:
        try:
            self.follower = start_agent(self.client.transport, "follow",
                                        {"dir": sub.state, "pattern": SLURM_FOLLOW_PATTERN, "poll": 0.2})
        except HostError as exc:
            self.client.cancel(sub.slurm_id)
            self.gone.set()
            for hl in sub.plan.hosts:
                emit(Lost(hl.host.name, f"cannot follow the job's output: {exc.message}"))
            return
        reader = threading.Thread(target=self._follow, args=(sub, self.follower, emit), daemon=True)
        reader.start()
        self._poll(sub, emit, reader)
        self.gone.set()

    def _follow(self, sub: Submission, stream: AgentStream, emit: Emit) -> None:
        names = [hl.host.name for hl in sub.plan.hosts]
        for message in stream.messages():
            if not isinstance(message, AgentEvent):
                continue
            name = str(message.get("name", ""))
            if message.name == "file":
                m = SLURM_REQUEUE_FILE.match(name)
                if m:
                    self.requeued.add(int(m.group("run")))
                continue
            if message.name != "line":
                continue
            text = str(message.get("text", ""))
            if name == "batch.out":
                m = RENDEZVOUS_LINE.search(text)
                if m:
                    with self.lock:
                        self.endpoint = m.group("endpoint")
                m = RUN_LINE.match(text)
                if m:
                    self.batch_run = int(m.group("run"))
                said = self._saw(self.batch_run, text)
                emit(NoticeEvent(names[0], f"slurm: {text}"))
                if said is not None and said.job and self.held:
                    self._release(sub, emit)  # Slurm has said why it ends the job
                continue
            m = SLURM_NODE_FILE.match(name)
            if m and int(m.group("node")) < len(names):
                self._node_line(sub, int(m.group("run")), int(m.group("node")), names, text, emit)

    def _node_line(self, sub: Submission, run: int, node: int, names: Sequence[str], text: str,
                   emit: Emit) -> None:
        host = names[node]
        self.run = max(self.run, run)
        message = decode(OutputLine("stdout", text))
        if isinstance(message, OutputLine):
            self._saw(run, message.text)
            emit(Output(host, (message.text,)))
            return
        event_name = message.name if isinstance(message, AgentEvent) else "result"
        messages = self.messages.setdefault(host, NodeMessages(host, emit))
        decoded = messages.event(message) if isinstance(message, AgentEvent) else None
        phase = decoded.phase if isinstance(decoded, Milestone) else None
        result = messages.result(message) if isinstance(message, AgentResult) else None
        if event_name in ("result", "error") or (phase is not None and phase.error is not None):
            # an end or a failure: first ask whether Slurm itself is ending the run
            clean = result is not None and result.exit_code == 0
            event = None if self.held else self.verdict(sub, run, fresh_s=CLEAN_EXIT_FRESH_S if clean else 0.0)
            if self.held or (event is not None and event.kind is Kind.ENDING and not self.final):
                self.held.append((run, node, text))  # told once Slurm says why (in order)
                return
            if event is not None and event.kind is Kind.REQUEUED:
                if result is not None:  # a requeued run's end is news, never the job's result
                    emit(NoticeEvent(host, f"{host}: run {run} ended (exit {result.exit_code}) for the requeue"))
                return
            if event is not None and event.kind is not Kind.ENDING and result is None:
                return  # a rank that died of what Slurm did (a cancel, a failed node): not a failure
        if result is not None:
            self.exited.add(node)
            emit(Reported(host, result))
            emit(Exited(host, result.exit_code))
        elif event_name == "started":
            if (run, node) not in self.runs_seen:
                self.runs_seen.add((run, node))
                self.node_names[host] = str(message.get("hostname"))
                emit(NoticeEvent(host, f"{host} is {message.get('hostname')} (Slurm job {sub.slurm_id}"
                                       + (f", run {run} after requeue)" if run else ")")))
            emit(Started(host, message.get("log"), message.get("hostname")))
        else:  # an error, a milestone, a sample, a checkpoint; the host is there, whatever it said
            emit(decoded if decoded is not None else Alive(host))

    def _release(self, sub: Submission, emit: Emit) -> None:
        """Slurm has said why it ends the job (or the job has ended): tell what was held, in order."""
        names = [hl.host.name for hl in sub.plan.hosts]
        held, self.held = self.held, []
        for run, node, text in held:
            self._node_line(sub, run, node, names, text, emit)

    def _saw(self, run: int, text: str) -> SlurmSaid | None:
        said = slurm_said(text)
        if said is not None:
            self.said.setdefault(run, []).append(said)
        return said

    def verdict(self, sub: Submission, run: int, fresh_s: float = 0.0) -> SlurmEvent | None:
        """Did Slurm itself end run `run` (a requeue by anyone, a cancel from outside ddpctl, a
        failed node, a time limit)? Asked of Slurm when a node reports an end or a failure, before
        it is told as one; the answer is emitted once (a notice for a requeue, `Ended` otherwise)."""
        with self.judging:
            return self._verdict(sub, run, fresh_s)

    def _verdict(self, sub: Submission, run: int, fresh_s: float) -> SlurmEvent | None:
        if run in self.requeued:
            return SlurmEvent(Kind.REQUEUED, "", run=run)
        if self.ended is not None:
            return self.ended
        if self.cancelling:
            return None  # ddpctl is ending the job: what follows is ours
        if fresh_s and self.asked is not None and time.monotonic() - self.asked[0] < fresh_s:
            return self.asked[1]
        show = self._show(sub)
        down = down_nodes(self.client.show_nodes(show.get("NodeList", ""))) \
            if show.get("JobState") in ("NODE_FAIL", "COMPLETING") else {}
        event = slurm_event_of(sub.slurm_id, show, run, self.said.get(run, []), down)
        if event is not None and event.kind is Kind.CANCELLED:  # by `ddpctl down`? it leaves its mark
            by = self.client.read(f"{sub.state}/{SLURM_DOWN_MARK}")
            event = slurm_event_of(sub.slurm_id, show, run, self.said.get(run, []), down, by.strip() if by else None)
        self.asked = (time.monotonic(), event)
        if event is not None and event.kind is not Kind.ENDING:
            self._record(sub, event, self.emit)
        return event

    def _show(self, sub: Submission) -> dict[str, str]:
        """`scontrol show job`, asked again (bounded) while slurmctld does not answer: a requeue
        misread as the job's own failure would be cancelled."""
        for _ in range(SHOW_TRIES - 1):
            show = self.client.show_job(sub.slurm_id)
            if show:
                return show
            time.sleep(SHOW_RETRY_S)
        return self.client.show_job(sub.slurm_id)

    def _record(self, sub: Submission, event: SlurmEvent, emit: Emit) -> None:
        names = [hl.host.name for hl in sub.plan.hosts]
        if event.kind is Kind.REQUEUED:
            if event.run not in self.requeued:
                self.requeued.add(event.run)
                emit(NoticeEvent(names[0], event.text))
                emit(Scheduled(names[0], "requeued", event.text))
            return
        self.ended = event
        by_node = {node: host for host, node in self.node_names.items()}
        lost = [by_node[n] for n in event.nodes if n in by_node]
        for host in lost:
            emit(Ended(host, event.text, lost=True))
        if not lost:
            emit(Ended(names[0], event.text))

    def _poll(self, sub: Submission, emit: Emit, reader: threading.Thread) -> None:
        names = [hl.host.name for hl in sub.plan.hosts]
        queued_at, said, running = time.monotonic(), "", False
        job: QueuedJob | None = None
        while not self.closed.is_set():
            try:
                job = self.client.job(sub.slurm_id)
            except HostError as exc:
                emit(NoticeEvent(names[0], f"squeue failed: {exc.message}"))
                self.closed.wait(POLL_S)
                continue
            if job is None or not job.active:
                break
            if job.state != "RUNNING":  # queued, completing, requeued: the scheduler vouches for
                for name in names:  # the nodes (not lost: waiting for Slurm)
                    emit(Alive(name))
            if job.queued:  # at first, and again after a requeue
                if running:
                    running, queued_at = False, time.monotonic()
                    if self.runs_seen:  # back in the queue with no node telling why: ask Slurm
                        self.verdict(sub, self.run)
                words = self._queued_words(sub, job)
                if not said:
                    emit(Scheduled(names[0], "queued", words))
                if words != said:
                    said = words
                    emit(NoticeEvent(names[0], f"Slurm job {sub.slurm_id} {words}"))
            elif job.state == "RUNNING" and not running:
                running, said = True, ""
                waited = queue_seconds(self.client.show_job(sub.slurm_id))
                waited = time.monotonic() - queued_at if waited is None else waited
                emit(NoticeEvent(names[0], f"Slurm job {sub.slurm_id} running on {job.nodes} after "
                                           f"{waited:.0f}s in the queue"))
                emit(Scheduled(names[0], "running", job.nodes or ""))
            self.closed.wait(POLL_S)
        self._finish(sub, job, emit, reader)

    def _queued_words(self, sub: Submission, job: QueuedJob) -> str:
        """"queued", with Slurm's reason; a requeued job held until a time says until when."""
        if not job.reason or job.reason == "None":
            return "queued"
        if job.reason == "BeginTime":
            begin = self.client.show_job(sub.slurm_id).get("EligibleTime", "")
            if "T" in begin:
                return f"queued (BeginTime: Slurm holds it until {begin.rpartition('T')[2]})"
        return f"queued ({job.reason})"

    def _finish(self, sub: Submission, job: QueuedJob | None, emit: Emit, reader: threading.Thread) -> None:
        """The job has left the running states: drain its output, then every node not yet
        reported ends with Slurm's word for it."""
        if self.follower is not None:
            try:
                self.follower.send(b"STOP\n")
            except Exception:
                self.follower.abort()
            reader.join(30)
        self.final = True
        self._release(sub, emit)
        show = self.client.show_job(sub.slurm_id)
        state = show.get("JobState") or (job.state if job else "ended")
        reason = show.get("Reason") or (job.reason if job else "")
        code = exit_code_of(show) if state != "COMPLETED" else 0
        event = self.verdict(sub, self.run) if len(self.exited) < len(sub.plan.hosts) else None
        for node, hl in enumerate(sub.plan.hosts):
            if node in self.exited:
                continue
            if event is None:
                why = f"Slurm ended the job ({state}" + (f", {reason}" if reason and reason != "None" else "") + ")"
                emit(Problem(hl.host.name, f"{why} before {hl.host.name} reported"))
            emit(Exited(hl.host.name, code or 1))

    def stop(self, hosts: Sequence[str], force: bool, failed: bool = False) -> None:
        """Slurm stops a job as a whole: scancel (SIGTERM to every node, SIGKILL after KillWait);
        force sends SIGKILL now. A failed job is cancelled the same way (a node's own failed rank
        ends its torchrun at once: node_agent/runtime/supervisor.py)."""
        with self.lock:
            sub = self.submitted
        if sub is None:
            return
        if failed and not force and self.verdict(sub, self.run) is not None:
            return  # Slurm is requeueing the job, or has ended it: never cancel what it does
        self.cancelling = True
        self.client.cancel(sub.slurm_id, "KILL" if force else None)

    def drop(self, host: str) -> None:
        return None  # the scheduler owns the nodes: a lost one ends with the job (scancel)

    def reattach(self, host: str) -> None:
        return None  # the nodes' output comes through files on the shared filesystem: nothing to re-open

    def fence(self, host: Host, job_id: str, grace: float) -> Fenced:
        """Slurm fences its own nodes: the job's allocation has ended (scancel), a node it marked
        down gets no new work, and its slurmd ends what is left of the job when it registers again."""
        raise NotImplementedError(f"{host.name}: Slurm fences its own nodes; the restart loop does not ask")

    def close(self) -> None:
        """Every node has ended: wait (bounded) until Slurm has cleaned the job up too, so that
        nothing of it is left when `ddpctl up` returns."""
        with self.lock:
            submitted = self.submitted is not None
        if submitted:
            self.gone.wait(WIND_DOWN_S)
        self.closed.set()
        if self.submitted is not None:
            self.submitted.write_record(self.spec.login, dict(self.node_names))
        follower = self.follower
        if follower is not None:
            try:
                follower.send(b"STOP\n")
            except Exception:
                follower.abort()

    # -- detached and diagnostics -----------------------------------------------------------
    def detach(self, plan: LaunchPlan, options: LaunchOptions) -> DetachReport:
        try:
            sub = self.submit(plan, options)
        except HostError as exc:
            return DetachReport(failed={plan.hosts[0].host.name: exc})
        return DetachReport(started={hl.host.name: None for hl in plan.hosts}, slurm_job_id=sub.slurm_id)

    def flag(self, host: str, local_rank: int, straggler: bool) -> None:
        """Batch nodes read no control words: their textfiles carry no straggler flag (`up`'s port does)."""

    def stacks(self, plan: LaunchPlan) -> StacksReport:
        """Every rank's stack (py-spy on each node, through srun --overlap in the job's allocation)."""
        with self.lock:
            sub = self.submitted
        names = [hl.host.name for hl in plan.hosts]
        if sub is None:
            return StacksReport(plan.job_id, host_errors={name: "the job was not submitted" for name in names})
        replies, errors = on_every_node(self.client, self.spec, sub.slurm_id, names, "stacks",
                                        {"job": plan.job_id, "python": self.spec.python}, f"{sub.state}/stacks",
                                        SLURM_STACKS_TIMEOUT_S)
        return assemble(plan.job_id, replies, {name: err.message for name, err in errors.items()})

    def reprobe(self, plan: LaunchPlan) -> ProbeResults:
        """doctor's probe in the job's own allocation: every node dials the rendezvous endpoint
        (held by the job's store) and every other node."""
        with self.lock:
            sub, endpoint = self.submitted, self.endpoint
        if sub is None or endpoint is None:
            return ProbeResults(errors={hl.host.name: "the job has not reached its rendezvous" for hl in plan.hosts})
        return reprobe_job(self.client, self.spec, sub.slurm_id, sub.state, endpoint,
                           [hl.host.name for hl in plan.hosts])
