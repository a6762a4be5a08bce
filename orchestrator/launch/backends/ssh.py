"""The SSH backend: one supervised torchrun per host, each over its host's reused connection
(this machine's hosts over the local transport), heartbeats on every control channel.

A launch opens one agent session per host: the pre-launch facts and checks, then (START) the
supervised torchrun in the same session, so a host costs one SSH exec (one login shell, one agent
start) from `ddpctl up` to a running torchrun."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from inventory import Host, Job
from inventory.gpus import check_job_env
from node_agent.wire.replies import wire
from orchestrator.checks.context import from_job
from orchestrator.checks.gather import close_all, open_sessions, run_probe
from orchestrator.checks.model import ProbeResults
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.hostops.stacks import StacksReport, collect
from orchestrator.launch.backends.base import DetachReport, Emit, Fenced, Notice, Resolved, supervise_request
from orchestrator.launch.backends.node_messages import NodeMessages
from orchestrator.launch.events import Alive, Exited, Lost, Output, Reattached, Reported
from orchestrator.launch.faults import HEARTBEAT_EVERY, RETRY_EVERY
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.plan import HostLaunch, LaunchPlan
from orchestrator.launch.preflight import (
    Preflight,
    PruneAsk,
    gather,
    needs_hosts,
    resolve_nprocs,
    settle_master_port,
    static_nprocs,
)
from orchestrator.remote.agent import AgentResult, AgentStream, Batched, call_agent, start_agent
from orchestrator.remote.pool import HostPool
from orchestrator.remote.session import Session
from orchestrator.remote.transport import OutputLine, Transport
from orchestrator.remote.wire import parse_detached, parse_down
from orchestrator.sync.core import Progress, SyncReport, sync_job

REPROBE_TIMEOUT_S = 20.0  # the watchdog's re-probe: each host's session must open within this
DETACH_TIMEOUT_S = 60.0  # a detached start answers once its supervisor has written its state
FENCE_TIMEOUT_S = 30.0  # fencing a lost host reached again: its down op answers within grace + this


@dataclass
class HostLink:
    """One host's connection to its supervisor, across re-attaches: each session is a
    generation; only the current one's messages count."""

    launch: HostLaunch
    messages: NodeMessages  # its messages decoded (each fault reported once, across sessions)
    lock: threading.Lock = field(default_factory=threading.Lock)
    generation: int = 0
    stream: AgentStream | None = None
    committed: int = 0  # the node's log offset after the last batch handed on
    superseded: list[AgentStream] = field(default_factory=list)  # replaced, dropped once `attached`
    reattaching: bool = False
    dropped: bool = False

    @property
    def name(self) -> str:
        return self.launch.host.name

    def current(self, generation: int) -> bool:
        return self.generation == generation and not self.dropped


