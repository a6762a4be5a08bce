"""Applying a host's Changes: over SFTP on the host's own SSH connection (paramiko, opened by
fabric), or with plain file operations where the host is this machine. Each file is written to a
temporary name beside its target and renamed over it, so a rank never reads a half-sent file.

Many files (a first copy) go as one tar bundle instead: built once here for every host that needs
the same set, sent over SFTP as one file, and landed by the node agent's `unpack` op (same
temporary names and renames). One file per SFTP round trips costs this machine's CPU per file
and per host; one bundle costs it per byte."""

from __future__ import annotations

import contextlib
import os
import posixpath
import secrets
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import paramiko

from orchestrator.errors import HostError, HostErrorKind
from orchestrator.remote.ssh import SshTransport
from orchestrator.remote.transport import LocalTransport, Transport
from orchestrator.sync.diff import Changes
from orchestrator.sync.source import SourceFile, SourceTree

Sent = Callable[[str, int, int], None]  # (path, bytes sent since the last call, files now landed)
Unpack = Callable[[str], int]  # land the bundle at this path (relative to the root); files landed
BUNDLE_MIN_FILES = 32  # from this many files to send, one tar bundle instead of a put per file
FAILURES = (OSError, paramiko.SSHException, EOFError, tarfile.TarError)  # what a step on a host may raise


class TransferError(Exception):
    """A step of applying a host's changes failed: the path it was at (relative to the root) and
    the error, which over SFTP may be no more than "Failure"."""

    def __init__(self, rel: str, cause: BaseException) -> None:
        super().__init__(f"{rel}: {cause}")
        self.rel = rel
        self.cause = cause


@contextlib.contextmanager
def _at(rel: str) -> Iterator[None]:
    try:
        yield
    except FAILURES as exc:
        raise TransferError(rel, exc) from exc


class Sink(Protocol):
    """A host's copy of the source, addressed by "/"-separated paths relative to its root."""

    def put(self, rel: str, src: SourceFile, sent: Sent) -> None: ...
    def chmod(self, rel: str, mode: int) -> None: ...
    def remove(self, rel: str) -> None: ...
    def mkdir(self, rel: str) -> None: ...
    def rmdir(self, rel: str) -> bool: ...
    def close(self) -> None: ...


def _tmp_name(rel: str) -> str:
    head, name = posixpath.split(rel)
    return posixpath.join(head, f".{name}.ddpctl-{secrets.token_hex(4)}")


class SftpSink:
    def __init__(self, sftp: paramiko.SFTPClient, root: str) -> None:
        self.sftp = sftp
        self.root = root

    def _path(self, rel: str) -> str:
        return posixpath.join(self.root, rel)

    def put(self, rel: str, src: SourceFile, sent: Sent) -> None:
        tmp = self._path(_tmp_name(rel))
        done = 0

        def progress(so_far: int, _total: int) -> None:
            nonlocal done
            sent(rel, so_far - done, 0)
            done = so_far

        try:
            self.sftp.put(str(src.path), tmp, callback=progress, confirm=False)  # the next manifest checks
            self.sftp.chmod(tmp, src.mode)
            self.sftp.utime(tmp, (src.mtime, src.mtime))
            self.sftp.posix_rename(tmp, self._path(rel))
        except BaseException:
            with contextlib.suppress(OSError, paramiko.SSHException):
                self.sftp.remove(tmp)
            raise

    def chmod(self, rel: str, mode: int) -> None:
        self.sftp.chmod(self._path(rel), mode)

    def remove(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):  # another host on the same filesystem was first
            self.sftp.remove(self._path(rel))

    def mkdir(self, rel: str) -> None:
        try:
            self.sftp.mkdir(self._path(rel), 0o755)
        except OSError:
            if not _is_dir(self.sftp, self._path(rel)):
                raise

    def rmdir(self, rel: str) -> bool:
        try:
            self.sftp.rmdir(self._path(rel))
        except OSError:
            return False  # something excluded is still inside (or it is already gone)
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError, paramiko.SSHException, EOFError):
            self.sftp.close()


def _is_dir(sftp: paramiko.SFTPClient, path: str) -> bool:
    try:
        mode = sftp.stat(path).st_mode
    except OSError:
        return False
    return mode is not None and (mode & 0o170000) == 0o040000


