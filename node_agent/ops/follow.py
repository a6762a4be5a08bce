"""Follows the files of a directory as they grow (a batch job's per-node output, on a shared
filesystem): each new file and each complete new line becomes an event, until the control
channel says STOP or closes."""

from __future__ import annotations

import os
import re
import threading
import time

from node_agent.wire.protocol import emit_event

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, BinaryIO, Dict, List

TICK_S = 1.0
MAX_LINE = 1 << 20  # a longer "line" (no newline) is passed on in pieces


class _Tail:
    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def read(self) -> List[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        self.offset += len(data)
        chunks = (self.partial + data).split(b"\n")
        self.partial = chunks.pop()
        if len(self.partial) > MAX_LINE:
            chunks.append(self.partial)
            self.partial = b""
        return [c.decode("utf-8", "replace").rstrip("\r") for c in chunks]


def scan(directory: str, pattern: "re.Pattern[str]", tails: Dict[str, _Tail]) -> None:
    """One pass: report new files (sorted), then every complete line added to the matching ones."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        names = []
    for name in names:
        if name not in tails and not name.endswith(".tmp"):
            tails[name] = _Tail(os.path.join(directory, name))
            emit_event("file", name=name)
    for name, tail in tails.items():
        if pattern.match(name):
            for text in tail.read():
                emit_event("line", name=name, text=text)


def follow(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    directory = str(request["dir"])
    pattern = re.compile(str(request.get("pattern") or ".*"))
    poll = float(request.get("poll", 0.2))
    done = threading.Event()

    def read_control() -> None:
        for raw in iter(control.readline, b""):
            if raw.strip() == b"STOP":
                break
        done.set()

    threading.Thread(target=read_control, daemon=True).start()
    tails: Dict[str, _Tail] = {}
    last_tick = time.monotonic()
    while True:
        stopping = done.is_set()
        scan(directory, pattern, tails)
        if stopping:  # one last pass after STOP: nothing written before it is lost
            return {"files": sorted(tails)}
        if time.monotonic() - last_tick >= TICK_S:  # the reader may want to look elsewhere
            last_tick = time.monotonic()
            emit_event("tick")
        done.wait(poll)
