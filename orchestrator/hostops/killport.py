"""Find and free a port on this machine or on inventory hosts, through the node agent."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from inventory import Host
from orchestrator.remote.agent import call_agent
from orchestrator.remote.pool import FanOut, HostPool
from orchestrator.remote.transport import Transport
from orchestrator.remote.wire import PortReport, parse_report


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
