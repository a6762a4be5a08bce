"""A held agent session: one host's running op whose events and result arrive in order, read as
they come (`wait_for` one event, or `batches()` of everything), with a control channel to send it
lines (`send`, `start`). Doctor's facts op and the TCP probe run in one, and a launch holds it
open to start the host's torchrun in it (`start`: the supervise op)."""

from __future__ import annotations

import collections
import json
import queue
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import HostError, HostErrorKind
from orchestrator.remote.agent import AgentEvent, AgentResult, AgentStream, Batched, agent_failed
from orchestrator.remote.transport import OutputLine

_EOF = AgentEvent("eof", {})
QUEUED_BATCHES = 16  # a held session's batches not yet read: bounded, so a chatty job's backlog
# stays on its host (in its log) instead of in our memory


@dataclass
class Session:
    """One host's running facts op: its events and result, in order, as they arrive."""

    host: str
    running: AgentStream
    events: queue.Queue[list[Batched]] = field(default_factory=lambda: queue.Queue(QUEUED_BATCHES))
    early: dict[str, AgentEvent] = field(default_factory=dict)  # read while waiting for another
    unread: collections.deque[Batched] = field(default_factory=collections.deque)

    def pump(self) -> None:
        try:
            for batch in self.running.batches():
                self.events.put(batch)
        finally:
            self.events.put([_EOF])

    def start(self, request: Mapping[str, Any]) -> None:
        """A held launch session runs `request` (the supervise op's); `batches()` follows it."""
        self.send("START", dict(request))

    def batches(self) -> Iterator[list[Batched]]:
        """Every message not read yet, in batches (program output as bare text), until the
        session ends."""
        if self.unread:
            batch, self.unread = list(self.unread), collections.deque()
            if _EOF in batch:
                yield batch[:batch.index(_EOF)]
                return
            yield batch
        while True:
            batch = self.events.get()
            if batch and batch[-1] is _EOF:
                if len(batch) > 1:
                    yield batch[:-1]
                return
            yield batch

    def _next(self, timeout: float) -> Batched:
        if not self.unread:
            self.unread.extend(self.events.get(timeout=timeout))
        return self.unread.popleft()

    def wait_for(self, name: str, deadline: float) -> AgentEvent | AgentResult:
        """The next `name` event (name "result": the op's result); an early result, EOF or the
        deadline is this host's error. Another event read on the way is kept for its own wait (a
        host may send `connected` before its `facts`)."""
        if name in self.early:
            return self.early.pop(name)
        while True:
            try:
                message = self._next(max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise HostError(self.host, HostErrorKind.TIMEOUT,
                                f"the node agent sent no {name} in time",
                                "check the host's load, or raise --timeout") from None
            if isinstance(message, (list, str, OutputLine)):
                continue  # not the agent's: kept in running.other for error messages
            if isinstance(message, AgentResult):
                if name == "result" and message.error is None:
                    return message
                if message.error is not None:
                    raise agent_failed(self.host, message.error)
            elif message.name == name:
                return message
            elif message is not _EOF:
                self.early[message.name] = message
            if isinstance(message, AgentResult) or message is _EOF:
                detail = "\n".join(self.running.other[-5:]) or "(no output)"
                raise HostError(self.host, HostErrorKind.AGENT,
                                f"the node agent stopped before sending {name}: {detail}",
                                "check that python3 (>= 3.8) runs on the host in a "
                                "non-interactive shell")

    def send(self, command: str, payload: dict[str, Any]) -> None:
        self.running.send(f"{command} {json.dumps(payload)}\n".encode())
