"""The one verdict on who holds the master port: doctor reports its verdict, `up` acts on it."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from orchestrator.remote.wire import MasterPortFact, PortOwner


class Holder(str, enum.Enum):
    FREE = "free"
    STALE = "stale"  # only processes of ddpctl jobs whose supervisor is gone: safe to kill
    LIVE_JOB = "live_job"  # a ddpctl job that still runs
    FOREIGN = "foreign"  # someone else's process
    UNKNOWN = "unknown"  # busy, but the owner is not visible to the agent's user


@dataclass(frozen=True)
class PortVerdict:
    host: str
    port: int
    holder: Holder
    owners: tuple[PortOwner, ...]
    message: str
    evidence: str
    fix: str

    @property
    def blocks_launch(self) -> bool:
        """What `up` refuses to take over without being asked (--free-port frees FOREIGN)."""
        return self.holder in (Holder.LIVE_JOB, Holder.FOREIGN, Holder.UNKNOWN)


def port_verdict(host: str, port: int, fact: MasterPortFact | None) -> PortVerdict:
    """Who holds `port` on `host`, with a message and the fix, from the facts op's master_port."""
    owners = () if fact is None or fact.owners is None else fact.owners
    if fact is None or (fact.bindable and not owners):
        return PortVerdict(host, port, Holder.FREE, (), f"master port {port} is free on {host}", "", "")
    evidence = "; ".join(o.describe() for o in owners) or str(fact.bind_error or "")
    live = [o for o in owners if o.job_live and o.ddpctl_job_id]
    if live:
        job = live[0].ddpctl_job_id
        return PortVerdict(host, port, Holder.LIVE_JOB, owners,
                           f"master port {port} on {host} is used by running ddpctl job {job} "
                           f"({live[0].describe(120)})", evidence,
                           f'ddpctl down {job}, or set master_port = "auto"')
    if owners and all(o.ddpctl_job_id for o in owners):
        jobs = ", ".join(sorted({str(o.ddpctl_job_id) for o in owners}))
        return PortVerdict(host, port, Holder.STALE, owners,
                           f"master port {port} on {host} is held by a stale ddpctl job ({jobs})", evidence,
                           "`ddpctl up` frees it (it kills the stale job's processes)")
    fix = (f"ddpctl kill-port {port} --host {host} (if it is yours), pass --free-port to `ddpctl up`, "
           'or set master_port = "auto" in [rendezvous]')
    if owners:
        who = "; ".join(o.describe(120) for o in owners if not o.ddpctl_job_id)
        return PortVerdict(host, port, Holder.FOREIGN, owners, f"master port {port} on {host} is held by {who}",
                           evidence, fix)
    who = ("in use (this agent cannot list port owners)" if fact.owners is None
           else "in use (owner not visible: run as root or as the owner)")
    # Neither kill-port nor --free-port sees an owner this user cannot see: move, or look as root.
    unseen = (f'set master_port = "auto" in [rendezvous] (or ddpctl up --master-port auto), or look on {host} '
              f'as root: sudo ss -ltnp "sport = :{port}"')
    return PortVerdict(host, port, Holder.UNKNOWN, owners, f"master port {port} on {host} is {who}", evidence, unseen)
