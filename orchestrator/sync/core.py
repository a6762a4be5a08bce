"""`ddpctl sync` and the first step of `up` with [sync]: scan the source once, list every host's
copy with the node agent (one round trip), send only what differs and remove only what an earlier
sync put there (orchestrator/sync/diff.py), in parallel over the hosts' SSH connections, then have
the node agent record what the copy now holds from this source. Progress goes to a callback; the
outcome is a SyncReport (host -> result or error: partial failure is data)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from inventory import ConfigError, Job
from orchestrator.errors import HostError
from orchestrator.remote.agent import call_agent
from orchestrator.remote.pool import HostPool
from orchestrator.remote.transport import Transport
from orchestrator.sync.diff import Changes, Manifest, Owned, diff
from orchestrator.sync.failures import cannot_write, explain, refused
from orchestrator.sync.source import SourceTree, scan
from orchestrator.sync.transfer import Bundles, TransferError, apply, sink_for

MANIFEST_TIMEOUT_S = 300.0  # a checksum listing reads every file of the copy
UNPACK_TIMEOUT_S = 600.0  # writing a first copy of a large project on a slow disk


@dataclass(frozen=True)
class SyncPlanned:
    host: str
    root: str  # the host's copy, absolute
    changes: Changes


@dataclass(frozen=True)
class SyncSent:
    host: str
    path: str
    nbytes: int  # of the files' contents, since the last SyncSent of this host
    files: int = 0  # files that have now landed (0 while one is on its way)


@dataclass(frozen=True)
class HostSync:
    host: str
    root: str
    changes: Changes
    removed_dirs: int = 0
    duration_s: float = 0.0
    dry_run: bool = False

    def to_json(self) -> dict[str, object]:
        c = self.changes
        return {"host": self.host, "root": self.root, "dry_run": self.dry_run, "sent": list(c.send),
                "sent_bytes": c.send_bytes, "removed": list(c.remove), "chmod": list(c.chmod),
                "new_dirs": list(c.mkdirs), "removed_dirs": self.removed_dirs, "unchanged": c.unchanged,
                "conflicts": [x.to_json() for x in c.conflicts], "kept": c.kept,
                "duration_s": round(self.duration_s, 3)}


SyncEvent = SyncPlanned | SyncSent | HostSync
Progress = Callable[[SyncEvent], None]


@dataclass
class SyncReport:
    source: Path
    files: int  # in the source, after exclusions
    total_bytes: int
    skipped_links: list[str] = field(default_factory=list)
    synced: dict[str, HostSync] = field(default_factory=dict)
    failed: dict[str, HostError] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_json(self) -> dict[str, object]:
        return {"source": str(self.source), "files": self.files, "bytes": self.total_bytes,
                "skipped_links": self.skipped_links, "ok": self.ok,
                "hosts": {name: r.to_json() for name, r in self.synced.items()},
                "failed": {name: e.to_json() for name, e in self.failed.items()}}


def _ignore(_event: SyncEvent) -> None:
    return None


def _check_entrypoint(job: Job, tree: SourceTree) -> None:
    """The job's script must be among the files sent, or every host would run a stale copy."""
    if job.script is None or job.sync is None:
        return
    path = (job.base_dir / job.script).resolve()
    try:
        rel = path.relative_to(job.sync.src).as_posix()
    except ValueError:
        raise ConfigError(f"job.script {path} is outside the sync source {job.sync.src}", file=job.source,
                          key="sync.src", hint="set [sync] src to a directory that holds the script") from None
    if rel not in tree.files:
        raise ConfigError(f"job.script {rel} is left out of the sync by exclude or .gitignore", file=job.source,
                          key="sync.exclude", hint="remove the pattern that matches it (or add a ! rule "
                          "to the .gitignore)")


def source_key(job: Job) -> str:
    """The key of this source's record on the hosts: its absolute path on this machine (job files
    that sync the same directory share a record; another directory to the same root has its own)."""
    assert job.sync is not None
    return str(job.sync.src)


def sync_job(job: Job, pool: HostPool, progress: Progress | None = None, *, dry_run: bool = False,
             keep_out: tuple[Path, ...] = ()) -> SyncReport:
    """Make every host's copy match the source (`dry_run`: only say what would change).
    `keep_out`: local directories inside the source that never go (ddpctl's runs directory)."""
    spec = job.sync
    if spec is None:
        raise ConfigError("the job file has no [sync] table", file=job.source, key="sync",
                          hint='add  [sync]  (the job file\'s directory goes to every host), '
                               'e.g. with  exclude = ["data/"]')
    tell = progress or _ignore
    tree = scan(spec, keep_out)
    _check_entrypoint(job, tree)
    report = SyncReport(spec.src, len(tree.files), tree.total_bytes, list(tree.skipped_links))
    bundles = Bundles(tree)
    source = source_key(job)

    def one(transport: Transport) -> HostSync:
        host = transport.host
        started = time.monotonic()
        reply = call_agent(transport, "manifest", {"root": job.sync_root(host), "create": not dry_run,
                                                   "checksum": spec.checksum}, timeout=MANIFEST_TIMEOUT_S)
        if reply.result.get("error"):
            raise refused(host.name, reply.result)
        remote = Manifest.from_reply(reply.result)
        changes = diff(tree, remote, spec.delete, spec.checksum, source)
        tell(SyncPlanned(host.name, remote.root, changes))
        removed_dirs = 0
        if not dry_run:
            blocked = cannot_write(host.name, remote, changes)
            if blocked is not None:
                raise blocked
            removed_dirs = _apply(transport, remote, changes, tree, bundles, tell)
            if changes.owned is not None:
                _record(transport, remote.root, source, changes.owned)
        done = HostSync(host.name, remote.root, changes, removed_dirs, time.monotonic() - started, dry_run)
        tell(done)
        return done

    try:
        fan = pool.map(job.hosts, one)
    finally:
        bundles.close()
    report.synced, report.failed = fan.succeeded, fan.failed
    return report


def _apply(transport: Transport, remote: Manifest, changes: Changes, tree: SourceTree, bundles: Bundles,
           tell: Progress) -> int:
    """Send, remove and make what `changes` says on one host; how many emptied directories went."""
    host = transport.host.name
    if changes.empty:
        return 0

    def unpack(archive: str) -> int:
        landed = call_agent(transport, "unpack", {"root": remote.root, "archive": archive},
                            timeout=UNPACK_TIMEOUT_S).result
        if landed.get("error"):
            raise refused(host, landed)
        return int(landed.get("files") or 0)

    def sent(rel: str, nbytes: int, files: int) -> None:
        tell(SyncSent(host, rel, nbytes, files))

    sink = sink_for(transport, remote.root)
    try:
        return apply(changes, tree, sink, sent, bundles, unpack)
    except TransferError as failed:
        raise explain(transport, remote.root, failed) from None
    finally:
        sink.close()


def _record(transport: Transport, root: str, source: str, owned: Owned) -> None:
    """The node agent records what this source's syncs now own in the host's copy."""
    reply = call_agent(transport, "unpack", {"root": root, "record": {
        "source": source, "files": list(owned.files), "dirs": list(owned.dirs)}}, timeout=MANIFEST_TIMEOUT_S)
    if reply.result.get("error"):
        raise refused(transport.host.name, reply.result)