class LocalSink:
    def __init__(self, root: str) -> None:
        self.root = Path(root)

    def put(self, rel: str, src: SourceFile, sent: Sent) -> None:
        target = self.root / rel
        tmp = self.root / _tmp_name(rel)
        try:
            shutil.copyfile(src.path, tmp)
            os.chmod(tmp, src.mode)
            os.utime(tmp, (src.mtime, src.mtime))
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        sent(rel, src.size, 0)

    def chmod(self, rel: str, mode: int) -> None:
        os.chmod(self.root / rel, mode)

    def remove(self, rel: str) -> None:
        (self.root / rel).unlink(missing_ok=True)

    def mkdir(self, rel: str) -> None:
        (self.root / rel).mkdir(mode=0o755, exist_ok=True)

    def rmdir(self, rel: str) -> bool:
        try:
            (self.root / rel).rmdir()
        except OSError:
            return False
        return True

    def close(self) -> None:
        return None


def sink_for(transport: Transport, root: str) -> Sink:
    """An SFTP session on the host's SSH connection (the one every other command of the run
    uses), or plain file operations where the host is this machine."""
    if isinstance(transport, LocalTransport):
        return LocalSink(root)
    if not isinstance(transport, SshTransport):
        raise TypeError(f"no file transfer for {type(transport).__name__}")
    try:
        return SftpSink(transport.connection().client.open_sftp(), root)
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise HostError(transport.host.name, HostErrorKind.SYNC, f"the SFTP subsystem did not start: {exc}",
                        "enable it in the host's sshd_config (Subsystem sftp internal-sftp) and "
                        "restart sshd") from None


class Bundles:
    """Tar bundles of files to send, each built once for every host that needs that same set."""

    def __init__(self, tree: SourceTree) -> None:
        self.tree = tree
        self._dir: Path | None = None
        self._made: dict[tuple[str, ...], SourceFile] = {}
        self._lock = threading.Lock()

    def get(self, rels: tuple[str, ...]) -> SourceFile:
        with self._lock:  # the first host builds it; the others wait and reuse it
            made = self._made.get(rels)
            if made is None:
                made = self._made[rels] = self._build(rels)
            return made

    def _build(self, rels: tuple[str, ...]) -> SourceFile:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="ddpctl-sync-"))
        path = self._dir / f"bundle{len(self._made)}.tar"
        with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
            for rel in rels:
                src = self.tree.files[rel]
                info = tarfile.TarInfo(rel)
                info.size, info.mtime, info.mode = src.size, src.mtime, src.mode
                with src.path.open("rb") as f:
                    tar.addfile(info, f)
        return SourceFile(path, path.stat().st_size, 0, 0o600)

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


def apply(changes: Changes, tree: SourceTree, sink: Sink, sent: Sent, bundles: Bundles | None = None,
          unpack: Unpack | None = None) -> int:
    """Make the host's copy match: removals and new directories, then the files (one bundle
    where there are many and `unpack` can land it, else one by one), then modes and emptied
    directories. Returns how many emptied directories were removed. A failed step raises
    TransferError naming its path."""
    for rel in changes.remove:
        with _at(rel):
            sink.remove(rel)
    for rel in changes.mkdirs:
        with _at(rel):
            sink.mkdir(rel)
    if bundles is not None and unpack is not None and len(changes.send) >= BUNDLE_MIN_FILES:
        _send_bundle(changes, bundles, sink, sent, unpack)
    else:
        for rel in changes.send:
            with _at(rel):
                sink.put(rel, tree.files[rel], sent)
            sent(rel, 0, 1)
    for rel in changes.chmod:
        with _at(rel):
            sink.chmod(rel, tree.files[rel].mode)
    return sum(1 for rel in changes.rmdirs if sink.rmdir(rel))


def _send_bundle(changes: Changes, bundles: Bundles, sink: Sink, sent: Sent, unpack: Unpack) -> None:
    bundle = bundles.get(changes.send)
    name = f".ddpctl-bundle-{secrets.token_hex(4)}.tar"
    scale = changes.send_bytes / max(1, bundle.size)  # progress in the files' bytes, not the tar's

    def progress(rel: str, nbytes: int, files: int) -> None:
        sent(rel, round(nbytes * scale), files)

    with _at(name):
        sink.put(name, bundle, progress)  # unpack removes it, whatever happens
    sent(name, 0, unpack(name))
