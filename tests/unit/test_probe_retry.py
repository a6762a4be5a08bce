"""The probe's retry rule, on real sockets: a listener whose accept queue is full drops every SYN
(Linux), exactly as a lost packet or a DROP rule would. A port is called silent only when every
dial of the probe's bound went unanswered; one that answers a later dial is fine."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from node_agent.ops.probe import REDIAL_AT, connect_all


@contextmanager
def full_queue() -> Iterator[socket.socket]:
    """A listener with a backlog of 0 and one connection queued: the kernel drops further SYNs."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    filler = socket.create_connection(server.getsockname(), timeout=2)
    try:
        yield server
    finally:
        filler.close()
        server.close()


def dials_waiting(port: int) -> int:
    """Sockets of this machine in SYN-SENT toward `port`: dials the listener has not answered."""
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for line in lines if line.split()[3] == "02" and line.split()[2].endswith(f":{port:04X}"))


def test_a_port_that_answers_a_later_dial_is_not_blocked() -> None:
    with full_queue() as server:
        port = server.getsockname()[1]
        seen: list[int] = []

        def drain() -> None:
            """Once a second dial waits beside the first, the queue frees up: a dial gets in."""
            deadline = time.monotonic() + 3
            while dials_waiting(port) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            seen.append(dials_waiting(port))
            server.settimeout(3)
            for _ in range(8):
                try:
                    server.accept()[0].close()
                except OSError:
                    return

        threading.Thread(target=drain, daemon=True).start()
        result, = connect_all([f"127.0.0.1:{port}"], 4.0)
    assert seen and seen[0] >= 2  # the first dial went unanswered and a second went out
    assert result["ok"] is True and result["kind"] == "ok"
    assert result["attempts"] > 1
    assert all(w > 0 for w in result["waited_ms"])


def test_a_port_silent_through_every_dial_is_a_timeout_that_says_how_many_and_how_long() -> None:
    with full_queue() as server:
        target = f"127.0.0.1:{server.getsockname()[1]}"
        started = time.monotonic()
        result, = connect_all([target], 2.0)
        took = time.monotonic() - started
    assert result["ok"] is False and result["kind"] == "timeout"
    assert result["attempts"] == len(REDIAL_AT) == len(result["waited_ms"])
    assert result["waited_ms"][0] > result["waited_ms"][-1] > 0  # the first dial waited longest
    assert took > 1.9  # it dialled through its whole bound before calling the port silent


def test_a_refusal_is_an_answer_at_once_not_retried() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        result, = connect_all([f"127.0.0.1:{port}"], 4.0)
    assert result["kind"] == "refused" and result["attempts"] == 1  # an answer: not dialled again


def test_every_target_is_dialled_at_once_and_answers_in_order() -> None:
    with socket.socket() as a, socket.socket() as b:
        for s in (a, b):
            s.bind(("127.0.0.1", 0))
        a.listen(8)
        results = connect_all([f"127.0.0.1:{a.getsockname()[1]}", f"127.0.0.1:{b.getsockname()[1]}",
                               "no-such-host.invalid:1"], 2.0)
    assert [r["kind"] for r in results] == ["ok", "refused", "unresolved"]
