"""The probe's retry rule, on real sockets: a listener whose accept queue is full drops every SYN
(Linux), exactly as a lost packet or a DROP rule would. A port is called silent only when every
dial of the probe's bound went unanswered; one that answers a later dial is fine."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from node_agent.probe import REDIAL_AT, connect_all


@contextmanager
def full_queue() -> Iterator[tuple[socket.socket, list[socket.socket]]]:
    """A listener with a backlog of 0, its one queue slot taken: the kernel drops further SYNs."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    filler = [socket.create_connection(server.getsockname(), timeout=2)]
    try:
        second = socket.socket()
        second.setblocking(False)
        second.connect_ex(server.getsockname())  # takes the slot (Linux queues backlog + 1)
        filler.append(second)
        time.sleep(0.05)
        yield server, filler
    finally:
        for s in [server, *filler]:
            s.close()


def test_a_port_that_answers_a_later_dial_is_not_blocked() -> None:
    with full_queue() as (server, _):
        target = f"127.0.0.1:{server.getsockname()[1]}"

        def drain() -> None:  # the queue frees up after 0.6 s: a later dial (or SYN) gets in
            time.sleep(0.6)
            server.settimeout(3)
            for _ in range(8):
                try:
                    server.accept()[0].close()
                except OSError:
                    return

        threading.Thread(target=drain, daemon=True).start()
        result, = connect_all([target], 4.0)
    assert result["ok"] is True and result["kind"] == "ok"
    assert result["attempts"] > 1  # the first dial went unanswered
    assert all(w > 0 for w in result["waited_ms"])


def test_a_port_silent_through_every_dial_is_a_timeout_that_says_how_many_and_how_long() -> None:
    with full_queue() as (server, _):
        target = f"127.0.0.1:{server.getsockname()[1]}"
        started = time.monotonic()
        result, = connect_all([target], 2.0)
        took = time.monotonic() - started
    assert result["ok"] is False and result["kind"] == "timeout"
    assert result["attempts"] == len(REDIAL_AT) == len(result["waited_ms"])
    assert result["waited_ms"][0] > result["waited_ms"][-1] > 0  # the first dial waited longest
    assert 1.9 < took < 3.0  # within the probe's own bound


def test_a_refusal_is_an_answer_at_once_not_retried() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        result, = connect_all([f"127.0.0.1:{port}"], 4.0)
    assert result["kind"] == "refused" and result["attempts"] == 1 and result["ms"] < 1000


def test_every_target_is_dialled_at_once_and_answers_in_order() -> None:
    with socket.socket() as a, socket.socket() as b:
        for s in (a, b):
            s.bind(("127.0.0.1", 0))
        a.listen(8)
        results = connect_all([f"127.0.0.1:{a.getsockname()[1]}", f"127.0.0.1:{b.getsockname()[1]}",
                               "no-such-host.invalid:1"], 2.0)
    assert [r["kind"] for r in results] == ["ok", "refused", "unresolved"]
