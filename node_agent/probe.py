"""The "listen" and "connect" ops: doctor's active TCP probe between every pair of hosts.

A listener also serves `CONNECT` control lines, so one agent per host can both listen and dial
(doctor runs its whole probe inside the facts session this way). A launch's session also takes a
`START {supervise request}` line: the listeners close and the same agent goes on to run torchrun.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import socket
import threading
import time

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
    return connect_all([target], timeout)[0]


def connect(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    """TCP-connect to every `addr:port` target at once; each gets ok or refused/timeout/..."""
    targets = [str(t) for t in request.get("targets") or []]
    timeout = float(request.get("timeout") or DEFAULT_CONNECT_TIMEOUT_S)
    return {"results": connect_all(targets, timeout)}


def _outcome(target: str, started: float, exc: Optional[BaseException] = None,
             local: Optional[str] = None) -> Dict[str, Any]:
    ms = round((time.monotonic() - started) * 1000, 1)
    if exc is None:
        return {"target": target, "ok": True, "kind": "ok", "error": None, "local": local, "ms": ms}
    return {"target": target, "ok": False, "kind": classify(exc), "error": str(exc) or type(exc).__name__,
            "ms": ms}


def connect_all(targets: List[str], timeout: float) -> List[Dict[str, Any]]:
    """connect_one for every target at once, from this one thread: non-blocking sockets in a
    selector (a thread per target cost each host ~0.1 ms of CPU per peer, and doctor dials every
    pair). Each target tries the addresses its name resolves to in turn, as create_connection
    does, within `timeout` in all."""
    import selectors

    started = time.monotonic()
    results: List[Optional[Dict[str, Any]]] = [None] * len(targets)
    selector = selectors.DefaultSelector()

    def attempt(i: int, addresses: List[Any], error: Optional[OSError]) -> None:
        """Dial the target's next address; with none left, its last error is its outcome."""
        while addresses:
            family, kind, proto, _, sockaddr = addresses.pop(0)
            s = socket.socket(family, kind, proto)
            s.setblocking(False)
            code = s.connect_ex(sockaddr)
            if code in (0, errno.EINPROGRESS):
                selector.register(s, selectors.EVENT_WRITE, (i, addresses))
                return
            s.close()
            error = OSError(code, os.strerror(code))
        results[i] = _outcome(targets[i], started, error or OSError("no address to connect to"))

    for i, target in enumerate(targets):
        host, _, port = target.rpartition(":")
        host = host.strip("[]")
        try:
            name = host.encode() if host.isascii() else host  # no idna codec import
            attempt(i, socket.getaddrinfo(name, int(port), 0, socket.SOCK_STREAM), None)
        except (OSError, ValueError, UnicodeError) as exc:
            results[i] = _outcome(target, started, exc)
    deadline = started + timeout
    while selector.get_map():
        left = deadline - time.monotonic()
        ready = selector.select(left) if left > 0 else []
        if not ready:
            break
        for key, _ in ready:
            s = key.fileobj
            assert isinstance(s, socket.socket)
            i, addresses = key.data
            selector.unregister(s)
            code = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code == 0:
                results[i] = _outcome(targets[i], started, local=str(s.getsockname()[0]))
                s.close()
            else:
                s.close()
                attempt(i, addresses, OSError(code, os.strerror(code)))
    for key in list(selector.get_map().values()):  # still dialling at the deadline
        key.fileobj.close()  # type: ignore[union-attr]
        results[key.data[0]] = _outcome(targets[key.data[0]], started, socket.timeout("timed out"))
    selector.close()
    return [results[i] or _outcome(targets[i], started, OSError("not dialled")) for i in range(len(targets))]
