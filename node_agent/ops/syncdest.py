"""A sync destination on this host: what it holds (`manifest`: every file with its size,
modification time and mode, SHA-256 on request, in one round trip instead of an SFTP listing per
directory, and the records of what earlier syncs put there), and the writes SFTP cannot do or
cannot explain (`unpack`: land a tar bundle of many files sent in one piece, write a source's
record, or try a write where SFTP said only "Failure").

The record: `<root>/.ddpctl-sync/<digest of the source>.json`, one per source that syncs this
root, written atomically after each successful sync. It lists the files (size, mtime as they were
then) and the directories that source's syncs made; the sender removes nothing it does not list.
`.ddpctl-sync/` is never listed nor synced."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
import tarfile
import time

from node_agent.wire.layout import SYNC_RECORD_DIR

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, BinaryIO, Dict, List, Optional

CHUNK = 1 << 20
RECORD_VERSION = 1


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _root(request: Dict[str, Any]) -> str:
    return os.path.abspath(os.path.expanduser(str(request["root"])))


def os_error(path: str, exc: OSError, doing: str = "write to") -> Dict[str, Any]:
    """An error reply naming the path and the OS's own words ("Read-only file system")."""
    code = exc.errno or 0
    text = exc.strerror or str(exc)
    return {"error": "cannot %s %s: %s" % (doing, path, text), "path": path,
            "errno": errno.errorcode.get(code, str(code)), "strerror": text, "exit_code": 2}


def free_bytes(path: str) -> Optional[int]:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def try_write(directory: str) -> Optional[OSError]:
    """Create, write and remove a small file in `directory` (made if missing); the OSError, if any."""
    tmp = os.path.join(directory, ".probe.ddpctl-%s" % os.urandom(4).hex())  # hosts may share the disk
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(b"ddpctl")
            f.flush()
    except OSError as exc:
        return exc
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return None


