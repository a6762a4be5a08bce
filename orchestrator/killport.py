"""Find and free a port on this machine or on inventory hosts, through the node agent."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inventory import Host
from orchestrator.agent import call_agent
from orchestrator.hosts import FanOut, HostPool
from orchestrator.transport import Transport


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
    torchrun_agent: int | None = None  # a torchrun worker's agent pid: the kill takes the agent's whole tree


@dataclass(frozen=True)
class KilledProcess:
    pid: int
    command: str
    signal: str  # the signal that ended it: SIGTERM, or SIGKILL after the grace period
    owner: bool  # held the port itself (False: part of its process tree)


@dataclass(frozen=True)
class RefusedProcess:
    pid: int | None  # None: a socket whose process the agent cannot see
    reason: str


@dataclass(frozen=True)
class UnseenSocket:
    """A socket on the port held by a process the agent's user cannot see (another user's)."""

    status: str
    laddr: str
    user: str


@dataclass(frozen=True)
class PortReport:
    host: str
    port: int
    proto: str
    owners: tuple[PortOwner, ...]
    time_wait: int  # TIME_WAIT sockets with no process
    time_wait_max_s: float
    killed: tuple[KilledProcess, ...] = ()
    refused: tuple[RefusedProcess, ...] = ()
    errors: tuple[str, ...] = ()  # signals that could not be sent, processes that survived SIGKILL
    free_after: bool | None = None  # None: nothing was attempted
    unseen: tuple[UnseenSocket, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def free(self) -> bool:
        """No process holds the port (TIME_WAIT alone does not stop a SO_REUSEADDR bind)."""
        return self.free_after if self.free_after is not None else not self.owners and not self.unseen

    @property
    def killable(self) -> list[PortOwner]:
        return [o for o in self.owners if o.refusal is None]


def one_line(argv: Sequence[str]) -> str:
    """A command line for a table cell: arguments joined, newlines and runs of spaces collapsed."""
    return " ".join(" ".join(argv).split())


def parse_report(host: str, r: Mapping[str, Any]) -> PortReport:
    owners = tuple(PortOwner(int(o["pid"]), str(o.get("user")), one_line(o.get("cmdline") or [o.get("name", "?")]),
                             o.get("age_s"), str(o.get("status")), o.get("ddpctl_job_id"),
                             bool(o.get("is_torchrun")), o.get("refusal"), o.get("torchrun_agent"))
                   for o in r.get("owners", []))
    killed = tuple(KilledProcess(int(k["pid"]), one_line([str(k.get("cmdline", ""))]), str(k.get("signal")),
                                 bool(k.get("owner"))) for k in r.get("killed", []))
    refused = tuple(RefusedProcess(None if x.get("pid") is None else int(x["pid"]), str(x["reason"]))
                    for x in r.get("refused", []))
    unseen = tuple(UnseenSocket(str(u.get("status")), str(u.get("laddr")), str(u.get("user")))
                   for u in r.get("unseen", []))
    errors = tuple(f"pid {e.get('pid')}: {e.get('error')}" for e in r.get("errors", []))
    return PortReport(host, int(r["port"]), str(r.get("proto", "tcp")), owners, int(r.get("time_wait", 0)),
                      float(r.get("time_wait_max_s", 0.0)), killed, refused, errors,
                      r.get("free_after") if "killed" in r and not r.get("dry_run") else None, unseen, r)


def find_port_owners(pool: HostPool, hosts: Sequence[Host], port: int, proto: str = "tcp",
                     force: bool = False) -> FanOut[PortReport]:
    """Who holds `port` on each host, each owner annotated with why it would be refused (if it would)."""
    args = {"port": port, "proto": proto, "force": force}
    return pool.map(hosts, lambda t: parse_report(t.host.name, call_agent(t, "port_owners", args).result))


def free_port(pool: HostPool, hosts: Sequence[Host], port: int, proto: str = "tcp", grace: float = 5.0,
              force: bool = False, dry_run: bool = False, only_ddpctl: bool = False,
              expect: Mapping[str, Sequence[int]] | None = None) -> FanOut[PortReport]:
    """Kill the port's holders on each host (only the pids in expect[host] when `expect` is given:
    what the user confirmed), each with its process tree, then verify the port is free."""

    def one(t: Transport) -> PortReport:
        pids = None if expect is None else [int(p) for p in expect.get(t.host.name, ())]
        args = {"port": port, "proto": proto, "grace": grace, "force": force, "dry_run": dry_run,
                "only_ddpctl": only_ddpctl, "expect_pids": pids}
        return parse_report(t.host.name, call_agent(t, "kill_port", args, timeout=grace + 60).result)

    return pool.map(hosts, one)
