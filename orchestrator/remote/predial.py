"""The TCP connection to a host's sshd that paramiko's handshake runs on (`connect(sock=...)`),
dialled here so that it carries TCP_NODELAY, and dialled ahead (HostPool.connect_ahead) while this
process still imports fabric and the command's own code: the server's accept, fork and re-exec for
every host then run on otherwise idle cores. Only where ssh_config sends the host straight to its
HostName and Port: a ProxyJump or ProxyCommand host is dialled by fabric, and an ahead dial that
fabric would aim elsewhere is dropped (SshTransport checks the target before it takes the socket)."""

from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Mapping

from inventory import Host

# paramiko dials every address of the name and raises one NoValidConnectionsError when all refuse
# or are unreachable; these are left to its own dial (it fails as fast), so the error reads as ever.
REDIAL = (errno.ECONNREFUSED, errno.EHOSTUNREACH)


def dial_target(host: Host, lookup: Mapping[str, object]) -> tuple[str, int] | None:
    """Where fabric will connect `host` (its ssh_config lookup): (HostName, Port), or None for a
    host behind a ProxyJump or ProxyCommand."""
    if "proxyjump" in lookup or "proxycommand" in lookup:
        return None
    return str(lookup.get("hostname") or host.name), int(host.port or str(lookup.get("port") or 22))


class PreDial:
    """One host's TCP connection, dialled in a thread of its own from construction."""

    def __init__(self, target: tuple[str, int], timeout: float) -> None:
        self.target = target
        self._done = threading.Event()
        self._sock: socket.socket | None = None
        self._error: OSError | None = None
        self._taken = False
        self._lock = threading.Lock()
        threading.Thread(target=self._dial, args=(timeout,), name="ddpctl-predial", daemon=True).start()

    def _dial(self, timeout: float) -> None:
        name, port = self.target
        try:  # an ASCII name as bytes: a str would load the idna codec (~5-10 ms) for nothing
            address = name.encode() if name.isascii() else name  # getaddrinfo takes bytes too
            sock = socket.create_connection((address, port), timeout)  # type: ignore[arg-type]
            # SSH's small messages go out at once: with Nagle's algorithm each round trip of the
            # handshake waits for the server's delayed ACK (~60 ms a handshake here, ~18 without).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            self._error = exc
        else:
            with self._lock:
                if self._taken:  # discarded while it dialled
                    sock.close()
                else:
                    self._sock = sock
        finally:
            self._done.set()

    def take(self) -> socket.socket | None:
        """The connected socket, once; None where the caller should dial itself (refused or
        unreachable: it fails as fast, with paramiko's own error). Any other failure (a timeout)
        is raised: dialling again would only wait as long again."""
        self._done.wait()
        with self._lock:
            if self._taken:
                return None
            self._taken = True
            sock, self._sock = self._sock, None
        if sock is not None:
            return sock
        if self._error is not None and self._error.errno not in REDIAL:
            raise self._error
        return None

    def discard(self) -> None:
        """Close the socket if it was never taken (the host is dialled elsewhere, or not at all)."""
        with self._lock:
            self._taken = True
            sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
