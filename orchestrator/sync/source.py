"""The sync source on this machine: which files go to the hosts (`exclude`, `.gitignore`, `.git/`)."""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from inventory.specs import SyncSpec
from node_agent.wire.layout import SYNC_RECORD_DIR

# A repository's own data never goes to the hosts, nor do the records of what earlier syncs put in
# a copy (the source may itself be such a copy).
ALWAYS_SKIPPED = (".git/", f"{SYNC_RECORD_DIR}/")


class Filter:
    """Is a path (relative to the source, "/"-separated) left out of the sync? The job's `exclude`
    patterns, then each `.gitignore` from the path's directory up to the source (the deepest
    file with a matching pattern decides, `!` negations included, as git does)."""

    def __init__(self, exclude: tuple[str, ...], gitignore: bool) -> None:
        self.exclude = pathspec.GitIgnoreSpec.from_lines([*ALWAYS_SKIPPED, *exclude])
        self.gitignore = gitignore
        self._ignores: dict[str, pathspec.GitIgnoreSpec] = {}  # directory ("" = source) -> its rules

    def read_gitignore(self, rel_dir: str, path: Path) -> None:
        if not self.gitignore:
            return
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            return
        self._ignores[rel_dir] = pathspec.GitIgnoreSpec.from_lines(lines)

    def skips(self, rel: str, is_dir: bool) -> bool:
        probe = rel + "/" if is_dir else rel
        if self.exclude.match_file(probe):
            return True
        parts = rel.split("/")
        for depth in range(len(parts) - 1, -1, -1):
            spec = self._ignores.get("/".join(parts[:depth]))
            if spec is None:
                continue
            inner = "/".join(parts[depth:]) + ("/" if is_dir else "")
            verdict = spec.check_file(inner).include
            if verdict is not None:
                return verdict
        return False


@dataclass(frozen=True)
class SourceFile:
    path: Path
    size: int
    mtime: int  # whole seconds: what SFTP (v3) can set on the other end
    mode: int
    link: bool = False  # a symlink to a file in the source (the file's contents are sent)


@dataclass
class SourceTree:
    """What a host's copy must hold. `skipped_links` are symlinks to directories (not followed);
    `unsent` are all the paths the source holds but does not send (those links, dangling links,
    sockets, ...): a host's copy may be the source itself, so they are never removed there."""

    root: Path
    files: dict[str, SourceFile] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    skipped_links: list[str] = field(default_factory=list)
    unsent: set[str] = field(default_factory=set)
    filter: Filter = field(default_factory=lambda: Filter((), True))
    _digests: dict[str, str] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files.values())

    def sha256(self, rel: str) -> str:
        """The file's SHA-256, computed once however many hosts ask."""
        if rel not in self._digests:
            digest = hashlib.sha256()
            with self.files[rel].path.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            self._digests[rel] = digest.hexdigest()
        return self._digests[rel]


def anchored(src: Path, paths: tuple[Path, ...]) -> tuple[str, ...]:
    """Exclude patterns for local directories that lie inside the source (ddpctl's own run logs)."""
    out = []
    for path in paths:
        try:
            rel = path.resolve().relative_to(src)
        except ValueError:
            continue
        if rel != Path("."):
            out.append("/" + re.sub(r"([\\*?\[\]!# ])", r"\\\1", rel.as_posix()) + "/")
    return tuple(out)


def scan(spec: SyncSpec, keep_out: tuple[Path, ...] = ()) -> SourceTree:
    """Walk the source once. A symlink to a file sends the file it points at; a symlink to a
    directory is not followed (it is reported). `keep_out`: local directories never sent (and
    never removed on the hosts), e.g. the runs directory when it lies inside the source."""
    filt = Filter(spec.exclude + anchored(spec.src, keep_out), spec.gitignore)
    tree = SourceTree(root=spec.src, filter=filt)
    for dirpath, dirnames, filenames in os.walk(spec.src):
        here = Path(dirpath)
        rel_dir = here.relative_to(spec.src).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        if ".gitignore" in filenames:
            filt.read_gitignore(prefix.rstrip("/"), here / ".gitignore")
        keep = []
        for name in sorted(dirnames):
            rel = prefix + name
            if filt.skips(rel, is_dir=True):
                continue
            if (here / name).is_symlink():
                tree.skipped_links.append(rel)
                tree.unsent.add(rel)
                continue
            tree.dirs.add(rel)
            keep.append(name)
        dirnames[:] = keep
        for name in sorted(filenames):
            rel = prefix + name
            if filt.skips(rel, is_dir=False):
                continue
            try:
                link = (here / name).is_symlink()
                st = (here / name).stat()  # follows a link to a file
            except OSError:
                tree.unsent.add(rel)  # a dangling link, or gone while we walked
                continue
            if stat.S_ISREG(st.st_mode):
                tree.files[rel] = SourceFile(here / name, st.st_size, int(st.st_mtime), stat.S_IMODE(st.st_mode),
                                             link)
            else:
                tree.unsent.add(rel)
    return tree
