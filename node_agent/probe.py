"""The "listen" and "connect" ops: doctor's active TCP probe between every pair of hosts.

A listener also serves `CONNECT` control lines, so one agent per host can both listen and dial
(doctor runs its whole probe inside the facts session this way). A launch's session also takes a
`START {supervise request}` line: the listeners close and the same agent goes on to run torchrun.
"""

from __future__ import annotations

import contextlib
import errno
import json
import select
import socket
import threading
import time

from node_agent.parallel import map_all
from node_agent.protocol import emit_event

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, BinaryIO, Dict, List, Optional, Tuple

DEFAULT_LISTEN_TIMEOUT_S = 120.0
DEFAULT_CONNECT_TIMEOUT_S = 3.0


def _bind(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("0.0.0.0", port))
        s.listen(128)
    except OSError:
        s.close()
        raise
    s.setblocking(False)
    return s


def _drain(conn: socket.socket, conns: List[socket.socket]) -> None:
    try:
        data = conn.recv(4096)
    except OSError:
        data = b""
    if not data:
        conns.remove(conn)
        conn.close()


def _drain_all(conns: List[socket.socket], seconds: float) -> None:
    """Give peers a moment to close first (their FINs are usually already queued)."""
    deadline = time.monotonic() + seconds
    while conns and time.monotonic() < deadline:
        readable, _, _ = select.select(conns, [], [], 0.05)
        for conn in readable:
            _drain(conn, conns)


def _watch_control(control: BinaryIO, done: threading.Event, wake: socket.socket,
                   start: Optional[List[Dict[str, Any]]]) -> None:
    """Serve control lines until EOF: `CONNECT {"targets": [...], "timeout": s}` runs a connect
    round and emits a `connected` event with its results; where `start` is a list, a `START
    {request}` line goes into it and ends the reading (the rest of stdin is the supervisor's). At
    EOF or START, wake the accept loop at once."""
    try:
        for line in iter(control.readline, b""):
            if line.startswith(b"CONNECT "):
                emit_event("connected", **connect(json.loads(line[8:].decode()), control))
            elif line.startswith(b"START ") and start is not None:
                start.append(json.loads(line[6:].decode()))
                break
    except (OSError, ValueError):
        pass
    done.set()
    with contextlib.suppress(OSError):
        wake.send(b"x")


def open_listeners(wanted: List[int]) -> Tuple[Dict[int, socket.socket], List[Dict[str, Any]]]:
    """Bind each wanted port (0: ephemeral); a port that cannot be bound records its error."""
    sockets: Dict[int, socket.socket] = {}
    ports: List[Dict[str, Any]] = []
    for want in wanted:
        try:
            s = _bind(want)
        except OSError as exc:
            ports.append({"requested": want, "port": None, "error": str(exc), "peers": []})
            continue
        port = int(s.getsockname()[1])
        sockets[port] = s
        ports.append({"requested": want, "port": port, "error": None, "peers": []})
    return sockets, ports


def source_toward(master_addr: str) -> Optional[str]:
    """The address this host's route to the master leaves from, which its peers dial (the kernel's
    pick for a UDP socket connected there: no packet is sent); None for the master itself, a
    loopback route, or a master that does not resolve or route. IPv4 first, as the facts' routes."""
    if not master_addr:
        return None
    host = master_addr.encode() if master_addr.isascii() else master_addr  # no idna codec import
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_UDP)
    except (OSError, UnicodeError):
        return None
    for family in (socket.AF_INET, socket.AF_INET6):
        for fam, _, _, _, sockaddr in found:
            if fam != family:
                continue
            try:
                with socket.socket(family, socket.SOCK_DGRAM) as s:
                    s.connect((sockaddr[0], 9))
                    source = str(s.getsockname()[0])
            except OSError:
                break  # no route in this family: try the next
            if source == sockaddr[0] or source.startswith("127.") or source == "::1":
                return None  # the master's own address, or loopback
            return source
    return None


def listening_event(ports: List[Dict[str, Any]], source: Optional[str] = None) -> None:
    emit_event("listening", source=source, ports=[{"requested": p["requested"], "port": p["port"],
                                                   "error": p["error"]} for p in ports])


def serve(sockets: Dict[int, socket.socket], ports: List[Dict[str, Any]], control: BinaryIO,
          timeout: float, start: Optional[List[Dict[str, Any]]] = None) -> Dict[str, Any]:
    """Accept (recording peers) and serve control commands until control EOF, a START line (with
    `start`: see _watch_control) or the timeout. Every socket is closed when it returns."""
    done = threading.Event()
    woken, wake = socket.socketpair()
    watcher = threading.Thread(target=_watch_control, args=(control, done, wake, start), daemon=True)
    watcher.start()
    by_port = {p["port"]: p for p in ports if p["port"] is not None}
    conns: List[socket.socket] = []  # kept until the peer closes, so TIME_WAIT lands on its side
    deadline = time.monotonic() + timeout
    try:
        while not done.is_set() and time.monotonic() < deadline:
            readable, _, _ = select.select([woken, *sockets.values(), *conns], [], [], 0.2)
            for s in readable:
                if s is woken:
                    continue  # control EOF: the loop condition ends it
                if s in conns:
                    _drain(s, conns)
                    continue
                try:
                    conn, peer = s.accept()
                except OSError:
                    continue
                conns.append(conn)
                by_port[int(s.getsockname()[1])]["peers"].append(str(peer[0]))
        _drain_all(conns, 0.0 if start else 0.5)  # a START waits for nothing
    finally:
        for s in [*sockets.values(), *conns, woken, wake]:
            s.close()
    if done.is_set():
        watcher.join()  # it has stopped reading: the caller owns stdin now
    return {"ports": ports, "timed_out": not done.is_set()}


def listen(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    """Listen on each requested port (0: ephemeral) until control EOF or the timeout."""
    wanted = [int(p) for p in request.get("ports") or [request.get("port", 0)]]
    sockets, ports = open_listeners(wanted)
    listening_event(ports)
    return serve(sockets, ports, control, float(request.get("timeout") or
                                                DEFAULT_LISTEN_TIMEOUT_S))


def classify(exc: BaseException) -> str:
    """refused / timeout / unreachable / unresolved / error, from a connect failure."""
    if isinstance(exc, socket.gaierror):
        return "unresolved"
    if isinstance(exc, socket.timeout):
        return "timeout"
    code = getattr(exc, "errno", None)
    if code == errno.ECONNREFUSED:
        return "refused"
    if code in (errno.ETIMEDOUT, errno.EAGAIN):
        return "timeout"
    if code in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return "unreachable"
    return "error"


def connect_one(target: str, timeout: float) -> Dict[str, Any]:
    host, _, port = target.rpartition(":")
    host = host.strip("[]")
    started = time.monotonic()
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as s:
            local = str(s.getsockname()[0])
        return {"target": target, "ok": True, "kind": "ok", "error": None, "local": local,
                "ms": round((time.monotonic() - started) * 1000, 1)}
    except (OSError, ValueError) as exc:
        return {"target": target, "ok": False, "kind": classify(exc), "error": str(exc) or
                type(exc).__name__, "ms": round((time.monotonic() - started) * 1000, 1)}


def connect(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    """TCP-connect to every `addr:port` target at once; each gets ok or refused/timeout/..."""
    targets = [str(t) for t in request.get("targets") or []]
    timeout = float(request.get("timeout") or DEFAULT_CONNECT_TIMEOUT_S)
    if not targets:
        return {"results": []}
    return {"results": map_all(lambda t: connect_one(t, timeout), targets)}
