"""Plain-text lines for sync progress (logs, pipes, the Python API); the terminal view is rich's."""

from __future__ import annotations

from orchestrator.sync.core import HostSync, SyncEvent, SyncPlanned
from orchestrator.sync.diff import Changes


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def count_text(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def changes_text(c: Changes, dry_run: bool = False) -> str:
    if c.empty:
        return f"up to date ({count_text(c.unchanged, 'file')})"
    parts = []
    if c.send:
        verb = "to send" if dry_run else "sent"
        parts.append(f"{count_text(len(c.send), 'file')} ({size_text(c.send_bytes)}) {verb}")
    if c.remove:
        parts.append(f"{len(c.remove)} {'to remove' if dry_run else 'removed'}")
    if c.chmod:
        parts.append(f"{len(c.chmod)} mode change{'' if len(c.chmod) == 1 else 's'}")
    parts.append(f"{c.unchanged} unchanged")
    return ", ".join(parts)


def sync_line(event: SyncEvent) -> str | None:
    """One line per host when its changes are known and when it is done; none per chunk."""
    if isinstance(event, SyncPlanned):
        c = event.changes
        if c.empty:
            return None  # the done line says "up to date"
        return (f"sync {event.host}: {count_text(len(c.send), 'file')} ({size_text(c.send_bytes)}) to send, "
                f"{len(c.remove)} to remove -> {event.root}")
    if isinstance(event, HostSync):
        if event.dry_run:
            return f"sync {event.host}: {changes_text(event.changes, True)} (dry run, {event.root})"
        return f"sync {event.host}: {changes_text(event.changes)} in {event.duration_s:.1f}s ({event.root})"
    return None
