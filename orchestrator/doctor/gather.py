"""Doctor's two network phases: one facts round trip per host, then the cross-host TCP probe."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from inventory import Host
from node_agent.protocol import parse_line
from orchestrator.agent import call_agent, start_agent
from orchestrator.doctor.model import DoctorContext, HostFacts, ProbeOutcome, ProbeResults
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.hosts import FanOut, HostPool
from orchestrator.transport import RunningCommand, Transport

ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "MASTER_")
LISTEN_START_TIMEOUT_S = 30.0


def facts_request(ctx: DoctorContext, host: Host) -> dict[str, Any]:
    return {
        "python": host.python,
        "workdir": ctx.workdirs.get(host.name),
        "script": ctx.script,
        "master_addr": ctx.master_addr,
        "master_port": ctx.master_port,
        "check_port": host.name == ctx.master.name and ctx.master_port is not None,
        "env_names": sorted(ctx.env),
        "env_prefixes": list(ENV_PREFIXES),
    }


def gather_facts(pool: HostPool, ctx: DoctorContext) -> FanOut[HostFacts]:
    """One agent round trip per host, all hosts in parallel."""
    by_name = {h.name: h for h in ctx.hosts}

    def one(transport: Transport) -> HostFacts:
        host = by_name[transport.host.name]
        sent = time.time()
        reply = call_agent(transport, "facts", facts_request(ctx, host), timeout=ctx.timeout_s)
        received = time.time()
        return HostFacts(host.name, reply.result.get("facts", {}), reply.result.get("errors", {}),
                         sent, received)

    return pool.map(ctx.hosts, one)


@dataclass
class Listener:
    """A running `listen` op: its bound ports and, once closed, the peers that connected."""

    host: str
    running: RunningCommand
    events: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)

    def pump(self) -> None:
        try:
            for line in self.running.lines():
                try:
                    data = parse_line(line.text) if line.stream == "stdout" else None
                except ValueError:
                    data = None
                if data is not None:
                    self.events.put(data)
        finally:
            self.events.put({"event": "eof"})

    def next_event(self, timeout: float) -> dict[str, Any]:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            raise HostError(self.host, HostErrorKind.TIMEOUT,
                            f"the probe listener did not answer within {timeout:.0f}s") from None

    def ports(self, timeout: float) -> dict[int, int | None]:
        """requested port -> bound port (None when binding failed)."""
        event = self.next_event(timeout)
        if event.get("event") != "listening":
            raise HostError(self.host, HostErrorKind.AGENT,
                            f"the probe listener failed to start: {event}")
        return {int(p["requested"]): p.get("port") for p in event.get("ports", [])}

    def close(self, timeout: float = 10.0) -> None:
        self.running.close_stdin()
        if self.running.wait(timeout) is None:
            self.running.abort()


def start_listeners(pool: HostPool, ctx: DoctorContext, hosts: Sequence[Host],
                    ) -> tuple[dict[str, Listener], dict[str, dict[int, int | None]], dict[str, str]]:
    listeners: dict[str, Listener] = {}
    lock = threading.Lock()

    def one(transport: Transport) -> dict[int, int | None]:
        name = transport.host.name
        wanted = [0]
        if name == ctx.master.name and ctx.master_port is not None:
            wanted.append(ctx.master_port)
        running = start_agent(transport, "listen", {"ports": wanted, "timeout": ctx.timeout_s})
        listener = Listener(name, running)
        with lock:
            listeners[name] = listener
        threading.Thread(target=listener.pump, daemon=True).start()
        return listener.ports(LISTEN_START_TIMEOUT_S)

    fan = pool.map(hosts, one)
    return listeners, fan.succeeded, {h: e.message for h, e in fan.failed.items()}


@dataclass(frozen=True)
class Target:
    host: str
    address: str
    port: int
    purpose: str


def probe_address(host: Host, facts: HostFacts | None) -> str:
    """The address peers dial: the source address of this host's route to the master."""
    routes = ((facts.get("resolution") or {}).get("routes") or {}) if facts else {}
    for route in routes.values():
        src = route.get("src") if isinstance(route, dict) else None
        if src and not str(src).startswith("127.") and route.get("type") != "local":
            return str(src)
    return host.address


def plan_targets(ctx: DoctorContext, bound: dict[str, dict[int, int | None]],
                 facts: dict[str, HostFacts], hosts: Sequence[Host]) -> list[Target]:
    targets = []
    for host in hosts:
        ports = bound.get(host.name, {})
        if ports.get(0):
            targets.append(Target(host.name, probe_address(host, facts.get(host.name)),
                                  int(ports[0] or 0), "ephemeral"))
        if ctx.master_port is not None and ports.get(ctx.master_port):
            targets.append(Target(host.name, ctx.master_addr, ctx.master_port, "master_port"))
    return targets


def _bracket(addr: str) -> str:
    return f"[{addr}]" if ":" in addr else addr


def run_connects(pool: HostPool, ctx: DoctorContext, hosts: Sequence[Host],
                 targets: list[Target]) -> ProbeResults:
    out = ProbeResults()

    def one(transport: Transport) -> list[ProbeOutcome]:
        mine = [t for t in targets if t.host != transport.host.name]
        args = {"targets": [f"{_bracket(t.address)}:{t.port}" for t in mine],
                "timeout": ctx.connect_timeout_s}
        reply = call_agent(transport, "connect", args, timeout=ctx.timeout_s)
        results = reply.result.get("results", [])
        return [ProbeOutcome(transport.host.name, t.host, t.address, t.port, t.purpose,
                             bool(r.get("ok")), str(r.get("kind")), str(r.get("error") or ""))
                for t, r in zip(mine, results, strict=False)]

    fan = pool.map(hosts, one)
    for name in (h.name for h in hosts):
        if name in fan.succeeded:
            out.outcomes.extend(fan.succeeded[name])
        elif name in fan.failed:
            out.errors[name] = fan.failed[name].message
    return out


def run_probes(pool: HostPool, ctx: DoctorContext, facts: dict[str, HostFacts],
               notice: Callable[[str], None] = lambda _: None) -> ProbeResults:
    """Every reachable host listens (the master also on the master port), every other connects."""
    hosts = [h for h in ctx.hosts if h.name in facts]
    if len(hosts) < 2:
        return ProbeResults(skipped={"ephemeral": "fewer than two reachable hosts",
                                     "master_port": "fewer than two reachable hosts"})
    notice(f"probing TCP between {len(hosts)} hosts")
    listeners, bound, errors = start_listeners(pool, ctx, hosts)
    try:
        results = run_connects(pool, ctx, hosts, plan_targets(ctx, bound, facts, hosts))
    finally:
        for listener in listeners.values():
            listener.close()
    results.errors.update(errors)
    master_ports = bound.get(ctx.master.name, {})
    if ctx.master_port is None:
        results.skipped["master_port"] = 'master_port = "auto"'
    elif ctx.master.name not in bound:
        results.skipped["master_port"] = f"no listener on {ctx.master.name}"
    elif not master_ports.get(ctx.master_port):
        results.skipped["master_port"] = f"port {ctx.master_port} is busy on {ctx.master.name}"
    return results
