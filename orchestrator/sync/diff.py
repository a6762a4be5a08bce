"""What one host needs, from the source tree and the host's manifest: pure, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.sync.source import SourceTree


@dataclass(frozen=True)
class Manifest:
    """A host's copy as the node agent's `manifest` op lists it."""

    root: str  # absolute, on the host
    files: Mapping[str, tuple[int, int, int, str | None]] = field(default_factory=dict)  # size, mtime, mode, sha
    dirs: frozenset[str] = frozenset()
    other: frozenset[str] = frozenset()  # symlinks, sockets, devices: never a match for a file

    @classmethod
    def from_reply(cls, reply: Mapping[str, Any]) -> Manifest:
        files = {str(k): (int(v[0]), int(v[1]), int(v[2]), v[3]) for k, v in dict(reply.get("files") or {}).items()}
        return cls(str(reply["root"]), files, frozenset(reply.get("dirs") or ()),
                   frozenset(reply.get("other") or ()))


@dataclass(frozen=True)
class Changes:
    """Applied in this order: removals, new directories, files, modes, then emptied directories."""

    send: tuple[str, ...] = ()
    chmod: tuple[str, ...] = ()  # same contents, other permission bits
    remove: tuple[str, ...] = ()  # files and links the source no longer has
    mkdirs: tuple[str, ...] = ()  # parents first
    rmdirs: tuple[str, ...] = ()  # deepest first; left alone if something excluded is still inside
    send_bytes: int = 0
    unchanged: int = 0

    @property
    def empty(self) -> bool:
        return not (self.send or self.chmod or self.remove or self.mkdirs or self.rmdirs)


def _ancestors_skipped(tree: SourceTree, rel: str) -> bool:
    parts = rel.split("/")
    return any(tree.filter.skips("/".join(parts[:i]), is_dir=True) for i in range(1, len(parts)))


def _kept(tree: SourceTree, rel: str, is_dir: bool) -> bool:
    """An extra path on the host that is not the sync's to remove: excluded or ignored, or one the
    source holds without sending it (the host's copy may be the source itself)."""
    return rel in tree.unsent or tree.filter.skips(rel, is_dir) or _ancestors_skipped(tree, rel)


def diff(tree: SourceTree, remote: Manifest, delete: bool, checksum: bool) -> Changes:
    send: list[str] = []
    chmod: list[str] = []
    unchanged = 0
    for rel, src in sorted(tree.files.items()):
        have = remote.files.get(rel)
        if have is None:
            send.append(rel)
            continue
        size, mtime, mode, sha = have
        same = size == src.size and (sha == tree.sha256(rel) if checksum else mtime == src.mtime)
        if not same:
            send.append(rel)
        elif mode != src.mode:
            chmod.append(rel)
        else:
            unchanged += 1
    in_the_way = sorted(p for p in remote.other if p in tree.dirs)  # a link where a directory goes
    extra: list[str] = []
    rmdirs: list[str] = []
    if delete:
        extra = sorted(p for p in set(remote.files) | remote.other
                       if p not in tree.files and p not in in_the_way and not _kept(tree, p, False))
        rmdirs = sorted((d for d in remote.dirs if d not in tree.dirs and not _kept(tree, d, True)),
                        key=lambda d: (-d.count("/"), d))
    return Changes(
        send=tuple(send), chmod=tuple(chmod), remove=tuple(in_the_way + extra),
        mkdirs=tuple(sorted((d for d in tree.dirs if d not in remote.dirs), key=lambda d: (d.count("/"), d))),
        rmdirs=tuple(rmdirs), send_bytes=sum(tree.files[r].size for r in send), unchanged=unchanged,
    )
