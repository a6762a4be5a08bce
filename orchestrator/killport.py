"""Find and free a port on this machine or on inventory hosts, through the node agent."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inventory import Host
from orchestrator.agent import call_agent
from orchestrator.hosts import FanOut, HostPool


@dataclass(frozen=True)
class PortOwner:
    pid: int
    user: str
    command: str
    age_s: float | None
    status: str  # LISTEN, ESTABLISHED, BOUND (udp) ...
    ddpctl_job_id: str | None
    is_torchrun: bool
    refusal: str | None  # why it will not be killed, or None


@dataclass(frozen=True)
class KilledProcess:
    pid: int
    command: str
    signal: str  # the signal that ended it: SIGTERM, or SIGKILL after the grace period
    owner: bool  # held the port itself (False: part of its process tree)


@dataclass(frozen=True)
class PortReport:
    host: str
    port: int
    proto: str
    owners: tuple[PortOwner, ...]
    time_wait: int  # TIME_WAIT sockets with no process
    time_wait_max_s: float
    killed: tuple[KilledProcess, ...] = ()
    refused: tuple[tuple[int, str], ...] = ()
    free_after: bool | None = None  # None: nothing was attempted
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def free(self) -> bool:
        """No process holds the port (TIME_WAIT alone does not stop a SO_REUSEADDR bind)."""
        return self.free_after if self.free_after is not None else not self.owners

    @property
    def killable(self) -> list[PortOwner]:
        return [o for o in self.owners if o.refusal is None]


def parse_report(host: str, r: Mapping[str, Any]) -> PortReport:
    owners = tuple(PortOwner(int(o["pid"]), str(o.get("user")), " ".join(o.get("cmdline") or [o.get("name", "?")]),
                             o.get("age_s"), str(o.get("status")), o.get("ddpctl_job_id"),
                             bool(o.get("is_torchrun")), o.get("refusal"))
                   for o in r.get("owners", []))
    killed = tuple(KilledProcess(int(k["pid"]), str(k.get("cmdline", "")), str(k.get("signal")), bool(k.get("owner")))
                   for k in r.get("killed", []))
    refused = tuple((int(x["pid"]), str(x["reason"])) for x in r.get("refused", []))
    return PortReport(host, int(r["port"]), str(r.get("proto", "tcp")), owners, int(r.get("time_wait", 0)),
                      float(r.get("time_wait_max_s", 0.0)), killed, refused,
                      r.get("free_after") if "killed" in r and not r.get("dry_run") else None, r)


def find_port_owners(pool: HostPool, hosts: Sequence[Host], port: int, proto: str, force: bool) -> FanOut[PortReport]:
    args = {"port": port, "proto": proto, "force": force}
    return pool.map(hosts, lambda t: parse_report(t.host.name, call_agent(t, "port_owners", args).result))


def free_port(pool: HostPool, hosts: Sequence[Host], port: int, proto: str, grace: float, force: bool,
              expect: Mapping[str, list[int]]) -> FanOut[PortReport]:
    """Kill what was confirmed on each host (pids in `expect`), then verify the port is free."""

    def one(t: Any) -> PortReport:
        args = {"port": port, "proto": proto, "grace": grace, "force": force, "dry_run": False,
                "only_ddpctl": False, "expect_pids": expect.get(t.host.name, [])}
        return parse_report(t.host.name, call_agent(t, "kill_port", args, timeout=grace + 60).result)

    return pool.map(hosts, one)
