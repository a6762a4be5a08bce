"""A supervisor's link to the control plane: the ranks' output is sent from the node's log file by
one non-blocking sender, in committed batches (docs/architecture.md, "The node supervisor")."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import threading
import time
from collections import deque

from node_agent.wire.protocol import EVENT_PREFIX, RESULT_PREFIX

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

HEARTBEAT_EVERY = 2.0  # seconds between heartbeats when nothing else is sent
BATCH = 1 << 18  # log bytes per batch (then its commit line)
WRITE_POLL_S = 0.25  # a blocked write looks this often whether its sink was replaced
ORPHAN_WAIT_S = 1.0  # the job has ended and no sink is left: how long a re-attach may still come


def event_line(name: str, **fields: Any) -> bytes:
    payload = dict(fields)
    payload["event"] = name
    return (EVENT_PREFIX + json.dumps(payload, sort_keys=True, default=str) + "\n").encode()


def result_line(result: Dict[str, Any]) -> bytes:
    return (RESULT_PREFIX + json.dumps(result, sort_keys=True, default=str) + "\n").encode()


def batch_of(data: bytes, start: int, commit: bool = True) -> Tuple[bytes, int]:
    """What to send of `data` (the log from offset `start`, not empty): its whole lines and their
    commit line, and the log offset after them. A line longer than `data` goes in pieces."""
    cut = data.rfind(b"\n") + 1 or len(data)
    lines = data[:cut] if data[cut - 1:cut] == b"\n" else data[:cut] + b"\n"
    return lines + (event_line("out", end=start + cut) if commit else b""), start + cut


class Sink:
    """One way to the control plane: the SSH session's stdout (a pipe, made non-blocking), or a
    re-attached session's relay on the attach socket (sent with MSG_DONTWAIT)."""

    def __init__(self, name: str, fd: Optional[int] = None, sock: Optional[socket.socket] = None) -> None:
        self.name = name
        self.fd = fd
        self.sock = sock
        self.dead = False
        if fd is not None:
            os.set_blocking(fd, False)

    def _send(self, view: memoryview) -> int:
        if self.sock is not None:
            return self.sock.send(view, socket.MSG_DONTWAIT)
        assert self.fd is not None
        return os.write(self.fd, view)

    def _wait(self) -> None:
        target = self.sock.fileno() if self.sock is not None else self.fd
        if target is not None:
            select.select([], [target], [], WRITE_POLL_S)

    def write(self, data: bytes, current: Callable[[], bool]) -> bool:
        """Write all of `data` unless the sink dies or stops being `current`; True when written."""
        view = memoryview(data)
        while view:
            if self.dead or not current():
                return False
            try:
                view = view[self._send(view):]
            except (BlockingIOError, InterruptedError):
                self._wait()
            except OSError:
                self.dead = True
                return False
        return True

    def close(self) -> None:
        self.dead = True
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()


