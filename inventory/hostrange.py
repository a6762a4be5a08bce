"""Expand pdsh/Slurm-style host ranges such as ``gpu[01-16]`` or ``rack[1-2]n[1,3,5-6]``."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

MAX_EXPANSION = 100_000

_ITEM = re.compile(r"^(?P<lo>\d+)(?:-(?P<hi>\d+))?$")


@dataclass(frozen=True)
class _Segment:
    """A piece of a pattern: literal text, or the choices written in one bracket group."""

    choices: tuple[str, ...]


def expand_hostnames(pattern: str) -> list[str]:
    """Return every name a range pattern stands for, in order (first group varies slowest).

    ``node[1-3]`` -> node1, node2, node3; ``gpu[01-16]`` keeps the zero padding;
    ``n[1,3,5-6]`` -> n1, n3, n5, n6. Raises ValueError on bad syntax, a reversed range,
    duplicate names or an expansion larger than MAX_EXPANSION.
    """
    if not pattern:
        raise ValueError("empty host pattern")
    segments = _split(pattern)
    total = 1
    for seg in segments:
        total *= len(seg.choices)
    if total > MAX_EXPANSION:
        raise ValueError(
            f"host pattern {pattern!r} expands to {total} names, more than {MAX_EXPANSION}"
        )
    names = ["".join(parts) for parts in itertools.product(*(s.choices for s in segments))]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"host pattern {pattern!r} yields {name!r} more than once")
        seen.add(name)
    return names


def is_range_pattern(text: str) -> bool:
    """True when `text` contains a bracket group and so may stand for several names."""
    return "[" in text or "]" in text


def _split(pattern: str) -> list[_Segment]:
    segments: list[_Segment] = []
    pos = 0
    while pos < len(pattern):
        open_at = pattern.find("[", pos)
        close_at = pattern.find("]", pos)
        if close_at != -1 and (open_at == -1 or close_at < open_at):
            raise ValueError(
                f"host pattern {pattern!r}: ']' at position {close_at + 1} has no matching '['"
            )
        if open_at == -1:
            segments.append(_Segment((pattern[pos:],)))
            break
        if open_at > pos:
            segments.append(_Segment((pattern[pos:open_at],)))
        if close_at == -1:
            raise ValueError(
                f"host pattern {pattern!r}: '[' at position {open_at + 1} is never closed"
            )
        inner = pattern[open_at + 1 : close_at]
        if "[" in inner:
            raise ValueError(f"host pattern {pattern!r}: nested '[' is not allowed")
        segments.append(_Segment(tuple(_expand_group(pattern, inner))))
        pos = close_at + 1
    return segments


def _expand_group(pattern: str, inner: str) -> list[str]:
    if not inner.strip():
        raise ValueError(f"host pattern {pattern!r}: empty brackets '[]'")
    out: list[str] = []
    for raw in inner.split(","):
        item = raw.strip()
        match = _ITEM.match(item)
        if match is None:
            raise ValueError(
                f"host pattern {pattern!r}: {item!r} inside brackets is not a number "
                "or a range like 1-4 or 01-16"
            )
        out.extend(_expand_item(pattern, match.group("lo"), match.group("hi")))
    return out


def _expand_item(pattern: str, lo_text: str, hi_text: str | None) -> list[str]:
    if hi_text is None:
        return [lo_text]
    lo, hi = int(lo_text), int(hi_text)
    if lo > hi:
        raise ValueError(
            f"host pattern {pattern!r}: range {lo_text}-{hi_text} is reversed "
            f"(write {hi_text}-{lo_text})"
        )
    if hi - lo + 1 > MAX_EXPANSION:
        raise ValueError(
            f"host pattern {pattern!r}: range {lo_text}-{hi_text} has more than "
            f"{MAX_EXPANSION} names"
        )
    width = len(lo_text) if lo_text.startswith("0") and len(lo_text) > 1 else 0
    return [str(n).zfill(width) for n in range(lo, hi + 1)]
