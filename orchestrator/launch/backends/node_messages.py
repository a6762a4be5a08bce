"""A node supervisor's messages (node_agent/runtime/records.py builds them) as backend events,
decoded in one place for the SSH and the Slurm backend. A message that does not decode is a ddpctl
bug, but never the job's end: it is reported once per host and kind of fault, naming the host, the
message and why it does not decode, and left out; the thread that follows the host goes on (issue
54: one such message killed the thread that re-attaches, and the host never ended)."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import HostError
from orchestrator.launch.backends.base import Emit
from orchestrator.launch.events import Alive, Checkpointed, Milestone, Notice, Problem, Sampled, Started
from orchestrator.remote.agent import AgentEvent, AgentResult
from orchestrator.remote.wire import SuperviseResult, parse_checkpoint, parse_rank_phase, parse_sample, parse_supervise

NodeEvent = Started | Problem | Alive | Milestone | Sampled | Checkpointed
EXCERPT = 300  # characters of an undecodable message shown in its report


def node_event(host: str, event: AgentEvent) -> NodeEvent:
    """A node's event as the backend event it is; the host's HostError where it does not decode."""
    if event.name == "started":
        return Started(host, event.get("log"), event.get("hostname"))
    if event.name == "error":
        return Problem(host, str(event.get("message")))
    if event.name == "rank":
        return Milestone(host, parse_rank_phase(event.fields, host))
    if event.name == "sample":
        return Sampled(host, parse_sample(event.fields, host))
    if event.name == "checkpoint":
        return Checkpointed(host, parse_checkpoint(event.fields, host))
    return Alive(host)  # an event this version does not know: the host is there


def undecodable(error: HostError, message: Mapping[str, Any]) -> str:
    """The report of a message that does not decode: the host, what it was and why, and the message."""
    text = json.dumps(dict(message), sort_keys=True, default=str)
    shown = text if len(text) <= EXCERPT else text[:EXCERPT] + "…"
    return (f"{error.host}: {error.message}; it is left out and the job goes on ({error.fix}: please report "
            f"it with this message: {shown})")


@dataclass
class NodeMessages:
    """One host's messages decoded, across its sessions (a re-attach replays what it sent before):
    each fault that keeps one from decoding is reported once, through `emit`, as a Notice."""

    host: str
    emit: Emit
    reported: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def event(self, message: AgentEvent) -> NodeEvent | None:
        """The message's backend event; None where it does not decode (reported)."""
        try:
            return node_event(self.host, message)
        except HostError as exc:
            self._report(exc, message.fields)
            return None

    def result(self, message: AgentResult) -> SuperviseResult:
        """The node's closing report; where it does not decode (reported), a failed one that says
        so, so that the host still ends (over SSH its exit status is the agent's own)."""
        try:
            return parse_supervise(message.data, self.host)
        except HostError as exc:
            self._report(exc, message.data)
            return SuperviseResult(1, error=f"its report did not decode: {exc.message}")

    def _report(self, error: HostError, message: Mapping[str, Any]) -> None:
        with self.lock:
            if error.message in self.reported:
                return
            self.reported.add(error.message)
        self.emit(Notice(self.host, undecodable(error, message)))
