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

from node_agent.wire.protocol import emit_event

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, BinaryIO, Dict, List, Optional, Tuple

DEFAULT_LISTEN_TIMEOUT_S = 120.0
DEFAULT_CONNECT_TIMEOUT_S = 4.0


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


def bind_error(port: int, proto: str = "tcp") -> Optional[str]:
    """Why a server could not bind `port` on this host now (None: it could), tried as torchrun's
    store binds (every IPv4 address; TCP with SO_REUSEADDR, so a TIME_WAIT it may reuse is no
    conflict). The socket is closed at once and never listens."""
    kind = socket.SOCK_DGRAM if proto == "udp" else socket.SOCK_STREAM
    with socket.socket(socket.AF_INET, kind) as s:
        if kind == socket.SOCK_STREAM:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError as exc:
            return str(exc)
    return None


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


def source_toward(master_addr: str) -> Optional[Tuple[str, str]]:
    """(the address this host's route to the master leaves from, which its peers dial; the address
    master_addr resolved to): the kernel's pick for a UDP socket connected there (no packet is
    sent). The source is "" for the master itself or a loopback route; None where the master does
    not resolve or route. IPv4 first, as the facts' routes."""
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
                return "", str(sockaddr[0])  # the master's own address, or loopback
            return source, str(sockaddr[0])
    return None


def listening_event(ports: List[Dict[str, Any]], source: Optional[Tuple[str, str]] = None,
                    net: Optional[Dict[str, Any]] = None) -> None:
    """The ports bound; `source`: (this host's source address toward the master, the address the
    master's name resolved to here); `net`: its interfaces and routes (see facts.net_facts)."""
    emit_event("listening", source=(source[0] or None) if source else None,
               master_ip=source[1] if source else None, net=net,
               ports=[{"requested": p["requested"], "port": p["port"], "error": p["error"]} for p in ports])


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


# A target still unanswered is dialled again, on a fresh socket (a new SYN from a new source port),
# at these fractions of the probe's bound: one lost SYN (a saturated host, a flapping link, a full
# neighbour table) then costs a retry, not a finding. With the bound of 4 s the dials go out at 0,
# 0.5, 1, 1.5, 2 and 3 s, and the kernel retransmits each SYN after 1 s and 3 s: 13 SYNs in all
# before a port is called silent. NCCL retries a timed-out connect too.
REDIAL_AT = (0.0, 0.125, 0.25, 0.375, 0.5, 0.75)
# An attempt that ends in these is not the port's answer: the next dial may get through.
TRANSIENT = ("timeout", "unreachable")


class _Target(object):
    """One target's dials: the addresses its name resolved to, the attempts made, the outcome."""

    def __init__(self, target: str, addresses: List[Any]) -> None:
        self.target = target
        self.addresses = addresses
        self.open: Dict[socket.socket, float] = {}  # live dial -> when it started
        self.waited: List[float] = []  # each ended attempt's wait, in ms
        self.last: Optional[BaseException] = None
        self.result: Optional[Dict[str, Any]] = None
        self.dialled = 0

    def finish(self, started: float, exc: Optional[BaseException] = None,
               local: Optional[str] = None) -> None:
        self.result = _outcome(self.target, started, exc, local)
        self.result["attempts"] = self.dialled
        self.result["waited_ms"] = self.waited


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
    pair). A target is dialled again at each REDIAL_AT while no dial has answered; the first
    answer decides (connected: ok; refused: an explicit reject). Only when every dial has timed
    out (or found no route) by `timeout` is that its outcome, with how many attempts were made
    and how long each waited (`attempts`, `waited_ms`). A name's addresses are dialled in turn,
    one per attempt."""
    import selectors

    started = time.monotonic()
    selector = selectors.DefaultSelector()
    states: List[_Target] = []

    def dial(t: _Target, now: float) -> None:
        family, kind, proto, _, sockaddr = t.addresses[t.dialled % len(t.addresses)]
        t.dialled += 1
        s = socket.socket(family, kind, proto)
        s.setblocking(False)
        code = s.connect_ex(sockaddr)
        if code in (0, errno.EINPROGRESS):
            t.open[s] = now
            selector.register(s, selectors.EVENT_WRITE, t)
            return
        s.close()
        ended(t, OSError(code, os.strerror(code)), now, now)

    def ended(t: _Target, exc: OSError, began: float, now: float) -> None:
        """One dial failed: a port's own answer (refused) decides; a transient failure waits for
        the dials still open or to come."""
        t.waited.append(round((now - began) * 1000, 1))
        t.last = exc
        if classify(exc) not in TRANSIENT:
            close(t)
            t.finish(started, exc)

    def close(t: _Target) -> None:
        for s in list(t.open):
            selector.unregister(s)
            s.close()
        t.open.clear()

    for target in targets:
        host, _, port = target.rpartition(":")
        host = host.strip("[]")
        t = _Target(target, [])
        states.append(t)
        try:
            name = host.encode() if host.isascii() else host  # no idna codec import
            t.addresses = socket.getaddrinfo(name, int(port), 0, socket.SOCK_STREAM)
        except (OSError, ValueError, UnicodeError) as exc:
            t.finish(started, exc)
            continue
        if not t.addresses:
            t.finish(started, OSError("no address to connect to"))
            continue
        dial(t, started)
    redials = [started + f * timeout for f in REDIAL_AT[1:]]
    deadline = started + timeout
    while any(t.result is None for t in states):
        now = time.monotonic()
        while redials and redials[0] <= now:
            redials.pop(0)
            for t in states:
                if t.result is None:
                    dial(t, now)
        if now >= deadline:
            break
        wake = min([deadline, *redials[:1]])
        for key, _ in selector.select(max(0.0, wake - now)):
            s = key.fileobj
            t = key.data
            assert isinstance(s, socket.socket) and isinstance(t, _Target)
            if t.result is not None:
                continue
            code = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            began = t.open.pop(s)
            selector.unregister(s)
            if code == 0:
                local = str(s.getsockname()[0])
                s.close()
                close(t)
                t.finish(started, local=local)
            else:
                s.close()
                ended(t, OSError(code, os.strerror(code)), began, time.monotonic())
    now = time.monotonic()
    for t in states:  # still unanswered at the deadline: every dial timed out (or found no route)
        if t.result is None:
            t.waited += [round((now - began) * 1000, 1) for began in t.open.values()]
            close(t)
            last = t.last if t.last is not None and classify(t.last) == "unreachable" else None
            t.finish(started, last or socket.timeout("timed out"))
    selector.close()
    return [t.result or _outcome(t.target, started, OSError("not dialled")) for t in states]
