"""A sync destination on this host: what it holds (`manifest`: every file with its size,
modification time and mode, SHA-256 on request, in one round trip instead of an SFTP listing per
directory), and landing a tar bundle of many files sent over SFTP in one piece (`unpack`)."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tarfile

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, BinaryIO, Dict, List

CHUNK = 1 << 20


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    """{"root": absolute path, "exists", "files": {relpath: [size, mtime_s, mode, sha256|None]},
    "dirs": [relpath], "other": [relpath]}. `root` may be relative (to the home directory) or
    start with "~"; `create` makes it (and its parents). Symlinks are not followed: a link is
    listed under "other" (the sender replaces or removes it), as are sockets and devices."""
    root = os.path.abspath(os.path.expanduser(str(request["root"])))
    checksum = bool(request.get("checksum"))
    if not os.path.lexists(root):
        if not request.get("create"):
            return {"root": root, "exists": False, "files": {}, "dirs": [], "other": []}
        os.makedirs(root, mode=0o755, exist_ok=True)
    if not os.path.isdir(root):
        return {"root": root, "exists": False, "error": "%s exists and is not a directory" % root,
                "exit_code": 2}
    files: Dict[str, List[Any]] = {}
    dirs: List[str] = []
    other: List[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        prefix = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
        for name in list(dirnames):
            if os.path.islink(os.path.join(dirpath, name)):
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
    return {"root": root, "exists": True, "files": files, "dirs": dirs, "other": other}


def _inside(root: str, name: str) -> str:
    """The member's path under root; a name that would land outside it is refused."""
    path = os.path.normpath(os.path.join(root, name))
    if os.path.isabs(name) or name.startswith("..") or not path.startswith(root + os.sep):
        raise ValueError("bundle member %r is outside %s" % (name, root))
    return path


def unpack(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    """Land the regular files of the tar at `archive` (inside `root`) in `root`: each is written
    under a temporary name beside its target, given the member's mode and mtime, and renamed over
    it (a rank never reads half a file). The archive is removed afterwards, whatever happens.
    Directories must exist already (the sender makes them first)."""
    root = os.path.abspath(os.path.expanduser(str(request["root"])))
    archive = _inside(root, str(request["archive"]))
    count = 0
    try:
        with tarfile.open(archive, "r:") as tar:
            for member in tar:
                if not member.isfile():
                    raise ValueError("bundle member %r is not a regular file" % member.name)
                target = _inside(root, member.name)
                head, name = os.path.split(target)
                tmp = os.path.join(head, ".%s.ddpctl-%d" % (name, os.getpid()))  # hosts may share a disk
                source = tar.extractfile(member)
                assert source is not None
                try:
                    with open(tmp, "wb") as out:
                        shutil.copyfileobj(source, out, CHUNK)
                    os.chmod(tmp, member.mode & 0o7777)
                    os.utime(tmp, (member.mtime, member.mtime))
                    os.replace(tmp, target)
                except BaseException:
                    if os.path.lexists(tmp):
                        os.unlink(tmp)
                    raise
                count += 1
    finally:
        if os.path.lexists(archive):
            os.unlink(archive)
    return {"root": root, "files": count}
