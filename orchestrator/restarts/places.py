"""The places of a job's hosts, pure: hosts left out give their places to spares in inventory order,
else the job shrinks as far as [restart] min_nodes allows, else it cannot go on (NoHosts)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from inventory import Host, Job, Rendezvous


class NoHosts(Exception):
    """Too few hosts are left to go on (no spare, no min_nodes low enough)."""


@dataclass(frozen=True)
class Places:
    """The hosts after some were left out: who is in, the spares left, the spares that came in, and
    the floor the job shrank to (None: it did not shrink)."""

    hosts: list[Host]
    spares: list[Host]
    took: list[Host]
    shrunk_to: int | None = None


def fill(hosts: Sequence[Host], spares: Sequence[Host], out: Collection[str], size: int,
         min_nodes: int | None) -> Places:
    """`hosts` without `out` (names), spares taking the free places up to `size`; NoHosts when fewer
    than `size` are left and min_nodes does not allow as few."""
    left = [h for h in hosts if h.name not in out]
    free = [h for h in spares if h.name not in out]
    took = []
    while len(left) < size and free:
        took.append(free.pop(0))
        left.append(took[-1])
    if len(left) >= size:
        return Places(left, free, took)
    if min_nodes is None or len(left) < min_nodes or not left:
        need = f"[restart] min_nodes = {min_nodes}" if min_nodes is not None else f"all {size}"
        raise NoHosts(f"{len(left)} host(s) left and no spare ({need} needed; add a host with "
                      "spare = true to the inventory, or set [restart] min_nodes)")
    return Places(left, free, took, min_nodes)


def rendezvous_without(job: Job, hosts: Sequence[Host]) -> Rendezvous:
    """The rendezvous of a launch on `hosts`: a master_addr naming a host left out goes (the master
    is then the first host still in)."""
    addr = job.rendezvous.master_addr
    if addr is None:
        return job.rendezvous
    named = job.inventory.get(addr)
    if named is not None and named not in hosts:
        return replace(job.rendezvous, master_addr=None)
    return job.rendezvous
