"""Bounded state: the oldest run directories removed, on the hosts and here in runs/, never one of a
run that may still run. The hosts prune themselves (node_agent/ops/prune.py: the prune op, or at a
launch the facts op's `prune` sub-fact in the pre-launch round trip); here the same rule
(`node_agent.ops.prunerule.doomed`) judges runs/<id>/ by its run record (runs/<id>/run.json). `ddpctl prune`
and the launch both come through here (docs/running.md, "Run directories")."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inventory import ConfigError, Host, Inventory, load_job
from node_agent.ops.prunerule import RunDir, doomed, newest_entry, process_started, remove, size_of
from node_agent.wire.replies_jobs import PrunedRun, PruneReport
from orchestrator.errors import HostError
from orchestrator.hostops.runrecord import RECORD, RunRecord, read_record
from orchestrator.hostops.targets import inventory_at, require_job_file
from orchestrator.remote.agent import call_agent
from orchestrator.remote.pool import FanOut, HostPool
from orchestrator.remote.wire import decode
from orchestrator.sizes import size_text

HERE = "here"  # this machine's runs/, in reports keyed by host
SUMMARY = "summary.json"  # written here when a run ends (orchestrator/launch/supervise.py)
DETACHED = "detached.json"  # written here by a detached start: {"job_id", "started": {host: pid}}
# A run directory here with neither a record nor a summary may belong to an `up` of an older ddpctl
# that still runs: it is kept while anything in it was written within this long.
UNRECORDED_KEPT_S = 24 * 3600.0
UP_RUNS = "its `up` runs here"  # HereRun.why: the hosts are told to keep it too
PRUNE_TIMEOUT_S = 120.0  # a host's prune op answers within this (a large rmtree on a slow disk)
START_SLACK_S = 2.0  # a record's `started` is written just after its `up` started


@dataclass(frozen=True)
class HereRun:
    """One directory of runs/ here, as the rule judges it."""

    name: str
    started: float  # the record's `started`, else the newest entry's mtime
    running: bool
    why: str = ""  # why it may still run


def up_alive(record: RunRecord) -> bool:
    """The record's `up` still runs on this machine: its pid lives and started no later than the
    record says (a pid reused since is another process)."""
    created = process_started(record.up_pid) if record.up_pid > 0 else None
    return created is not None and (not record.started or created <= record.started + START_SLACK_S)


def _detached_hosts(path: Path, record: RunRecord | None) -> tuple[str, ...]:
    if record is not None and record.hosts:
        return record.hosts
    try:
        data: Any = json.loads((path / DETACHED).read_text())
    except (OSError, ValueError):
        return ()
    started = data.get("started") if isinstance(data, dict) else None
    return tuple(str(h) for h in started) if isinstance(started, dict) else ()


def judge_here(path: Path, record: RunRecord | None, running: Mapping[str, frozenset[str]] | None,
               now: float) -> HereRun:
    """One run directory here: may it still run? Its `up` lives (attached, or this launch's own
    restarts); a detached run without a summary runs until every host it ran on has answered this
    round and none runs it; a directory without a record (an older ddpctl's) until it has a
    summary or has not been written for UNRECORDED_KEPT_S."""
    newest = newest_entry(str(path))
    started = record.started if record is not None and record.started else newest
    ended = (path / SUMMARY).is_file()
    if record is not None and up_alive(record):
        return HereRun(path.name, started, True, UP_RUNS)
    if (record is not None and record.detached) or (path / DETACHED).is_file():
        if ended:
            return HereRun(path.name, started, False)
        hosts = _detached_hosts(path, record)
        asked = running or {}
        if not hosts or any(h not in asked for h in hosts):
            return HereRun(path.name, started, True, "detached: not every host it ran on was asked")
        if any(path.name in asked[h] for h in hosts):
            return HereRun(path.name, started, True, "detached: it runs")
        return HereRun(path.name, started, False)
    if record is None and not ended and now - newest < UNRECORDED_KEPT_S:
        return HereRun(path.name, started, True, "no record nor summary, written within a day")
    return HereRun(path.name, started, False)


def is_ours(path: Path) -> bool:
    """A directory ddpctl wrote here: it holds a run record, a summary or a detached start's record."""
    return not path.is_symlink() and path.is_dir() and any(
        (path / name).is_file() for name in (RECORD, SUMMARY, DETACHED))


def here_runs(runs_dir: Path, running: Mapping[str, frozenset[str]] | None) -> tuple[list[HereRun], int]:
    """(the run directories here, how many entries of runs_dir are not ddpctl's: left alone)."""
    try:
        entries = sorted(runs_dir.iterdir())
    except OSError:
        return [], 0
    now = time.time()
    runs: list[HereRun] = []
    foreign = 0
    for path in entries:
        if not is_ours(path):
            foreign += 1
            continue
        try:
            record = read_record(path / RECORD)
        except ConfigError:  # a record this ddpctl cannot read: whose it is, it cannot tell
            foreign += 1
            continue
        runs.append(judge_here(path, record, running, now))
    return runs, foreign


def live_here(runs_dir: Path) -> list[str]:
    """The runs whose `up` runs on this machine now (a launch's own earlier attempts among them):
    the hosts keep theirs too."""
    runs, _ = here_runs(runs_dir, None)
    return sorted(r.name for r in runs if r.why == UP_RUNS)


def prune_here(runs_dir: Path, keep: int, running: Mapping[str, frozenset[str]] | None = None,
               dry_run: bool = False) -> PruneReport:
    """Remove (dry_run: only name) the directories of all but the newest `keep` runs in runs_dir.
    `running`: what each host that answered this round runs (by run id), for detached runs."""
    runs, foreign = here_runs(runs_dir, running)
    dirs = [RunDir(r.name, r.name, r.started, r.running) for r in runs]
    now = time.time()
    removed: list[PrunedRun] = []
    errors: list[str] = []
    for d in doomed(dirs, keep):
        path = runs_dir / d.name
        size = size_of(str(path))
        problem = None if dry_run else remove(str(path))
        if problem is not None:
            errors.append(f"{d.name}: {problem}")
            continue
        removed.append(PrunedRun(d.name, size, round(max(now - d.newest, 0.0), 1)))
    return PruneReport(str(runs_dir), tuple(removed), len(runs) - len(removed),
                       tuple(sorted(r.name for r in runs if r.running)), foreign, tuple(errors), dry_run)


# -- the hosts --------------------------------------------------------------------------------

def request(keep: int, protect: Iterable[str] = (), dry_run: bool = False) -> dict[str, Any]:
    """The prune op's request (and, at a launch, the facts op's `prune` input)."""
    return {"keep": keep, "protect": sorted(protect), "dry_run": dry_run}


def launch_request(keep_runs: int, runs_dir: Path) -> dict[str, Any]:
    """What a launch asks each host to prune: room for the run it starts (keep_runs - 1 others), and
    never a run whose `up` runs here (a restarted run's earlier attempts)."""
    return request(max(keep_runs - 1, 0), live_here(runs_dir))


def decode_report(host: str, data: Any) -> PruneReport:
    return decode(PruneReport, data, host, "prune reply")


def prune_hosts(pool: HostPool, hosts: Sequence[Host], args: Mapping[str, Any]) -> FanOut[PruneReport]:
    return pool.map(hosts, lambda t: decode_report(
        t.host.name, call_agent(t, "prune", args, timeout=PRUNE_TIMEOUT_S).result))


def running_on(reports: Mapping[str, PruneReport]) -> dict[str, frozenset[str]]:
    return {host: frozenset(r.running) for host, r in reports.items()}


@dataclass(frozen=True)
class PruneOutcome:
    """`ddpctl prune`'s answer: each host's report or error, and this machine's."""

    keep: int
    here: PruneReport
    hosts: dict[str, PruneReport] = field(default_factory=dict)
    failed: dict[str, HostError] = field(default_factory=dict)

    @property
    def reports(self) -> dict[str, PruneReport]:
        return {**self.hosts, HERE: self.here}


def prune_everywhere(pool: HostPool, hosts: Sequence[Host], keep: int, runs_dir: Path,
                     dry_run: bool = False) -> PruneOutcome:
    """The newest `keep` runs kept on every host and here; the hosts first, whose answers say which
    detached runs still run."""
    fan = prune_hosts(pool, hosts, request(keep, live_here(runs_dir), dry_run))
    here = prune_here(runs_dir, keep, running_on(fan.succeeded), dry_run)
    return PruneOutcome(keep, here, dict(fan.succeeded), dict(fan.failed))


# -- how it reads -----------------------------------------------------------------------------

def where_text(host: str, report: PruneReport) -> str:
    return f"here in {report.root}" if host == HERE else f"on {host}"


def summary(host: str, report: PruneReport) -> str | None:
    """One line for what was pruned on a host (None: nothing): `pruned 3 old runs on node1 (120 MB)`."""
    if not report.removed:
        return None
    verb = "would prune" if report.dry_run else "pruned"
    runs = "run" if len(report.removed) == 1 else "runs"
    size = size_text(report.removed_bytes, si=True)
    return f"{verb} {len(report.removed)} old {runs} {where_text(host, report)} ({size})"


def names_text(report: PruneReport, first: int = 5) -> str:
    names = [r.name for r in report.removed]
    return ", ".join(names[:first]) + (f" (+{len(names) - first} more)" if len(names) > first else "")


# -- `ddpctl prune`'s target --------------------------------------------------------------------

@dataclass(frozen=True)
class PruneTarget:
    """Where `ddpctl prune` prunes: an inventory's hosts (a job file's, or -i's; neither: this
    machine), and how many runs it keeps there."""

    inventory: Inventory
    keep: int
    slurm: bool = False  # a job file with [slurm]: its nodes' directories are Slurm's (left alone)


def prune_target(job: str | None, inventory: Path | None, keep: int | None) -> PruneTarget:
    """A job.toml names the inventory (-i overrides it); --keep overrides its keep_runs."""
    if job is not None and not job.endswith(".toml"):
        raise ConfigError(f"{job} is not a job file", key="JOB",
                          hint="give the job.toml whose hosts to prune, or -i hosts.toml")
    if job is not None:
        require_job_file(job)
        spec = load_job(Path(job))
        inv = inventory_at(inventory) if inventory is not None else spec.inventory
        return PruneTarget(inv, keep if keep is not None else inv.keep_runs, spec.slurm is not None)
    inv = inventory_at(inventory)
    return PruneTarget(inv, keep if keep is not None else inv.keep_runs)


def prune_for(target: PruneTarget, pool: HostPool, runs_dir: Path, dry_run: bool) -> PruneOutcome:
    """`ddpctl prune`: every host of the target (none for Slurm's nodes), then this machine."""
    hosts = () if target.slurm else target.inventory.hosts
    return prune_everywhere(pool, hosts, target.keep, runs_dir, dry_run)
