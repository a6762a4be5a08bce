"""A file created to test whether a directory can be written (doctor's markers, with
node_agent/wire/layout.py's DOCTOR_MARKER_PREFIX), and its removal: only a file this process created
(O_EXCL) is ever removed. What went wrong goes into the sub-fact's dict (step, error, cleanup_error)."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Dict


def create_file(target: str, text: bytes, out: Dict[str, Any]) -> bool:
    """Create `target` (never a file already there) and write `text` in it; True: written. Else
    out gets step "write" and the OS error, and a file it created is removed."""
    created = False
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        created = True
        try:
            os.write(fd, text)
        finally:
            os.close(fd)  # a network filesystem reports a failed write here
        return True
    except OSError as exc:
        out.update(step="write", error=str(exc))
        if created:
            remove_file(target, out)
        return False


def remove_file(target: str, out: Dict[str, Any]) -> None:
    try:
        os.remove(target)
    except OSError as exc:
        out["cleanup_error"] = str(exc)
