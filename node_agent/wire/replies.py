"""Every reply and event record the node agent sends the control plane, declared once: here and in
replies_ports.py, replies_run.py, replies_jobs.py, replies_top.py, replies_gpu.py and
replies_facts.py (one module per group of ops: each frozen dataclass costs its importer ~0.5 ms on
the host, so an op loads only its own; the facts op builds its sub-facts as plain dicts).

The agent builds these and sends `wire(reply)` (their fields are the JSON keys); the control plane
decodes the same classes from their annotations (orchestrator/remote/wire.py `decode`). A field
that only the control plane fills (`host`: the inventory's name for the host) defaults to "".
The annotations are strings never evaluated here (python >= 3.8, no `typing` import on the host).
"""

from __future__ import annotations

from dataclasses import asdict

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Dict, Sequence


def wire(reply: Any) -> Dict[str, Any]:
    """A reply as its JSON object: the dataclass's fields, nested ones too (tuples as lists, keys as
    strings, as JSON has them)."""
    return _plain(asdict(reply))  # type: ignore[no-any-return]


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def one_line(argv: Sequence[str]) -> str:
    """A command line for a table cell: arguments joined, newlines and runs of spaces collapsed."""
    return " ".join(" ".join(argv).split())
