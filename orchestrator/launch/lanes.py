"""The supervision's inbox: control events (exits, milestones, losses) always ahead of output.

Output batches wait in a bounded lane: a backend thread that brings one more blocks until the
supervision has taken one, so a chatty job's backlog stays on its hosts (in their logs), never in
our memory, and fail-fast never waits behind it.
"""

from __future__ import annotations

import threading
from collections import deque

from orchestrator.launch.events import BackendEvent, Output

OUTPUT_BATCHES = 32  # output batches waiting (all hosts together)


class Lanes:
    def __init__(self, max_output: int = OUTPUT_BATCHES) -> None:
        self.cond = threading.Condition()
        self.control: deque[BackendEvent] = deque()
        self.output: deque[Output] = deque()
        self.max_output = max_output

    def put(self, event: BackendEvent) -> None:
        """Queue an event (from any thread); an output batch waits for room."""
        with self.cond:
            if isinstance(event, Output):
                while len(self.output) >= self.max_output:
                    self.cond.wait()
                self.output.append(event)
            else:
                self.control.append(event)
            self.cond.notify_all()

    def get(self, timeout: float) -> BackendEvent | None:
        """The next control event, else the next output batch; None after `timeout` with neither."""
        with self.cond:
            if not self.control and not self.output:
                self.cond.wait(timeout)
            if self.control:
                return self.control.popleft()
            if self.output:
                event = self.output.popleft()
                self.cond.notify_all()  # room for a waiting producer
                return event
            return None

    def empty(self) -> bool:
        with self.cond:
            return not self.control and not self.output
