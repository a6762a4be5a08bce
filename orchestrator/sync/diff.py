"""What one host needs, from the source tree, the host's manifest and the record of what earlier
syncs of this source put there; pure, no I/O (docs/architecture.md, "Whose a synced path is")."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.sync.source import SourceFile, SourceTree

Listed = tuple[int, int, int, str | None]  # a host file: size, mtime, mode, sha256 (checksum mode)


@dataclass(frozen=True)
class Record:
    """What one source's syncs put in a host's copy: files with the size and mtime they had then,
    and the directories they made (the node agent keeps it in <root>/.ddpctl-sync/)."""

    source: str
    files: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    dirs: frozenset[str] = frozenset()

    @classmethod
    def from_reply(cls, reply: Mapping[str, Any]) -> Record:
        files = {str(k): (int(v[0]), int(v[1])) for k, v in dict(reply.get("files") or {}).items()}
        return cls(str(reply["source"]), files, frozenset(str(d) for d in reply.get("dirs") or ()))


@dataclass(frozen=True)
class Manifest:
    """A host's copy as the node agent's `manifest` op lists it."""

    root: str  # absolute, on the host
    files: Mapping[str, Listed] = field(default_factory=dict)
    dirs: frozenset[str] = frozenset()
    other: frozenset[str] = frozenset()  # symlinks, sockets, devices: never a match for a file
    records: Mapping[str, Record] = field(default_factory=dict)  # source -> its record there
    free_bytes: int | None = None  # on the copy's filesystem
    unwritable: Mapping[str, Any] | None = None  # the node agent's error reply: why nothing can be written

    @classmethod
    def from_reply(cls, reply: Mapping[str, Any]) -> Manifest:
        files = {str(k): (int(v[0]), int(v[1]), int(v[2]), v[3]) for k, v in dict(reply.get("files") or {}).items()}
        records = [Record.from_reply(r) for r in reply.get("records") or ()]
        free = reply.get("free_bytes")
        return cls(str(reply["root"]), files, frozenset(reply.get("dirs") or ()),
                   frozenset(reply.get("other") or ()), {r.source: r for r in records},
                   None if free is None else int(free), reply.get("unwritable") or None)


class Why(str, enum.Enum):
    """Why a path the source has is left as the host has it."""

    CHANGED = "changed on the host since the last sync"
    CREATED = "created on the host"
    OTHER_SOURCE = "written by another source's sync"
    NEWER = "newer on the host than in the source"
    NOT_A_FILE = "not a regular file on the host"
    NOT_A_DIR = "not a directory on the host"


@dataclass(frozen=True)
class Conflict:
    """A path where the source has something and the host keeps its own (never overwritten)."""

    path: str
    why: Why

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "why": self.why.value}


@dataclass(frozen=True)
class Owned:
    """What this source's syncs own on the host once the changes are applied: the record the node
    agent writes (it takes each file's size and mtime from the file itself)."""

    files: tuple[str, ...] = ()
    dirs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Changes:
    """Applied in this order: removals, new directories, files, modes, then emptied directories;
    then the record (`owned`, None when the one there is still right)."""

    send: tuple[str, ...] = ()
    chmod: tuple[str, ...] = ()  # same contents, other permission bits
    remove: tuple[str, ...] = ()  # files an earlier sync put there that the source no longer has
    mkdirs: tuple[str, ...] = ()  # parents first
    rmdirs: tuple[str, ...] = ()  # deepest first; made by a sync and empty once the removals are done
    send_bytes: int = 0
    unchanged: int = 0
    conflicts: tuple[Conflict, ...] = ()  # the source has them; the host's own are kept
    kept: int = 0  # files and links the host made (or changed) that the source does not send
    owned: Owned | None = None

    @property
    def empty(self) -> bool:
        return not (self.send or self.chmod or self.remove or self.mkdirs or self.rmdirs)


@dataclass(frozen=True)
class _Ownership:
    """This source's record on the host (None: none yet) and what other sources' records claim."""

    mine: Record | None
    claimed_files: frozenset[str]
    claimed_dirs: frozenset[str]

    @classmethod
    def of(cls, remote: Manifest, source: str) -> _Ownership:
        others = [r for s, r in remote.records.items() if s != source]
        return cls(remote.records.get(source), frozenset(p for r in others for p in r.files),
                   frozenset(d for r in others for d in r.dirs))

    def synced(self, rel: str, have: Listed) -> bool:
        """The host's file is still the one this source's last sync left there."""
        return self.mine is not None and self.mine.files.get(rel) == (have[0], have[1])

    def may_write(self, rel: str, have: Listed, src: SourceFile) -> bool:
        if self.mine is None:  # the source's paths are the sync's, unless the host wrote later
            return have[1] <= src.mtime
        return self.synced(rel, have)

    def why_not(self, rel: str) -> Why:
        if self.mine is None:
            return Why.NEWER
        if rel in self.mine.files:
            return Why.CHANGED
        return Why.OTHER_SOURCE if rel in self.claimed_files else Why.CREATED


@dataclass
class _Plan:
    send: list[str] = field(default_factory=list)
    chmod: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)
    mkdirs: list[str] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    owned: list[str] = field(default_factory=list)
    blocked: set[str] = field(default_factory=set)  # source directories the host has something else at
    unchanged: int = 0
    kept: int = 0

    def under_blocked(self, rel: str) -> bool:
        parts = rel.split("/")
        return any("/".join(parts[:i]) in self.blocked for i in range(1, len(parts) + 1))


