"""Runs' time accounts for the ledger, `ddpctl runs` and the report tests: built by hand, parts that
add up, each loss kind and host named so a page or a table can be searched for them."""

from __future__ import annotations

from inventory import Host
from orchestrator.account.compute import Account, Part, Redone

NODE0 = Host("node0", "198.18.0.10")
NODE1 = Host("node1", "198.18.0.11")
NODE2 = Host("node2", "198.18.0.12")
HOSTS = (NODE0, NODE1, NODE2)


def account(run_id: str, started: float, wall: float = 600.0, *, node1: float = 0.0, node0: float = 0.0,
            startup: float = 20.0, outcome: str = "ok", job: str = "train") -> Account:
    """A run of `wall` seconds: `startup` s of start-up, `node1` s lost to node1 (detection, then
    relaunch), `node0` s of straggler time on node0, 5 s shutdown; the rest productive."""
    parts = [Part("start-up", startup, None, "start-up"), Part("shutdown", 5.0, None, "finishing")]
    if node1:
        parts += [Part("detection", node1 * 0.75, "node1", "lost"), Part("relaunch", node1 * 0.25, "node1", "lost")]
    if node0:
        parts += [Part("straggler", node0, "node0", "straggler")]
    productive = wall - sum(p.seconds for p in parts)
    return Account(run_id, job, started, started + wall, productive,
                   tuple(sorted(parts, key=lambda p: -p.seconds)), Redone(False), 2 if node1 else 1, outcome,
                   restarted=bool(node1))
