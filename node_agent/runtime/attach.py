"""Re-attaching: a control plane that lost contact with this host comes back on a fresh
connection and takes over the job's output and control from where it stopped. Both ends of the
supervisor's attach socket live here: the supervisor listens (`listen`, `serve`), the attach op
connects.

Request: {"job_id", "node_rank", "offset"} (the log offset of the last batch it committed). While
the job's supervisor runs, this op connects to its attach socket and relays: the socket's bytes
(events, the log from `offset` in committed batches, at the end the supervise op's result) to
stdout, and its own stdin (HEARTBEAT/STOP/ABORT/KILL) to the socket; it exits with the job's exit code.
Where the supervisor has ended meanwhile, it sends the rest of the log, every rank's records and
the result the supervisor recorded in state.json, each built as the supervisor sends it live
(node_agent/runtime/records.py), so a job that ended during the outage loses nothing either.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import sys
import tempfile
import threading
import time

from node_agent.host.runstate import read_json
from node_agent.runtime.records import rank_message, rank_records, recorded_result
from node_agent.runtime.uplink import BATCH, Sink, batch_of
from node_agent.wire.layout import node_state_dir
from node_agent.wire.protocol import RESULT_PREFIX, emit_event
from node_agent.wire.replies import wire
from node_agent.wire.replies_run import SuperviseResult

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, BinaryIO, Callable, Dict, Optional

SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes; a longer state dir gets a short socket path
MARK = RESULT_PREFIX.encode()
SETTLE_S = 5.0  # a supervisor that has just ended: how long to wait for its final state


def socket_path(directory: str) -> str:
    """Where a job's supervisor listens: in its own state dir (0700), or where that path is too
    long for a Unix socket, in a 0700 directory of this user under /tmp."""
    path = os.path.join(directory, "attach.sock")
    if len(path.encode()) <= SOCKET_PATH_MAX:
        return path
    base = os.path.join(tempfile.gettempdir(), "ddpctl-%d" % os.getuid())
    os.makedirs(base, mode=0o700, exist_ok=True)
    st = os.stat(base)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise OSError("%s is not private to this user" % base)
    return os.path.join(base, hashlib.sha1(directory.encode()).hexdigest()[:20] + ".sock")


def listen(directory: str) -> Optional[socket.socket]:
    """The supervisor's attach socket (None where it cannot listen: no re-attach, the job runs)."""
    try:
        path = socket_path(directory)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(4)
    except OSError:
        return None
    return listener


def serve(listener: socket.socket, attached: Callable[[Any, Sink, int], None]) -> None:
    """Each session that says `ATTACH <offset>` goes to `attached(reader, sink, offset)`, in a
    thread of its own, until the listener is closed."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_session, args=(conn, attached), daemon=True).start()


def _session(conn: socket.socket, attached: Callable[[Any, Sink, int], None]) -> None:
    conn.settimeout(10.0)
    reader = conn.makefile("rb")
    try:
        words = reader.readline().split()
    except OSError:
        words = []
    if len(words) != 2 or words[0] != b"ATTACH" or not words[1].isdigit():
        conn.close()
        return
    conn.settimeout(None)
    attached(reader, Sink("re-attached session", sock=conn), int(words[1]))


def attach(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    directory = node_state_dir(str(request["job_id"]), int(request.get("node_rank", 0)))
    offset = int(request.get("offset") or 0)
    state = read_json(directory / "state.json")
    if state is None:
        return wire(SuperviseResult(exit_code=3, error="no run state of job %s node %s on %s" % (
            request["job_id"], request.get("node_rank"), socket.gethostname())))
    path = state.get("attach")
    if state.get("status") == "running" and path:
        code = _relay(str(path), offset, control)
        if code is not None:
            return {"exit_code": code, "_sent": True}
    return _replay(directory, offset)


def _relay(path: str, offset: int, control: BinaryIO) -> Optional[int]:
    """Relay between this session and the supervisor; the job's exit code, or None when the
    supervisor was not there to take the session (it has ended: replay instead)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        sock.sendall(b"ATTACH %d\n" % offset)
    except OSError:
        sock.close()
        return None

    def upstream() -> None:
        with contextlib.suppress(OSError):
            for line in iter(control.readline, b""):
                sock.sendall(line)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)  # this session ended: the supervisor hears it as EOF

    threading.Thread(target=upstream, daemon=True).start()
    sys.stdout.flush()
    carry, tail = b"", None  # tail: from the last result marker on (the job's exit code is in it)
    got = False
    while True:
        try:
            data = sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            break
        got = True
        _write_all(data)
        joined = carry + data
        at = joined.rfind(MARK)
        if at >= 0:
            tail = joined[at:]
        elif tail is not None:
            tail = (tail + data)[:1 << 22]
        carry = joined[-len(MARK):]
    sock.close()
    if not got:
        return None
    line = tail.split(b"\n", 1)[0][len(MARK):] if tail is not None else b""
    try:
        return int(json.loads(line.decode()).get("exit_code") or 0)
    except (ValueError, AttributeError):
        return 1  # the supervisor went away before its result: the control plane sees no result


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def _replay(directory: Any, offset: int) -> Dict[str, Any]:
    """The supervisor has ended: the log from `offset` in committed batches, then its result."""
    deadline = time.monotonic() + SETTLE_S
    state = read_json(directory / "state.json") or {}
    while state.get("status") != "exited" and time.monotonic() < deadline:
        time.sleep(0.1)
        state = read_json(directory / "state.json") or {}
    sys.stdout.flush()
    emit_event("attached", offset=offset, replay=True)
    sys.stdout.flush()
    try:
        with open(str(directory / "output.log"), "rb") as log:
            log.seek(offset)
            while True:
                data = log.read(BATCH)
                if not data:
                    break
                payload, offset = batch_of(data, offset)
                _write_all(payload)
                log.seek(offset)
    except OSError:
        pass
    for _name, record in rank_records(directory / "ranks"):
        _write_all(rank_message(record))
    if state.get("status") != "exited":
        return wire(SuperviseResult(exit_code=1, stop_reason="the supervisor on %s ended without a result"
                                    % socket.gethostname()))
    return recorded_result(state)
