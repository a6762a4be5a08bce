"""Sync progress for people: on a terminal a live line per host (files and bytes sent of the
total), and a line per host when it is done; plain lines (orchestrator/sync/text.py) otherwise."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text

from orchestrator.sizes import size_text
from orchestrator.sync.core import HostSync, SyncEvent, SyncPlanned, SyncSent
from orchestrator.sync.text import sync_line


@dataclass
class _Host:
    files: int
    total: int
    landed: int = 0
    sent: int = 0


class SyncView:
    def __init__(self, live: bool) -> None:
        self.live = live  # a live display shows progress: print only the done lines
        self.active: dict[str, _Host] = {}

    def update(self, event: SyncEvent) -> str | None:
        """Record the event; returns the line to print for it, if any."""
        if isinstance(event, SyncPlanned):
            if not event.changes.empty:
                self.active[event.host] = _Host(len(event.changes.send), event.changes.send_bytes)
            return None if self.live else sync_line(event)
        if isinstance(event, SyncSent):
            host = self.active.get(event.host)
            if host is not None:
                host.sent += event.nbytes
                host.landed += event.files
            return None
        assert isinstance(event, HostSync)
        self.active.pop(event.host, None)
        return sync_line(event)

    def status(self) -> Text:
        text = Text()
        for name, h in list(self.active.items()):
            text.append(f" {name} ", style="bold")
            text.append(f"⇡ {h.landed}/{h.files} files {size_text(h.sent)}/{size_text(h.total)} ",
                        style="cyan")
        return text