class SshBackend:
    """Runs a plan over a HostPool: the pre-launch facts round trip, then one agent per host."""

    name = "ssh"

    def __init__(self, pool: HostPool) -> None:
        self.pool = pool
        self.links: dict[str, HostLink] = {}
        self.plan: LaunchPlan | None = None
        self.emit: Emit = lambda event: None
        self.stopping: dict[str, bytes] = {}  # host -> the stop word it has been (or will be) sent
        self.held: dict[str, Session] = {}  # the pre-launch sessions, waiting for their START
        self.lock = threading.Lock()
        self.closed = threading.Event()

    # -- before launch ----------------------------------------------------------------------
    def sync(self, job: Job, options: LaunchOptions, progress: Progress) -> SyncReport | None:
        return sync_job(job, self.pool, progress, keep_out=(options.runs_dir,))

    def resolve(self, job: Job, options: LaunchOptions, notice: Notice, settle: bool) -> Resolved:
        check_job_env(job)  # a CUDA_VISIBLE_DEVICES against a host's gpus selection: before any host
        port = job.rendezvous.master_port
        static = static_nprocs(job) if not settle and isinstance(port, int) and not needs_hosts(job) else None
        if static is not None and isinstance(port, int):
            return Resolved(static, port)  # a dry run needs no host
        pre = gather(job, self.pool, checks=settle and options.checks, hold=settle,
                     prune=PruneAsk(options.runs_dir, notice) if settle else None)
        with self.lock:
            self.held = dict(pre.sessions)
        try:
            return self._resolved(job, pre, options, notice, settle)
        except BaseException:
            self._release()
            raise

    def _resolved(self, job: Job, pre: Preflight, options: LaunchOptions, notice: Notice, settle: bool) -> Resolved:
        if pre.findings:
            took = ", ".join(f"{k.removesuffix('_s')} {v:.2f}s" for k, v in pre.phases.items())
            notice(f"pre-launch checks passed on {len(job.hosts)} host(s) in {sum(pre.phases.values()):.2f}s "
                   f"({took})")
        for finding in pre.warnings:
            notice(f"warning [{finding.check}] {finding.host or 'all hosts'}: {finding.message}"
                   + (f" (fix: {finding.fix})" if finding.fix else ""))
        facts = pre.facts
        nprocs = resolve_nprocs(job, facts)
        port = job.rendezvous.master_port
        addr = pre.addressing.master_addr if pre.addressing is not None else None
        if pre.addressing is not None and pre.addressing.picked:
            notice(f"master_addr {addr}: {pre.addressing.picked}")
        for host, picked in pre.interfaces.items():
            notice(f"{host}: {picked.describe()}")
        env = {host: picked.env for host, picked in pre.interfaces.items()}
        own = dict(pre.addressing.own) if pre.addressing is not None else {}
        if settle:
            return Resolved(nprocs, settle_master_port(job, self.pool, facts, options.free_port, notice),
                            master_addr=addr, env=env, local_addrs=own)
        free = facts[job.master_host.name].facts.free_port
        return Resolved(nprocs, port if isinstance(port, int) else free or 0, master_addr=addr, env=env,
                        local_addrs=own)

    def _take(self, host: str) -> Session | None:
        with self.lock:
            return self.held.pop(host, None)

    def _release(self) -> None:
        """Close the sessions no START will reach: their agents exit, nothing was started."""
        with self.lock:
            sessions, self.held = list(self.held.values()), {}
        close_all(sessions)

    # -- running ----------------------------------------------------------------------------
    def start(self, plan: LaunchPlan, options: LaunchOptions, emit: Emit) -> None:
        self.plan, self.emit = plan, emit
        for launch in plan.hosts:
            link = HostLink(launch, NodeMessages(launch.host.name, emit))
            self.links[launch.host.name] = link
            self._thread(link, "run", self._run_host, plan, link, options, emit)

    def _thread(self, link: HostLink, what: str, body: Callable[..., None], *args: object) -> None:
        """A thread of `link`'s: whatever it raises is reported, never a traceback on stderr and never
        a thread that ends unseen. Its host is lost through the fault model (a link nobody follows
        would never end: issue 54), unless it is over already."""
        def guarded() -> None:
            try:
                body(*args)
            except Exception as exc:
                if self.closed.is_set() or link.dropped:
                    return
                where = traceback.extract_tb(exc.__traceback__)[-1:]
                at = f" at {where[0].filename}:{where[0].lineno}" if where else ""
                self.emit(Lost(link.name, f"ddpctl's {what} of {link.name} failed: {exc!r}{at}; this is a ddpctl "
                                          "bug, please report it"))

        threading.Thread(target=guarded, name=f"ddpctl-{what}-{link.name}", daemon=True).start()

    def _run_host(self, plan: LaunchPlan, link: HostLink, options: LaunchOptions, emit: Emit) -> None:
        name = link.name
        request = wire(supervise_request(plan, link.launch, options, detach=False))
        session = self._take(name)
        try:
            if session is not None:  # the pre-launch session goes on to run torchrun
                session.start(request)
                stream, batches = session.running, session.batches()
            else:
                stream = start_agent(self.pool.transport(link.launch.host), "supervise", request)
                batches = stream.batches()
        except HostError as exc:
            emit(Lost(name, exc.message + (f" (fix: {exc.fix})" if exc.fix else "")))
            return
        except Exception as exc:  # the held session's channel is gone
            emit(Lost(name, f"the connection to {name} closed before its start: {exc!r}"))
            return
        self._attach(link, 0, stream)
        self._follow(link, 0, stream, batches, emit)

    def _attach(self, link: HostLink, generation: int, stream: AgentStream) -> None:
        """`stream` is the link's now: heartbeats go to it, and a stop word asked meanwhile. The
        session it replaces is dropped once the node says the new one has taken over (`attached`):
        dropped earlier, its close could reach the node first and read as our going away."""
        with link.lock:
            old, link.stream = link.stream, stream
            if old is not None and old is not stream:
                link.superseded.append(old)
        with self.lock:
            word = self.stopping.get(link.name)
        if word is not None:  # stopped while it was connecting
            self._send(stream, word)
        self._thread(link, "heartbeats", self._heartbeats, link, generation, stream)

    def _follow(self, link: HostLink, generation: int, stream: AgentStream,
                batches: Iterator[list[Batched]], emit: Emit) -> None:
        """One session's messages as events, until it ends or a newer session replaces it.
        Output is handed on a committed batch at a time (the node's `out` line), so a batch cut
        off with a broken session comes again, whole, from the session that replaces it."""
        name = link.name
        pending: list[str] = []
        result = None
        for batch in batches:
            if not link.current(generation):
                return
            for message in batch:
                if isinstance(message, list):  # a run of program output lines
                    pending.extend(message)
                elif isinstance(message, str):
                    pending.append(message)
                elif isinstance(message, OutputLine):
                    pending.append(message.text)  # the agent's own stderr: shown with the output
                elif isinstance(message, AgentResult):
                    result = link.messages.result(message)
                elif message.name == "out":
                    with link.lock:
                        if link.generation != generation:
                            return
                        link.committed = int(message.get("end") or link.committed)
                        if pending:
                            emit(Output(name, pending))
                    pending = []
                elif message.name == "attached":
                    if generation:
                        with link.lock:
                            old, link.superseded = link.superseded, []
                        for stale in old:
                            threading.Thread(target=stale.abort, daemon=True).start()
                        emit(Reattached(name))
                elif message.name == "heartbeat":
                    emit(Alive(name, message.get("heard_s")))
                elif (event := link.messages.event(message)) is not None:
                    emit(event)
        if not link.current(generation):
            return
        if pending:
            emit(Output(name, pending))
        if result is not None:
            emit(Reported(name, result))
        emit(Exited(name, stream.wait(5.0)))

    def _heartbeats(self, link: HostLink, generation: int, stream: AgentStream) -> None:
        """Each session its own beat: a stuck channel holds up no other host's heartbeats."""
        while not self.closed.wait(HEARTBEAT_EVERY) and link.current(generation):
            try:  # stopping nodes too: their grace period must not look like a loss
                stream.send(b"HEARTBEAT\n")
            except Exception:
                return  # a dead channel shows up as silence (or as its close)

    def reattach(self, host: str) -> None:
        """The host has gone silent: reach it again on a fresh connection (a new TCP connection
        does not inherit the stuck one's retransmission backoff) and take its supervisor's
        output from the last committed batch. Tries until it gets through, the host is dropped
        (lost) or the job is over."""
        link = self.links.get(host)
        if link is None:
            return
        with link.lock:
            if link.reattaching or link.dropped:
                return
            link.reattaching = True
        self._thread(link, "re-attach", self._reattach, link)

    def _reattach(self, link: HostLink) -> None:
        try:
            while not self.closed.is_set() and not link.dropped:
                try:
                    transport = self.pool.transport(link.launch.host)
                    transport.reconnect()
                    with link.lock:
                        if link.dropped:
                            return
                        link.generation += 1
                        generation, offset = link.generation, link.committed
                    assert self.plan is not None  # started
                    stream = start_agent(transport, "attach", {"job_id": self.plan.job_id,
                                                               "node_rank": link.launch.node_rank,
                                                               "offset": offset})
                except Exception:  # the host is still out of reach: try again
                    self.closed.wait(RETRY_EVERY)
                    continue
                self._attach(link, generation, stream)
                with link.lock:
                    link.reattaching = False
                self._follow(link, generation, stream, stream.batches(), self.emit)
                return
        finally:
            with link.lock:
                link.reattaching = False

    @staticmethod
    def _send(stream: AgentStream, word: bytes) -> None:
        try:
            stream.send(word)
        except Exception:
            stream.abort()

    def stop(self, hosts: Sequence[str], force: bool, failed: bool = False) -> None:
        word = b"KILL\n" if force else b"ABORT\n" if failed else b"STOP\n"
        with self.lock:
            for name in hosts:
                self.stopping[name] = word
        for name in hosts:
            link = self.links.get(name)
            stream = link.stream if link is not None else None
            if stream is not None:
                threading.Thread(target=self._send, args=(stream, word), daemon=True).start()

    def flag(self, host: str, local_rank: int, straggler: bool) -> None:
        link = self.links.get(host)
        stream = link.stream if link is not None else None
        if stream is not None:
            word = b"STRAGGLER %d %d\n" % (local_rank, 1 if straggler else 0)
            threading.Thread(target=self._tell, args=(stream, word), daemon=True).start()

    @staticmethod
    def _tell(stream: AgentStream, word: bytes) -> None:
        """A word the job does not depend on: a dead channel shows up as silence, as for heartbeats."""
        with contextlib.suppress(Exception):
            stream.send(word)

    def drop(self, host: str) -> None:
        link = self.links.get(host)
        if link is None:
            return
        with link.lock:
            link.dropped = True
            link.generation += 1  # nothing more from it counts
            stream = link.stream
        if stream is not None:
            threading.Thread(target=stream.abort, daemon=True).start()  # its supervisor ends the job
            # when the heartbeats stop

    def close(self) -> None:
        self.closed.set()
        self._release()

    def fence(self, host: Host, job_id: str, grace: float) -> Fenced:
        transport = self.pool.transport(host)
        transport.reconnect()  # never the connection that was stuck when the host was lost
        request = {"job": job_id, "grace": grace, "by": f"ddpctl up on {socket.gethostname()}, fencing a lost host"}
        stopped = parse_down(call_agent(transport, "down", request, timeout=grace + FENCE_TIMEOUT_S).result, host.name)
        return Fenced(host.name, sum(len(s.terminated) for s in stopped),
                      tuple(pid for s in stopped for pid in s.left))

    # -- detached and diagnostics -----------------------------------------------------------
    def detach(self, plan: LaunchPlan, options: LaunchOptions) -> DetachReport:
        by_name = {hl.host.name: hl for hl in plan.hosts}

        def one(transport: Transport) -> int | None:
            name = transport.host.name
            request = wire(supervise_request(plan, by_name[name], options, detach=True))
            session = self._take(name)
            if session is None:
                return parse_detached(name, call_agent(transport, "supervise", request).result).pid
            try:
                session.start(request)
                result = session.wait_for("result", time.monotonic() + DETACH_TIMEOUT_S)
            except HostError:
                raise
            except Exception as exc:
                raise HostError(name, HostErrorKind.LOST,
                                f"the connection to {name} closed before its start: {exc!r}") from None
            finally:
                close_all([session])
            assert isinstance(result, AgentResult)  # wait_for("result") returns the result
            return parse_detached(name, result.data).pid

        fan = self.pool.map([h.host for h in plan.hosts], one)
        self._release()
        report = DetachReport(dict(fan.succeeded), dict(fan.failed))
        run_dir = options.run_dir_of(plan.job_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "detached.json").write_text(json.dumps(
            {"job_id": plan.job_id, "started": report.started,
             "failed": {k: v.to_json() for k, v in report.failed.items()}}, indent=2, default=str))
        return report

    def stacks(self, plan: LaunchPlan) -> StacksReport:
        return collect(self.pool, [hl.host for hl in plan.hosts], plan.job_id)

    def reprobe(self, plan: LaunchPlan) -> ProbeResults:
        ctx = from_job(plan.job, master_port=plan.master_port, timeout_s=REPROBE_TIMEOUT_S,
                       master_addr=plan.master_addr)
        fan = open_sessions(self.pool, ctx, True, ("resolution",), job_holds_master=True)
        try:
            probes = run_probe(ctx, fan.succeeded, job_holds_master=True)
        finally:
            close_all([o.session for o in fan.succeeded.values()])
        probes.errors.update({name: err.message for name, err in fan.failed.items()})
        return probes
