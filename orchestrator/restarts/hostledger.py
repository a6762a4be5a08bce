"""The host ledger around `up`'s launches (orchestrator/hostops/ledger.py): before a launch, the
quarantined hosts are left out (spares take their places, else the job shrinks to [restart]
min_nodes, else it is refused) and the suspect ones named; after it, what it learned of each host
is recorded: seen, each host lost, each host fault, each hardware line, each straggler; and at the
run's end its time account, with what each host cost it. The ledger never stops a launch: its
troubles are warnings."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from inventory import Host, Job
from orchestrator.account.compute import Account
from orchestrator.errors import LaunchBlocked
from orchestrator.hostops import hostbook
from orchestrator.hostops.ledger import Ledger, Note, Sighting
from orchestrator.hostops.quarantine import EventKind
from orchestrator.launch.result import Finding, RunResult
from orchestrator.restarts.places import NoHosts, Places, fill, rendezvous_without

Say = Callable[[str], None]


def fault_notes(hosts: Mapping[str, Host], lost: Mapping[str, str], faults: Mapping[str, str],
                findings: Sequence[Finding]) -> list[Note]:
    """Each host lost (`lost`: host -> why), each other host fault of the classification (`faults`),
    and each straggler finding that names a host, as ledger notes."""
    notes = [Note(hosts[name], EventKind.LOST, why) for name, why in lost.items() if name in hosts]
    for name, why in faults.items():
        if name in hosts and name not in lost:
            why = why.removeprefix(f"{name}: ")
            kind = EventKind.HARDWARE if why.startswith("hardware error") else EventKind.HOST_FAULT
            notes.append(Note(hosts[name], kind, why))
    for f in findings:
        host = hosts.get(f.host or "")
        if f.kind == "straggler" and host is not None:
            notes.append(Note(host, EventKind.STRAGGLER, f.text, f.at))
    return notes


def record_attempt(job: Job, result: RunResult, lost: Mapping[str, str], faults: Mapping[str, str],
                   ledger: Ledger | None = None) -> list[str]:
    """Record one attempt of `job` (an SSH launch; Slurm's nodes are Slurm's): every host it ran
    on, seen, and its faults; the ledger's warnings."""
    if job.slurm is not None:
        return []
    try:
        hosts = {h.name: h for h in job.inventory.hosts} | {h.name: h for h in job.hosts}
        names = {r.host: r.hostname for r in result.hosts}
        seen = [Sighting(h, names.get(h.name)) for h in job.hosts]
        # a host that only failed to confirm a stop in time (its link in a blip) is not a host fault
        unconfirmed = {r.host for r in result.hosts if r.stop_unconfirmed}
        notes = fault_notes(hosts, {h: why for h, why in lost.items() if h not in unconfirmed}, faults,
                            result.findings)
    except Exception as exc:  # the ledger never stops a launch
        return [f"host ledger: attempt {result.job_id} not recorded ({exc})"]
    return (ledger or Ledger()).record(result.job_id, "up", seen, notes)


def record_account(job: Job, account: Account, ledger: Ledger | None = None) -> list[str]:
    """Record the run's time account (`ddpctl runs` lists it) and what each host of `job` (or of its
    inventory: a spare that took a place) cost it; the ledger's warnings. On Slurm the account is
    kept but no host is charged (its nodes are Slurm's, as in record_attempt)."""
    hosts = [] if job.slurm is not None else [*job.inventory.hosts, *job.hosts]
    return (ledger or Ledger()).record_account(account, hosts)


def record_start(job: Job, run_id: str, ledger: Ledger | None = None) -> list[str]:
    """Record a detached launch (`up --detach`): every host it started on, seen. Its faults happen
    after ddpctl has gone; they reach the ledger only through a run that watches."""
    if job.slurm is not None:
        return []
    return (ledger or Ledger()).record(run_id, "up", [Sighting(h, None) for h in job.hosts])


def screen(job: Job, hosts: Sequence[Host], say: Say, named: set[str], ledger: Ledger | None = None) -> dict[str, str]:
    """The quarantined hosts of `hosts` (name -> why), each said in one line with its release
    command; each suspect one named once (`named`: those said already); the warnings said."""
    try:
        found = hostbook.screen(job, hosts, ledger)
    except Exception as exc:  # the ledger never stops a launch
        say(f"warning: host ledger not read ({exc}); no host is left out for its past faults")
        return {}
    for warning in found.warnings:
        say(f"warning: {warning}")
    for name, why in found.suspect.items():
        if name not in named:
            named.add(name)
            say(hostbook.suspect_line(name, why))
    for name, why in found.quarantined.items():
        say(hostbook.quarantine_line(name, why))
    return {name: f"quarantined ({why})" for name, why in found.quarantined.items()}


def refused(no: NoHosts) -> LaunchBlocked:
    return LaunchBlocked(f"quarantined hosts leave too few to launch: {no}\n  fix: after a repair, release a host "
                         f"with `{hostbook.release_command('HOST')}` (`ddpctl hosts` lists them); or set "
                         "[defaults] quarantine = false in the inventory, or [restart] quarantine = false in the job")


def say_places(places: Places, size: int, say: Say, where: str) -> None:
    for spare in places.took:
        say(f"spare {spare.name} takes a place in {where}")
    if places.shrunk_to is not None:
        say(f"no spare left: the job shrinks to {len(places.hosts)} host(s) of {size} "
            f"([restart] min_nodes = {places.shrunk_to})")


def leave_out_quarantined(job: Job, say: Say, ledger: Ledger | None = None) -> Job:
    """A plain `up` (no restarts): `job` without its quarantined hosts, spares in their places, else
    shrunk to [restart] min_nodes; LaunchBlocked when too few are left."""
    if job.slurm is not None:
        return job
    out = screen(job, [*job.hosts, *job.spares], say, set(), ledger)
    if not out:
        return job
    try:
        places = fill(job.hosts, job.spares, out, len(job.hosts), job.restart.min_nodes)
    except NoHosts as no:
        raise refused(no) from None
    say_places(places, len(job.hosts), say, "this run")
    hosts = tuple(places.hosts)
    return replace(job, hosts=hosts, rendezvous=rendezvous_without(job, hosts))
