"""Real port holders for the kill-port tests: listener processes (with children) and TIME_WAIT sockets."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from node_agent.host.runstate import alive
from node_agent.ops.ports import proc_sockets

# argv: family (v4|v6) proto (tcp|udp) port children; prints "<port> <child pid>..." once bound.
LISTENER = """
import socket, subprocess, sys, time
v6, udp = sys.argv[1] == "v6", sys.argv[2] == "udp"
s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM if udp else socket.SOCK_STREAM)
s.bind(("::1" if v6 else "127.0.0.1", int(sys.argv[3])))
if not udp:
    s.listen()
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(int(sys.argv[4]))]
print(s.getsockname()[1], *[k.pid for k in kids], flush=True)
time.sleep(600)
"""
NOBODY = ("setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups")
SYSTEM_PYTHON = "/usr/bin/python3"  # readable by `nobody` (the test python may live under /root)


@dataclass
class Listener:
    proc: subprocess.Popen[str]
    port: int
    children: list[int]

    @property
    def pids(self) -> list[int]:
        return [self.proc.pid, *self.children]

    def gone(self) -> bool:
        self.proc.poll()
        return not any(alive(p) for p in self.pids)


def listener_argv(family: str = "v4", proto: str = "tcp", port: int = 0, children: int = 0,
                  python: str = sys.executable, prefix: Sequence[str] = ()) -> list[str]:
    return [*prefix, python, "-c", LISTENER, family, proto, str(port), str(children)]


@contextlib.contextmanager
def started(argv: Sequence[str], popen: Callable[..., subprocess.Popen[str]] = subprocess.Popen
            ) -> Iterator[Listener]:
    """Start a listener (through `popen`, e.g. a cluster host's exec_in); always killed on exit."""
    proc = popen(list(argv), stdout=subprocess.PIPE, text=True)
    listener = None
    try:
        assert proc.stdout is not None
        words = proc.stdout.readline().split()
        assert words, f"listener {argv} printed nothing (exit {proc.poll()})"
        listener = Listener(proc, int(words[0]), [int(w) for w in words[1:]])
        yield listener
    finally:
        reap(proc, listener.children if listener else [])


def reap(proc: subprocess.Popen[str], children: Sequence[int]) -> None:
    """SIGKILL a test program and the children it reported, and collect it."""
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.kill()
    proc.wait(timeout=30)
    if proc.stdout is not None:
        proc.stdout.close()


@contextlib.contextmanager
def listening(family: str = "v4", proto: str = "tcp", children: int = 0, python: str = sys.executable,
              prefix: Sequence[str] = ()) -> Iterator[Listener]:
    with started(listener_argv(family, proto, 0, children, python, prefix)) as listener:
        yield listener


def wait_until(predicate: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def time_wait_port(reuse: bool = True) -> int:
    """A port whose only trace is a TIME_WAIT socket: the accepted (server) side closes first,
    so TIME_WAIT lands on the listening port's number; then the listener closes too. `reuse`: the
    listener set SO_REUSEADDR as torchrun's store does, so its TIME_WAIT refuses no such bind."""
    with socket.socket() as srv:
        if reuse:
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as cli:
            conn, _ = srv.accept()
            conn.close()
            assert cli.recv(1) == b""  # the server's FIN arrived
    wait_until(lambda: any(s["status"] == "TIME_WAIT" for s in proc_sockets(port, "tcp"))
               and all(s["status"] == "TIME_WAIT" for s in proc_sockets(port, "tcp")),
               what=f"TIME_WAIT alone on port {port}")
    return port

# Holds the port and makes a TIME_WAIT of its own on it (no SO_REUSEADDR): the accepted side closes
# first. Killing it leaves no process on the port, yet the port does not bind for a minute.
TIME_WAIT_MAKER = """
import socket, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
conn, _ = s.accept()
conn.close()
time.sleep(600)
"""

# A stand-in torchrun agent (the file is named torchrun): worker 0 holds the port, worker 1 only lives.
FAKE_TORCHRUN = """
import subprocess, sys, time
w0 = subprocess.Popen([sys.executable, "-c", sys.argv[1], "v4", "tcp", "0", "0"], stdout=subprocess.PIPE, text=True)
port = w0.stdout.readline().split()[0]
w1 = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(port, w0.pid, w1.pid, flush=True)
time.sleep(600)
"""


def fake_torchrun_argv(tmp: Path) -> list[str]:
    path = tmp / "torchrun"
    path.write_text(FAKE_TORCHRUN)
    return [sys.executable, str(path), LISTENER]
