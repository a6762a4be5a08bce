"""A host that cannot take the copy, in the OS's own words: the manifest's write check, the free
space before anything is sent, and a failed SFTP step (SFTP v3 says only "Failure" for a
read-only or full filesystem) tried again by the node agent, which reports the OSError."""

from __future__ import annotations

import errno
import os
import posixpath
from collections.abc import Mapping
from typing import Any

from orchestrator.errors import HostError, HostErrorKind
from orchestrator.remote.agent import call_agent
from orchestrator.remote.transport import Transport
from orchestrator.sizes import size_text
from orchestrator.sync.diff import Changes, Manifest
from orchestrator.sync.transfer import TransferError

PROBE_TIMEOUT_S = 60.0


def _fix(host: str, code: str | None, path: str) -> str:
    elsewhere = f"or set workdir for {host} (or [sync] dest) to a directory it can write"
    if code == "EROFS":
        return f"remount the filesystem of {path} on {host} read-write, {elsewhere}"
    if code in ("ENOSPC", "EDQUOT"):
        return f"free space on {host} (df -h {path}), {elsewhere}"
    if code in ("EACCES", "EPERM"):
        return f"give the login user of {host} write access to {path}, {elsewhere}"
    return f"set workdir for {host} (or [sync] dest) to a directory"


def refused(host: str, reply: Mapping[str, Any]) -> HostError:
    """A node agent's error reply (it names the path and the OS's reason) as the host's error."""
    code = reply.get("errno")
    path = str(reply.get("path") or reply.get("root") or "")
    fix = _fix(host, None if code is None else str(code), path)
    return HostError(host, HostErrorKind.SYNC, str(reply["error"]), fix)


def cannot_write(host: str, remote: Manifest, changes: Changes) -> HostError | None:
    """Before anything is sent: a copy the node agent could not write to, or one whose filesystem
    has no room for what is to be sent (nothing to write: neither matters)."""
    if changes.empty and changes.owned is None:
        return None
    if remote.unwritable is not None:
        return refused(host, remote.unwritable)
    return no_room(host, remote.root, changes.send_bytes, remote.free_bytes)


def no_room(host: str, root: str, needed: int, free: int | None) -> HostError | None:
    """Refuse before sending when the files to send cannot fit in the copy's filesystem."""
    if free is None or needed <= free:
        return None
    return HostError(host, HostErrorKind.SYNC,
                     f"cannot write to {root}: {os.strerror(errno.ENOSPC)} ({size_text(needed)} to send, "
                     f"{size_text(free)} free)", _fix(host, "ENOSPC", root))


def explain(transport: Transport, root: str, failed: TransferError) -> HostError:
    """A failed step as the host's error: the node agent tries a write in the same directory and
    reports the OS's reason; where that write works, the original error and the free space."""
    host = transport.host.name
    try:
        reply = call_agent(transport, "unpack", {"root": root, "probe": posixpath.dirname(failed.rel)},
                           timeout=PROBE_TIMEOUT_S).result
    except HostError:
        reply = {}  # the connection is gone too: the original error is all there is
    probe = reply.get("probe")
    if isinstance(probe, Mapping) and probe.get("error"):
        return refused(host, probe)
    free = reply.get("free_bytes")
    room = f" ({size_text(int(free))} free there)" if free is not None else ""
    return HostError(host, HostErrorKind.SYNC, f"copying {failed.rel} to {root} failed: {failed.cause}{room}",
                     f"check that {root} on {host} is writable and has space")
