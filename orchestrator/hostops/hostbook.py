"""The ledger read for people and for `up`: one row per host with its state and what it cost the runs
in the quarantine window (`ddpctl hosts`), a release, and the screening of a job's hosts before a
launch (quarantined ones left out, suspect ones named)."""

from __future__ import annotations

import getpass
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from inventory import ConfigError, Host, Inventory, Job
from orchestrator.hostops.ledger import HostRecord, Ledger
from orchestrator.hostops.quarantine import (
    Event,
    EventKind,
    Judgement,
    LedgerState,
    Policy,
    Spent,
    fault_text,
    judge,
    spent,
)


@dataclass(frozen=True)
class HostRow:
    """One host of `ddpctl hosts`."""

    record: HostRecord
    judgement: Judgement
    cost: Spent = field(default_factory=Spent)  # what it cost the runs in the quarantine window

    @property
    def counts(self) -> dict[str, int]:
        """Its events by kind (releases aside), since the ledger began keeping them."""
        out: dict[str, int] = {}
        for e in self.record.events:
            if e.kind is not EventKind.RELEASE:
                out[e.kind.value] = out.get(e.kind.value, 0) + 1
        return out

    @property
    def last(self) -> Event | None:
        """Its newest event that is not a release."""
        return next((e for e in reversed(self.record.events) if e.kind is not EventKind.RELEASE), None)

    def to_json(self) -> dict[str, object]:
        r, j, last = self.record, self.judgement, self.last
        return {"name": r.name, "address": r.address, "hostname": r.hostname, "gpus": r.gpus, "runs": r.runs,
                "first_seen": r.first_seen, "last_seen": r.last_seen, "faults": self.counts,
                "last": None if last is None else {"kind": last.kind.value, "at": last.at, "run_id": last.run_id,
                                                   "detail": last.detail},
                "cost": {"seconds": round(self.cost.seconds, 3), "runs": self.cost.runs},
                "mtbf_s": j.mtbf, "state": j.state.value, "reason": j.reason}


@dataclass
class HostsView:
    path: str
    policy: Policy
    rows: list[HostRow] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def hosts_view(inventory: Inventory | None, ledger: Ledger | None = None, now: float | None = None) -> HostsView:
    """Every host the ledger knows (with an inventory: its hosts, spares included, known or not), with
    what it cost the runs in the quarantine window."""
    ledger = ledger or Ledger()
    now = time.time() if now is None else now
    policy = Policy.of(inventory) if inventory is not None else Policy()
    reading = ledger.read(None if inventory is None else inventory.hosts)
    rows = [HostRow(r, judge(r.events, policy, now, r.costs), spent(r.costs, now - policy.window))
            for r in reading.hosts]
    return HostsView(str(ledger.path), policy, rows, reading.warnings)


@dataclass(frozen=True)
class Released:
    record: HostRecord
    was: Judgement
    warnings: list[str]


def release_host(inventory: Inventory | None, name: str, ledger: Ledger | None = None, how: str = "") -> Released:
    """Record a release of the host named `name` (its name or address); ConfigError when no host,
    or more than one, goes by it."""
    ledger = ledger or Ledger()
    reading = ledger.read(None if inventory is None else inventory.hosts)
    matches = [r for r in reading.hosts if name in (r.name, r.address, r.address.rpartition("@")[2].split(":")[0])]
    if not matches:
        where = f"the inventory {inventory.source}" if inventory is not None and inventory.source else "the ledger"
        known = ", ".join(r.name for r in reading.hosts) or "none"
        raise ConfigError(f"no host {name} in {where} (known: {known})", key="--release",
                          hint="give a host's name or address as `ddpctl hosts` lists it"
                               + ("" if not reading.warnings else f"; {reading.warnings[0]}"))
    if len(matches) > 1:
        raise ConfigError(f"{len(matches)} hosts go by {name}: " + ", ".join(r.address for r in matches),
                          key="--release", hint="name the inventory (-i hosts.toml) or give the address")
    record = matches[0]
    policy = Policy.of(inventory) if inventory is not None else Policy()
    was = judge(record.events, policy, costs=record.costs)
    warnings = ledger.release(record, f"released by {_who()}" + (f" {how}" if how else ""))
    return Released(record, was, reading.warnings + warnings)


def _who() -> str:
    try:
        return f"{getpass.getuser()} on {socket.gethostname()}"
    except (OSError, KeyError):
        return "someone"


def release_command(name: str) -> str:
    return f"ddpctl hosts --release {name}"


def quarantine_line(name: str, reason: str) -> str:
    return f"leaving {name} out: quarantined ({reason}); release it with: {release_command(name)}"


def suspect_line(name: str, reason: str) -> str:
    return f"{name} is suspect ({reason}); it stays in"


@dataclass
class Screening:
    """A job's hosts before a launch: the quarantined ones and the suspect ones (name -> why), and
    the ledger's warnings."""

    quarantined: dict[str, str] = field(default_factory=dict)
    suspect: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def screen(job: Job, hosts: Sequence[Host], ledger: Ledger | None = None, now: float | None = None) -> Screening:
    """What the ledger says of `hosts` (a job's and its spares) under the job's policy: nothing on
    Slurm (its nodes are Slurm's to pick), nothing quarantined when the policy is off."""
    if job.slurm is not None or not hosts:
        return Screening()
    policy = Policy.of(job.inventory, job)
    reading = (ledger or Ledger()).read(hosts)
    out = Screening(warnings=reading.warnings)
    now = time.time() if now is None else now
    for host, record in zip(hosts, reading.hosts, strict=True):
        verdict = judge(record.events, policy, now, record.costs)
        if verdict.state is LedgerState.QUARANTINED:
            out.quarantined[host.name] = verdict.reason or "quarantined"
        elif verdict.state is LedgerState.SUSPECT:
            out.suspect[host.name] = verdict.reason or "suspect"
    return out


def last_fault_text(row: HostRow) -> str:
    last = row.last
    return "" if last is None else f"{last.kind.value}: {fault_text(last)}"