def _ancestors_skipped(tree: SourceTree, rel: str) -> bool:
    parts = rel.split("/")
    return any(tree.filter.skips("/".join(parts[:i]), is_dir=True) for i in range(1, len(parts)))


def _excluded(tree: SourceTree, rel: str, is_dir: bool) -> bool:
    """Not the sync's to remove: excluded or ignored, or a path the source holds without sending
    it (the host's copy may be the source itself)."""
    return rel in tree.unsent or tree.filter.skips(rel, is_dir) or _ancestors_skipped(tree, rel)


def _by_depth(paths: Iterable[str], deepest_first: bool = False) -> list[str]:
    sign = -1 if deepest_first else 1
    return sorted(paths, key=lambda p: (sign * p.count("/"), p))


def _plan_dirs(tree: SourceTree, remote: Manifest, own: _Ownership, plan: _Plan) -> None:
    for d in _by_depth(tree.dirs):
        if d in remote.dirs or plan.under_blocked(d):
            continue
        have = remote.files.get(d)
        if have is not None and own.synced(d, have):  # a file a sync wrote, where a directory goes now
            plan.remove.append(d)
        elif have is not None or d in remote.other:
            plan.conflicts.append(Conflict(d, Why.NOT_A_DIR))
            plan.blocked.add(d)
            continue
        plan.mkdirs.append(d)


def _plan_files(tree: SourceTree, remote: Manifest, own: _Ownership, checksum: bool, plan: _Plan) -> None:
    for rel, src in sorted(tree.files.items()):
        if plan.under_blocked(rel):
            continue
        have = remote.files.get(rel)
        if have is None:
            if rel in remote.other and src.link:
                plan.unchanged += 1  # a link where the source has one: the host's copy is the source itself
            elif rel in remote.other or rel in remote.dirs:
                plan.conflicts.append(Conflict(rel, Why.NOT_A_FILE))
            else:
                plan.send.append(rel)
                plan.owned.append(rel)
            continue
        size, mtime, mode, sha = have
        if size == src.size and (sha == tree.sha256(rel) if checksum else mtime == src.mtime):
            plan.owned.append(rel)  # the source's contents already: the sync's from now on
            if mode != src.mode:
                plan.chmod.append(rel)
            else:
                plan.unchanged += 1
        elif own.may_write(rel, have, src):
            plan.send.append(rel)
            plan.owned.append(rel)
        else:
            plan.conflicts.append(Conflict(rel, own.why_not(rel)))


def _plan_extras(tree: SourceTree, remote: Manifest, own: _Ownership, delete: bool, plan: _Plan) -> None:
    """Host paths the source does not send: removed only when this source's sync put them there."""
    for rel in sorted(set(remote.files) | remote.other):
        if rel in tree.files or rel in tree.dirs:
            continue  # planned above
        have = remote.files.get(rel)
        if have is None or not own.synced(rel, have):
            plan.kept += 1  # the host's own
        elif _excluded(tree, rel, False) or not delete:
            plan.owned.append(rel)  # a sync's, left in place
        elif rel not in own.claimed_files:
            plan.remove.append(rel)


def _emptied_dirs(tree: SourceTree, remote: Manifest, own: _Ownership, delete: bool, plan: _Plan) -> list[str]:
    """Directories a sync made that the source no longer has and that hold nothing once the
    removals are done, deepest first."""
    if not delete or own.mine is None:
        return []
    left = (set(remote.files) | remote.other | remote.dirs) - set(plan.remove)
    rmdirs: list[str] = []
    for d in _by_depth(own.mine.dirs & remote.dirs, deepest_first=True):
        if d in tree.dirs or d in own.claimed_dirs or _excluded(tree, d, True):
            continue
        prefix = d + "/"
        if not any(p.startswith(prefix) for p in left):
            rmdirs.append(d)
            left.discard(d)
    return rmdirs


def _owned(remote: Manifest, own: _Ownership, plan: _Plan, rmdirs: list[str]) -> Owned | None:
    """The record to write after the changes (None: the one there says the same already).
    Directories about to be removed are listed too: the node agent keeps only those still there."""
    dirs = set(plan.mkdirs) | ((own.mine.dirs & remote.dirs) if own.mine else set())
    files = set(plan.owned)
    mine = own.mine
    if (mine is not None and not (plan.send or plan.remove or plan.mkdirs or rmdirs)
            and files == set(mine.files) and dirs == set(mine.dirs)):
        return None
    return Owned(tuple(sorted(files)), tuple(_by_depth(dirs | set(rmdirs))))


def diff(tree: SourceTree, remote: Manifest, delete: bool, checksum: bool, source: str = "") -> Changes:
    """What `source` (its record's key) must do to make the host's copy match `tree`."""
    own = _Ownership.of(remote, source)
    plan = _Plan()
    _plan_dirs(tree, remote, own, plan)
    _plan_files(tree, remote, own, checksum, plan)
    _plan_extras(tree, remote, own, delete, plan)
    rmdirs = _emptied_dirs(tree, remote, own, delete, plan)
    return Changes(
        send=tuple(plan.send), chmod=tuple(plan.chmod), remove=tuple(plan.remove), mkdirs=tuple(plan.mkdirs),
        rmdirs=tuple(rmdirs), send_bytes=sum(tree.files[r].size for r in plan.send), unchanged=plan.unchanged,
        conflicts=tuple(plan.conflicts), kept=plan.kept, owned=_owned(remote, own, plan, rmdirs),
    )