def manifest(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    """{"root": absolute path, "exists", "files": {relpath: [size, mtime_s, mode, sha256|None]},
    "dirs": [relpath], "other": [relpath], "records": [record], "free_bytes"}. `root` may be
    relative (to the home directory) or start with "~"; `create` makes it (and its parents) and
    tries writing a file there: "unwritable" is then null, or the OS's reason (a copy that is
    already up to date needs no write). Symlinks are not followed: a link is listed under "other",
    as are sockets and devices."""
    root = _root(request)
    checksum = bool(request.get("checksum"))
    if not os.path.lexists(root):
        if not request.get("create"):
            return {"root": root, "exists": False, "files": {}, "dirs": [], "other": [], "records": []}
        try:
            os.makedirs(root, mode=0o755, exist_ok=True)
        except OSError as exc:
            return dict(os_error(root, exc, "create"), root=root, exists=False)
    if not os.path.isdir(root):
        return {"root": root, "exists": False, "error": "%s exists and is not a directory" % root,
                "exit_code": 2}
    failed = try_write(os.path.join(root, SYNC_RECORD_DIR)) if request.get("create") else None
    listing = _walk(root, checksum)
    listing.update(root=root, exists=True, records=read_records(root), free_bytes=free_bytes(root),
                   unwritable=None if failed is None else os_error(root, failed))
    return listing


def _walk(root: str, checksum: bool) -> Dict[str, Any]:
    files: Dict[str, List[Any]] = {}
    dirs: List[str] = []
    other: List[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        prefix = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
        for name in list(dirnames):
            if name == SYNC_RECORD_DIR:
                dirnames.remove(name)  # the records are not part of the copy
            elif os.path.islink(os.path.join(dirpath, name)):
                other.append(prefix + name)  # os.walk lists links to directories here
                dirnames.remove(name)
            else:
                dirs.append(prefix + name)
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue  # gone while we walked
            if not stat.S_ISREG(st.st_mode):
                other.append(prefix + name)
                continue
            files[prefix + name] = [st.st_size, int(st.st_mtime), stat.S_IMODE(st.st_mode),
                                    sha256_of(path) if checksum else None]
    return {"files": files, "dirs": dirs, "other": other}


def record_path(root: str, source: str) -> str:
    name = hashlib.sha256(source.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return os.path.join(root, SYNC_RECORD_DIR, name + ".json")


def read_records(root: str) -> List[Dict[str, Any]]:
    """Every source's record under root; one that cannot be read or parsed counts as absent
    (its source then removes nothing, which is the safe side)."""
    folder = os.path.join(root, SYNC_RECORD_DIR)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    records = []
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                data = json.load(f)
            records.append({"source": str(data["source"]), "dirs": [str(d) for d in data["dirs"]],
                            "files": {str(k): [int(v[0]), int(v[1])] for k, v in data["files"].items()}})
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
            continue
    return records


def _inside(root: str, name: str) -> str:
    """The path of `name` (a bundle member, a recorded path) under root; outside it is refused."""
    path = os.path.normpath(os.path.join(root, name))
    if os.path.isabs(name) or name.startswith("..") or not path.startswith(root + os.sep):
        raise ValueError("%r is outside %s" % (name, root))
    return path


def unpack(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    """The writes of a sync that SFTP cannot do, in this order: land the tar at `archive`, write
    the `record` of a source ({"source", "files": [relpath], "dirs": [relpath]}), or `probe`: try
    writing in a directory (relative to root) where SFTP failed, for the OS's reason."""
    root = _root(request)
    reply: Dict[str, Any] = {"root": root}
    try:
        if request.get("archive"):
            reply["files"] = _land(root, str(request["archive"]))
        if request.get("record"):
            reply["recorded"] = write_record(root, request["record"])
    except OSError as exc:
        reply.update(os_error(exc.filename or root, exc))
        return reply
    if "probe" in request:  # what SFTP would not say: {"probe": None} when the write works
        directory = _inside(root, str(request["probe"])) if request["probe"] else root
        while not os.path.isdir(directory) and len(directory) > len(root):
            directory = os.path.dirname(directory)  # the nearest directory that exists
        failed = try_write(directory)
        reply.update(probe=None if failed is None else os_error(directory, failed), free_bytes=free_bytes(root))
    return reply


def _land(root: str, name: str) -> int:
    """Land the regular files of the tar at `name` (inside `root`) in `root`: each is written
    under a temporary name beside its target, given the member's mode and mtime, and renamed over
    it (a rank never reads half a file). The archive is removed afterwards, whatever happens.
    Directories must exist already (the sender makes them first)."""
    archive = _inside(root, name)
    count = 0
    try:
        with tarfile.open(archive, "r:") as tar:
            for member in tar:
                if not member.isfile():
                    raise ValueError("bundle member %r is not a regular file" % member.name)
                target = _inside(root, member.name)
                head, base = os.path.split(target)
                tmp = os.path.join(head, ".%s.ddpctl-%d" % (base, os.getpid()))  # hosts may share a disk
                source = tar.extractfile(member)
                assert source is not None
                try:
                    with open(tmp, "wb") as out:
                        shutil.copyfileobj(source, out, CHUNK)
                    os.chmod(tmp, member.mode & 0o7777)
                    os.utime(tmp, (member.mtime, member.mtime))
                    os.replace(tmp, target)
                except BaseException as exc:
                    if os.path.lexists(tmp):
                        os.unlink(tmp)
                    if isinstance(exc, OSError):  # name the file, not its temporary name
                        raise OSError(exc.errno, exc.strerror, target) from exc
                    raise
                count += 1
    finally:
        if os.path.lexists(archive):
            os.unlink(archive)
    return count


def write_record(root: str, record: Dict[str, Any]) -> int:
    """Record what this source's syncs now own under root: each listed file that is a regular
    file (with its size and mtime as they are now) and each listed directory that still exists.
    Written under a temporary name, flushed and renamed: a reader sees the old record or the new
    one. Returns how many files it lists."""
    files: Dict[str, List[int]] = {}
    for rel in record.get("files") or ():
        try:
            st = os.lstat(_inside(root, str(rel)))
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            files[str(rel)] = [st.st_size, int(st.st_mtime)]
    dirs = [str(d) for d in record.get("dirs") or ()
            if os.path.isdir(_inside(root, str(d))) and not os.path.islink(_inside(root, str(d)))]
    source = str(record["source"])
    path = record_path(root, source)
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    tmp = "%s.tmp-%s" % (path, os.urandom(4).hex())  # hosts on one filesystem write it at once
    data = {"version": RECORD_VERSION, "source": source, "written": int(time.time()), "files": files, "dirs": dirs}
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, separators=(",", ":"), sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return len(files)
