"""Byte counts as people read them: the one way every message and table of ddpctl writes a size."""

from __future__ import annotations

BINARY = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
DECIMAL = (("GB", 10**9), ("MB", 10**6), ("kB", 10**3))


def size_text(n: int, *, si: bool = False) -> str:
    """`n` bytes in the largest unit it reaches, with one decimal below 10 and none from there:
    binary units (`3.0 MiB`, `20 MiB`), or with `si` decimal ones (`1.5 kB`, `120 MB`: prune's)."""
    for unit, scale in DECIMAL if si else BINARY:
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value >= 10 else f"{value:.1f} {unit}"
    return f"{n} B"
