"""The wire between the control plane and an agent: one JSON request line in, event lines and one
result line out, stdin kept open as the control channel (docs/architecture.md, "The agent's wire")."""

from __future__ import annotations

import json
import sys
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, BinaryIO, Dict, Optional

EVENT_PREFIX = "@@DDPCTL-EVENT@@ "
RESULT_PREFIX = "@@DDPCTL-RESULT@@ "
PROTOCOL_VERSION = 1

_out_lock = threading.Lock()


def write_line(text: str) -> None:
    """Write one whole line to stdout, atomically with respect to other agent threads."""
    with _out_lock:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def emit_event(event: str, **fields: Any) -> None:
    payload = dict(fields)
    payload["event"] = event
    write_line(EVENT_PREFIX + json.dumps(payload, sort_keys=True, default=str))


def emit_result(result: Dict[str, Any]) -> None:
    write_line(RESULT_PREFIX + json.dumps(result, sort_keys=True, default=str))


def read_request(stream: BinaryIO, line: "Optional[bytes]" = None) -> Dict[str, Any]:
    """The request: `line` when the bootstrap has read it already, else stdin's next line."""
    line = stream.readline() if line is None else line
    if not line:
        raise ValueError("no request on stdin")
    request = json.loads(line.decode("utf-8"))
    if not isinstance(request, dict) or "op" not in request:
        raise ValueError("request must be a JSON object with an 'op' key")
    return request


def parse_line(text: str) -> "Optional[Dict[str, Any]]":
    """For the orchestrator: the JSON of an event/result line, or None for program output."""
    for prefix in (EVENT_PREFIX, RESULT_PREFIX):
        if text.startswith(prefix):
            data = json.loads(text[len(prefix):])  # type: Dict[str, Any]
            if prefix == RESULT_PREFIX:
                data = {"event": "result", "result": data}
            return data
    return None
