"""Add a public key to this user's ~/.ssh/authorized_keys once: `ddpctl ssh-setup`'s remote half.

A key counts as present when a line holds the same key type and base64 blob, whatever its options
or comment. ~/.ssh (0700) and the file (0600) are created when missing; existing ones keep their
modes, which are reported. The file is locked while it is read and appended to, so hosts sharing
one home directory (NFS) add the key once.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import re

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, BinaryIO, Dict, Optional, Tuple

_KEY_TYPE = re.compile(r"^(ssh-[a-z0-9-]+|ecdsa-sha2-[a-z0-9-]+|sk-[a-z0-9-]+@openssh\.com)"
                       r"(-cert-v01@openssh\.com)?$")
_BASE64 = re.compile(r"^[A-Za-z0-9+/]+={0,2}$")


def _after_options(text: str) -> str:
    """What follows the options field of an authorized_keys line (quotes may hold blanks)."""
    quoted = False
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and quoted:
            i += 2
            continue
        if c == '"':
            quoted = not quoted
        elif c in " \t" and not quoted:
            return text[i:].lstrip()
        i += 1
    return ""


def key_of(line: str) -> Optional[Tuple[str, str]]:
    """(key type, base64 blob) of an authorized_keys or .pub line; None for blanks, comments, junk."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    for candidate in (text, _after_options(text)):
        parts = candidate.split()
        if len(parts) >= 2 and _KEY_TYPE.match(parts[0]) and _BASE64.match(parts[1]):
            return parts[0], parts[1]
    return None


def to_append(existing: str, public_line: str) -> Optional[str]:
    """The text to append to authorized_keys `existing` so that it holds the key of
    `public_line`; None when a line already holds that key."""
    wanted = key_of(public_line)
    if wanted is None or "\n" in public_line.strip():
        raise ValueError("not one public key line: %r" % public_line[:80])
    if any(key_of(line) == wanted for line in existing.splitlines()):
        return None
    newline = "" if not existing or existing.endswith("\n") else "\n"
    return newline + public_line.strip() + "\n"


def _make_ssh_dir(path: str) -> bool:
    """Create ~/.ssh 0700 unless it exists; True when this call created it."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return False
    os.chmod(path, 0o700)
    return True


def _open_keys(path: str) -> Tuple[int, bool]:
    """The file opened for reading and appending, and whether this call created it (0600)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return os.open(path, os.O_RDWR | os.O_APPEND), False
    os.fchmod(fd, 0o600)
    return fd, True


def _read_all(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def authorize(public_line: str, home: str) -> Dict[str, Any]:
    """Add the key to <home>/.ssh/authorized_keys unless it is there; say what was done."""
    ssh_dir = os.path.join(home, ".ssh")
    created_dir = _make_ssh_dir(ssh_dir)
    path = os.path.join(ssh_dir, "authorized_keys")
    fd, created_file = _open_keys(path)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        text = to_append(_read_all(fd), public_line)
        if text is not None:
            os.write(fd, text.encode("utf-8"))
            os.fsync(fd)
    finally:
        os.close(fd)  # releases the lock
    return {"status": "present" if text is None else "added", "path": path,
            "created_dir": created_dir, "created_file": created_file,
            "dir_mode": os.stat(ssh_dir).st_mode & 0o7777, "file_mode": os.stat(path).st_mode & 0o7777}


def _home() -> str:
    """The home sshd reads authorized_keys from: the passwd entry's, else $HOME."""
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return os.path.expanduser("~")


def authorize_key(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    """Op: add request["key"] (one public key line) to this user's authorized_keys."""
    home = _home()
    try:
        return authorize(str(request["key"]), home)
    except OSError as exc:  # a full disk, a read-only or foreign-owned home: the host's failure
        return {"status": "failed", "home": home,
                "message": "%s: %s" % (exc.filename or home, exc.strerror or exc)}
