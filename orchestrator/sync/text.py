"""Plain-text lines for sync progress (logs, pipes, the Python API); the terminal view is rich's."""

from __future__ import annotations

from orchestrator.sizes import size_text
from orchestrator.sync.core import HostSync, SyncEvent, SyncPlanned
from orchestrator.sync.diff import Changes
from orchestrator.sync.units import count_text, names_text


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


def details_text(c: Changes, dry_run: bool = False, removed_dirs: int = 0) -> str:
    """What the counts do not say: the files removed (the first few), the host's own files left
    alone, and the paths where the host's file was kept instead of the source's."""
    parts = []
    verb = "would remove" if dry_run else "removed"
    if c.remove:
        parts.append(f"{verb} {count_text(len(c.remove), 'file')} no longer in the source: {names_text(c.remove)}")
    if removed_dirs:
        parts.append(f"{verb} {count_text(removed_dirs, 'emptied directory', 'emptied directories')}")
    if c.kept:
        parts.append(f"kept {count_text(c.kept, 'file')} the host made")
    if c.conflicts:
        listed = names_text([f"{x.path} ({x.why.value})" for x in c.conflicts])
        parts.append(f"not overwritten, the host's own: {listed}; delete them on the host to take the source's, "
                     "or exclude them")
    return "".join(f"; {p}" for p in parts)


def sync_line(event: SyncEvent) -> str | None:
    """One line per host when its changes are known and when it is done; none per chunk."""
    if isinstance(event, SyncPlanned):
        c = event.changes
        if c.empty:
            return None  # the done line says "up to date"
        return (f"sync {event.host}: {count_text(len(c.send), 'file')} ({size_text(c.send_bytes)}) to send, "
                f"{len(c.remove)} to remove -> {event.root}")
    if isinstance(event, HostSync):
        c = event.changes
        if event.dry_run:
            return (f"sync {event.host}: {changes_text(c, True)} (dry run, {event.root})"
                    f"{details_text(c, True, len(c.rmdirs))}")
        return (f"sync {event.host}: {changes_text(c)} in {event.duration_s:.1f}s ({event.root})"
                f"{details_text(c, False, event.removed_dirs)}")
    return None
