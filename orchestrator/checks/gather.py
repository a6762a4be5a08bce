"""Doctor's network work: one agent session per host that gathers the facts and, in the same
session, listens and dials for the cross-host TCP probe (one round trip of facts, then one probe
phase driven over the session's control channel). A launch holds the sessions open afterwards
and starts each host's torchrun in its own session (`Session.start`)."""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from inventory import Host
from node_agent.wire.layout import DOCTOR_MARKER_PREFIX
from orchestrator.checks.addressing import (
    Addressing,
    HostNet,
    PickedInterfaces,
    addressing_of,
    facts_addressing,
    pick_interfaces,
)
from orchestrator.checks.model import DoctorContext, ProbeOutcome, ProbeResults
from orchestrator.checks.probeplan import dial_plan
from orchestrator.errors import HostError
from orchestrator.remote.agent import AgentEvent, AgentResult, start_agent
from orchestrator.remote.pool import FanOut, HostPool
from orchestrator.remote.session import Session
from orchestrator.remote.transport import Transport
from orchestrator.remote.wire import (
    CheckpointSeen,
    HostFacts,
    MasterRoute,
    ResolutionFact,
    ResolvedAddress,
    parse_facts,
    parse_net,
    parse_settled,
)

ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "MASTER_")


def facts_request(ctx: DoctorContext, host: Host, probe: bool,
                  select: Sequence[str] | None = None, hold: bool = False,
                  extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The facts op's request for one host: doctor's whole set, or the `select`ed sub-facts (the
    launch); with `probe`, listeners for the TCP probe (the master also on the master port).
    master_port None ("auto"): the master picks a free port instead. `hold`: after the facts the
    agent waits for a START line and runs the host's torchrun (see node_agent/ops/facts.py)."""
    is_master = host.name == ctx.master.name and ctx.master_port is not None
    request: dict[str, Any] = {
        "python": host.python,
        "workdir": ctx.workdirs.get(host.name),
        "script": ctx.script,
        "master_addr": ctx.master_addr if ctx.master_given else None,  # else: picked from the routes
        "master_port": ctx.master_port,
        "check_port": is_master,
        "env_names": sorted(ctx.env),
        "env_prefixes": list(ENV_PREFIXES),
        "no_cache": not ctx.use_cache,
        # where the job's processes look for modules (torch_lookup looks torch up as they would)
        "import_env": {k: v for k, v in {**host.env, **ctx.env}.items() if k.startswith("PYTHON")},
    }
    if select is not None:
        request["select"] = list(select)
        request["pick_port"] = host.name == ctx.master.name and ctx.master_port is None
    if ctx.checkpoint_dir is not None and (select is None or "checkpoint" in select):
        # with the probe the session is held: each host's marker stays until close_all, so the
        # hosts can tell whether they share the directory (checkpoint_listings)
        markers = ctx.checkpoint_markers if probe else {}
        request["checkpoint"] = {"dir": ctx.checkpoint_dir, "marker": markers.get(host.name),
                                 "peers": dict(markers)}
    if host.metrics_dir and (select is None or "metrics_dir" in select):
        request["metrics_dir"] = host.metrics_dir  # node_exporter's textfile directory there
    if ctx.max_restarts > 0 and host.name == ctx.hosts[0].name and (select is None or "ddpctl_lookup" in select):
        request["ddpctl_lookup"] = True  # `up --detach` runs the job's restarts from its first host
    if probe:
        request["probe"] = {"ports": [0, ctx.master_port] if is_master else [0],
                            "timeout": ctx.timeout_s * 2}
    if hold:
        request.update(then="supervise", hold_s=ctx.timeout_s * 2)
    request.update(extra or {})  # a launch's own inputs (`prune`: launch/preflight.py)
    return request


@dataclass
class Listening:
    """A host's probe listeners, as it reported them before its facts, with its network."""

    session: Session
    ports: dict[int, int | None]  # requested port -> bound port (None: busy)
    net: HostNet  # its interfaces and routes (and, for a named master_addr, its route's source)
    targets: list[Target] | None = None  # the CONNECT round sent to it (None: not yet)
    sampled: str = ""  # how the round sampled the pairs ("" where it dialled them all)

    @classmethod
    def of(cls, session: Session, event: AgentEvent | AgentResult) -> Listening:
        net = parse_net(session.host, event.get("net"))
        return cls(session, {int(p["requested"]): p.get("port") for p in event.get("ports", [])},
                   HostNet(net.interfaces, net.routes, event.get("source"), event.get("master_ip")))


@dataclass
class Opened:
    """A session that has sent its facts (and, with the probe, listened first)."""

    session: Session
    facts: HostFacts
    listening: Listening | None = None

    @property
    def ports(self) -> dict[int, int | None]:
        return self.listening.ports if self.listening is not None else {}


class ProbeRound:
    """Sends every listening host its CONNECT round once each host has listened or failed, so the
    hosts dial each other while they still gather their facts."""

    def __init__(self, ctx: DoctorContext, job_holds_master: bool) -> None:
        self.ctx = ctx
        self.job_holds_master = job_holds_master
        self.waiting = {h.name for h in ctx.hosts}
        self.listening: dict[str, Listening] = {}
        self.sent = False
        self._lock = threading.Lock()

    def listened(self, host: str, listening: Listening | None) -> None:
        """`host` listened (None: it failed first); the last one to report sends the round."""
        with self._lock:
            if listening is not None:
                self.listening[host] = listening
            self.waiting.discard(host)
            if self.waiting or self.sent:
                return
            self.sent = True
        if len(self.listening) > 1:
            send_round(self.ctx, self.listening, self.job_holds_master)


def open_sessions(pool: HostPool, ctx: DoctorContext, probe: bool,
                  select: Sequence[str] | None = None, hold: bool = False,
                  job_holds_master: bool = False, extra: Mapping[str, Any] | None = None) -> FanOut[Opened]:
    """Start the facts op on every host in parallel and wait for each one's facts (`hold`: the
    sessions then wait for a START, see facts_request). With `probe` the CONNECT round goes out
    as soon as every host has listened (ProbeRound); run_probe collects its results."""
    by_name = {h.name: h for h in ctx.hosts}
    rounds = ProbeRound(ctx, job_holds_master) if probe else None

    def one(transport: Transport) -> Opened:
        host = by_name[transport.host.name]
        listening: Listening | None = None
        try:
            sent = time.time()
            deadline = time.monotonic() + ctx.timeout_s
            session = Session(host.name, start_agent(transport, "facts",
                                                     facts_request(ctx, host, probe, select, hold, extra)))
            threading.Thread(target=session.pump, daemon=True).start()
            try:
                if rounds is not None:
                    listening = Listening.of(session, session.wait_for("listening", deadline))
                    rounds.listened(host.name, listening)
                event = session.wait_for("facts" if probe or hold else "result", deadline)
            except HostError:
                session.running.abort()
                raise
        finally:
            if rounds is not None and listening is None:
                rounds.listened(host.name, None)
        facts = parse_facts(host.name, payload(event), sent, time.time())
        stream = session.running
        return Opened(session, replace(facts, agent_cache=stream.stored or stream.cache), listening)

    return pool.map(ctx.hosts, one)


def payload(message: AgentEvent | AgentResult) -> Mapping[str, Any]:
    """An event's fields, or the result's data."""
    return message.fields if isinstance(message, AgentEvent) else message.data


@dataclass(frozen=True)
class Target:
    host: str
    address: str
    port: int
    purpose: str


def settle_addressing(ctx: DoctorContext, facts: Mapping[str, HostFacts]
                      ) -> tuple[DoctorContext, dict[str, HostFacts], Addressing]:
    """The addressing the probe round used, from the facts (the same tables), and the context and
    facts the checks read: where ddpctl picked master_addr, the context names it and each host's
    facts carry its route there as if the host had resolved it."""
    addressing = facts_addressing(ctx, facts)
    if ctx.master_given or not addressing.picked:  # named, or nothing to pick from: as it was
        return ctx, dict(facts), addressing
    ctx = replace(ctx, master_addr=addressing.master_addr, master_picked=addressing.picked)
    settled = {}
    for name, hf in facts.items():
        route = addressing.routes.get(name)
        resolution = ResolutionFact(
            (ResolvedAddress("inet6" if ":" in ctx.master_addr else "inet", ctx.master_addr),),
            {ctx.master_addr: route.to_fact() if route is not None else
             MasterRoute(error=f"no route to {ctx.master_addr}")})
        settled[name] = replace(hf, facts=replace(hf.facts, resolution=resolution), sent=hf.sent | {"resolution"},
                                errors={k: v for k, v in hf.errors.items() if k != "resolution"})
    return ctx, settled, addressing


def settle_interfaces(ctx: DoctorContext, facts: Mapping[str, HostFacts],
                      addressing: Addressing) -> dict[str, PickedInterfaces]:
    """Per host, the GLOO/NCCL_SOCKET_IFNAME ddpctl sets where the job leaves them unset and the
    library's own choice would fail across hosts (none on one host, or with pick_interfaces off)."""
    if ctx.local_only or len(ctx.hosts) < 2 or not ctx.pick_interfaces:
        return {}
    out = {}
    for host in ctx.hosts:
        hf = facts.get(host.name)
        if hf is None:
            continue
        picked = pick_interfaces(ctx.host_env(host, hf.facts.env or {}), hf, addressing.routes.get(host.name))
        if picked is not None:
            out[host.name] = picked
    return out


def plan_targets(ctx: DoctorContext, listening: Mapping[str, Listening], addressing: Addressing,
                 job_holds_master: bool = False) -> list[Target]:
    """Each host's ephemeral listener at the address it reported (its route's source toward the
    master; the master's own address for the master), and the master port where the probe listens
    on it (or, `job_holds_master`, where the running job's rendezvous store does)."""
    targets = []
    for host in ctx.hosts:
        if host.name not in listening:
            continue
        ports = listening[host.name].ports
        address = addressing.dial.get(host.name, host.address)
        if ports.get(0):
            targets.append(Target(host.name, address, int(ports[0] or 0), "ephemeral"))
        held = job_holds_master and host.name == ctx.master.name
        if ctx.master_port is not None and (ports.get(ctx.master_port) or held):
            targets.append(Target(host.name, address, ctx.master_port, "master_port"))
    return targets


def send_round(ctx: DoctorContext, listening: Mapping[str, Listening], job_holds_master: bool,
               everyone: Mapping[str, Listening] | None = None) -> None:
    """Each listening host dials the others' listeners as the dial plan says (every other host,
    or above probeplan.EXACT_UP_TO hosts a covering sample), one CONNECT line each; the addresses
    come from every host's network (`everyone`: all that listened, default these)."""
    everyone = everyone or listening
    nets = {name: ln.net for name, ln in everyone.items()}
    addressing = addressing_of(ctx, nets)
    targets = plan_targets(ctx, everyone, addressing, job_holds_master)
    names = [h.name for h in ctx.hosts if h.name in everyone]
    plan = dial_plan(names, ctx.master.name, {n: nets[n].subnet(addressing.dial.get(n, "")) for n in names})
    for name, ln in listening.items():
        dials = set(plan.peers.get(name, ()))
        ln.targets = [t for t in targets if t.host != name and t.host in dials]
        ln.sampled = plan.sampled
        ln.session.send("CONNECT", {"targets": [f"{_bracket(t.address)}:{t.port}" for t in ln.targets],
                                    "timeout": ctx.connect_timeout_s})


def _bracket(addr: str) -> str:
    return f"[{addr}]" if ":" in addr else addr


def run_probe(ctx: DoctorContext, opened: dict[str, Opened], job_holds_master: bool = False) -> ProbeResults:
    """Every host dials every other host's listeners at once; results come back as events. The
    round open_sessions sent as the hosts listened is the one read here; where it never went out
    (fewer than two hosts listened, or a host failed before its session started), these hosts get
    one now."""
    out = ProbeResults()
    late = {name: o.listening for name, o in opened.items()
            if o.listening is not None and o.listening.targets is None}
    if late:
        send_round(ctx, late, job_holds_master,
                   {name: o.listening for name, o in opened.items() if o.listening is not None})
    deadline = time.monotonic() + ctx.connect_timeout_s * 2 + 30
    for name, o in opened.items():
        if o.listening is None or o.listening.targets is None:
            continue
        out.sampled = out.sampled or o.listening.sampled
        try:
            results = o.session.wait_for("connected", deadline).get("results", [])
        except HostError as err:
            out.errors[name] = err.message
            continue
        out.outcomes += [ProbeOutcome(name, t.host, t.address, t.port, t.purpose,
                                      bool(r.get("ok")), str(r.get("kind")),
                                      str(r.get("error") or ""), int(r.get("attempts") or 1),
                                      tuple(float(w) for w in r.get("waited_ms") or ()))
                         for t, r in zip(o.listening.targets, results, strict=False)
                         if t.host in opened]  # a host that failed after it listened is reported as such
    master = opened.get(ctx.master.name)
    if ctx.master_port is None:
        out.skipped["master_port"] = 'master_port = "auto"'
    elif master is None:
        out.skipped["master_port"] = f"{ctx.master.name} did not answer"
    elif not master.ports.get(ctx.master_port) and not job_holds_master:
        out.skipped["master_port"] = f"port {ctx.master_port} is busy on {ctx.master.name}"
    return out




def checkpoint_markers(hosts: Sequence[Host]) -> dict[str, str]:
    """For one doctor run, the marker file each host writes in [restart] checkpoint_dir: named
    after the host, with a random part no other run or file has."""
    return {h.name: f"{DOCTOR_MARKER_PREFIX}{re.sub(r'[^A-Za-z0-9._-]+', '_', h.name)[:64]}-{secrets.token_hex(4)}"
            for h in hosts}


def checkpoint_listings(opened: Mapping[str, Opened], timeout: float = 5.0) -> dict[str, HostFacts]:
    """Each host's facts with what it saw of its peers' checkpoint markers, read from its result
    once its session has ended (close_all: every host wrote its marker before any session ended,
    so of two hosts that share the directory, the one that looked first saw the other's). A host
    whose result did not come says why instead."""
    deadline = time.monotonic() + timeout
    out = {}
    for name, o in opened.items():
        fact = o.facts.facts.checkpoint
        if fact is None or not fact.marker:
            out[name] = o.facts
            continue
        try:
            seen = parse_settled(name, payload(o.session.wait_for("result", deadline))) or \
                CheckpointSeen(list_error="the node agent did not say")
        except HostError as err:
            seen = CheckpointSeen(list_error=f"its session ended without a result: {err.message}")
        merged = replace(fact, seen=fact.seen if seen.seen is None else seen.seen,
                         list_error=seen.list_error or fact.list_error,
                         cleanup_error=seen.cleanup_error or fact.cleanup_error)
        out[name] = replace(o.facts, facts=replace(o.facts.facts, checkpoint=merged))
    return out


def close_all(sessions: Sequence[Session], timeout: float = 10.0) -> None:
    """EOF every session first, then wait for them together (not one after another)."""
    for s in sessions:
        s.running.close_stdin()
    deadline = time.monotonic() + timeout
    for s in sessions:
        if s.running.wait(max(0.1, deadline - time.monotonic())) is None:
            s.running.abort()