class Uplink:
    """The sender: events first, then the log's next batch with its commit, to the current sink."""

    def __init__(self, log_path: str, commit: bool = True,
                 on_lost: Optional[Callable[[str], None]] = None,
                 heard: Optional[Callable[[], float]] = None,
                 replay: Optional[Callable[[], List[bytes]]] = None) -> None:
        self.log_path = log_path
        self.commit = commit  # commit lines (a re-attachable session); a batch job's file needs none
        self.on_lost = on_lost  # the current sink died (the control plane closed it)
        self.heard = heard  # seconds since the control plane was last heard (sent with heartbeats)
        self.cond = threading.Condition()
        self.log_end = 0
        self.log_done = False
        self.events: Deque[bytes] = deque()
        self.sink: Optional[Sink] = None
        self.next_sink: Optional[Sink] = None
        self.next_offset = 0
        self.sent = 0  # log offset sent (and committed) to the current sink
        self.final: Optional[bytes] = None
        self.delivered = threading.Event()
        self.replay = replay or (lambda: [])  # events a re-attached sink gets again
        self.closed = False

    # -- from other threads ---------------------------------------------------------------
    def grew(self, end: int) -> None:
        with self.cond:
            self.log_end = end
            self.cond.notify()

    def log_finished(self) -> None:
        with self.cond:
            self.log_done = True
            self.cond.notify()

    def event(self, name: str, **fields: Any) -> None:
        self.message(event_line(name, **fields))

    def message(self, line: bytes) -> None:
        """An event line built already (node_agent/runtime/records.py builds a record's)."""
        with self.cond:
            self.events.append(line)
            self.cond.notify()

    def attach(self, sink: Sink, offset: int) -> None:
        """A re-attached session: from now on it is the sink, resuming the log at `offset`."""
        with self.cond:
            if self.next_sink is not None:
                self.next_sink.close()
            self.next_sink, self.next_offset = sink, max(0, min(offset, self.log_end))
            self.cond.notify()

    def is_current(self, sink: Sink) -> bool:
        with self.cond:
            return (self.next_sink or self.sink) is sink

    def finish(self, result: Dict[str, Any], wait_s: float) -> bool:
        """Send the op's result after the last of the log. Waits while a sink may still take it:
        up to wait_s for a stuck one (a control plane cut off may re-attach to read the end), a
        moment where none is left (its connection closed). False: it went nowhere (state.json
        has it for a later attach)."""
        with self.cond:
            self.final = result_line(result)
            self.cond.notify()
        deadline = time.monotonic() + wait_s
        orphaned = None  # since when no sink is left
        while not self.delivered.wait(0.1) and time.monotonic() < deadline:
            with self.cond:
                alive = self.next_sink is not None or (self.sink is not None and not self.sink.dead)
            orphaned = None if alive else (orphaned or time.monotonic())
            if orphaned is not None and time.monotonic() - orphaned > ORPHAN_WAIT_S:
                break
        with self.cond:
            self.closed = True
            self.cond.notify()
        return self.delivered.is_set()

    # -- the sender thread -------------------------------------------------------------------
    def run(self) -> None:
        with open(self.log_path, "rb") as log:
            self._loop(log)

    def _loop(self, log: Any) -> None:
        last_sent = time.monotonic()
        while True:
            with self.cond:
                while not self._work():
                    if self.closed:
                        return
                    self.cond.wait(max(0.05, HEARTBEAT_EVERY - (time.monotonic() - last_sent)))
                    if time.monotonic() - last_sent >= HEARTBEAT_EVERY and self.sink is not None:
                        heard = {"heard_s": round(self.heard(), 1)} if self.heard is not None else {}
                        self.events.append(event_line("heartbeat", **heard))
                if self.closed and self.sink is None and self.next_sink is None:
                    return
                if self.next_sink is not None:
                    old, self.sink, self.next_sink = self.sink, self.next_sink, None
                    self.sent = self.next_offset
                    self.events.appendleft(event_line("attached", offset=self.sent))
                    self.events.extend(self.replay())
                    if old is not None and old.fd is None:
                        old.close()
                sink = self.sink
                events, self.events = list(self.events), deque()
                start, end = self.sent, min(self.log_end, self.sent + BATCH)
                final = self.final if self.log_done and end == self.log_end else None
            if sink is None:
                continue
            if self._send(sink, log, events, start, end, final):
                last_sent = time.monotonic()

    def _work(self) -> bool:
        """Something to send now (called with the lock held)."""
        if self.next_sink is not None:
            return True
        if self.sink is None or self.sink.dead:
            return False
        return bool(self.events) or self.log_end > self.sent or \
            (self.final is not None and self.log_done and not self.delivered.is_set())

    def _send(self, sink: Sink, log: Any, events: List[bytes], start: int, end: int,
              final: Optional[bytes]) -> bool:
        current = lambda: self.is_current(sink)  # noqa: E731
        if events and not sink.write(b"".join(events), current):
            return self._dropped(sink)
        if end > start:  # the log holds whole lines: a batch is cut at its last one
            log.seek(start)
            payload, sent = batch_of(log.read(end - start), start, self.commit)
            if not sink.write(payload, current):
                return self._dropped(sink)
            with self.cond:
                if self.sink is sink:
                    self.sent = sent
        if final is not None and not self._more():
            if not sink.write(final, current):
                return self._dropped(sink)
            self.delivered.set()
            with self.cond:
                self.closed = True
                if self.sink is sink:
                    self.sink = None
            if sink.sock is not None:
                sink.close()
        return True

    def _more(self) -> bool:
        with self.cond:
            return self.log_end > self.sent

    def _dropped(self, sink: Sink) -> bool:
        """A write did not complete: the sink was replaced (fine) or died (the control plane's
        connection is gone, unless a re-attached one has taken over)."""
        with self.cond:
            replaced = self.next_sink is not None
            if self.sink is sink:
                self.sink = None
        if not replaced and sink.dead and self.on_lost is not None:
            self.on_lost("control connection lost (%s closed)" % sink.name)
        return False
