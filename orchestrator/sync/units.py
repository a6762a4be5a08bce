"""Counts and lists of paths as sync's messages write them (sizes: orchestrator/sizes.py)."""

from __future__ import annotations

from collections.abc import Sequence


def count_text(n: int, what: str, plural: str | None = None) -> str:
    return f"{n} {what if n == 1 else plural or what + 's'}"


def names_text(names: Sequence[str], first: int = 3) -> str:
    """The first few names, then how many more: "a.py, b/c.py, d.py (+1 more)"."""
    shown = ", ".join(names[:first])
    return shown + (f" (+{len(names) - first} more)" if len(names) > first else "")
