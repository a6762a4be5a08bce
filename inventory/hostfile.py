"""Read a DeepSpeed/MPI-style hostfile (``worker-1 slots=4``) into an Inventory."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from inventory.errors import ConfigError
from inventory.fields import MAX_NPROC_PER_NODE, is_ascii_digits
from inventory.model import Host, Inventory
from inventory.tomlsource import read_text

HOSTFILE_KEYS = ("slots", "max_slots")
_NAME_BAD = re.compile(r"[\x00-\x1f\x7f=]")


@dataclass(frozen=True)
class HostfileEntry:
    """One non-blank line of a hostfile."""

    name: str
    slots: int | None
    max_slots: int | None
    line: int


@dataclass(frozen=True)
class _Field:
    key: str
    value: int


def load_hostfile(path: Path) -> Inventory:
    """Parse `path`; every error names the file and line. Blank lines and # comments skipped."""
    path = Path(path)
    text = read_text(path, "hostfile")
    entries: list[HostfileEntry] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        entry = parse_hostfile_line(path, number, raw)
        if entry is None:
            continue
        if entry.name in seen:
            raise ConfigError(
                f'host "{entry.name}" is listed twice (lines {seen[entry.name]} and {number})',
                file=path,
                line=number,
                hint="remove one of the two lines",
            )
        seen[entry.name] = number
        entries.append(entry)
    if not entries:
        raise ConfigError(
            "hostfile lists no hosts",
            file=path,
            hint='add one line per host, e.g. "worker-1 slots=4"',
        )
    hosts = tuple(Host(name=e.name, address=e.name, slots=e.slots) for e in entries)
    return Inventory(hosts=hosts, source=path)


def parse_hostfile_line(path: Path, number: int, raw: str) -> HostfileEntry | None:
    """One line -> entry, or None for blank/comment lines."""
    text = raw.split("#", 1)[0].strip()
    if not text:
        return None
    name, *fields = text.split()
    if name.startswith("-") or _NAME_BAD.search(name):
        raise ConfigError(
            f'"{name}" is not a host name',
            file=path,
            line=number,
            column=raw.find(name) + 1,
            hint='each line is "HOSTNAME slots=N"',
        )
    values: dict[str, int] = {}
    for field_text in fields:
        parsed = _parse_field(path, number, raw, field_text)
        values[parsed.key] = parsed.value
    slots, max_slots = values.get("slots"), values.get("max_slots")
    if slots is not None and max_slots is not None and max_slots < slots:
        raise ConfigError(
            f"max_slots={max_slots} is smaller than slots={slots}",
            file=path,
            line=number,
            key="max_slots",
            hint="max_slots must be at least slots",
        )
    return HostfileEntry(name=name, slots=slots, max_slots=max_slots, line=number)


def _parse_field(path: Path, number: int, raw: str, field_text: str) -> _Field:
    column = raw.find(field_text) + 1
    key, sep, value = field_text.partition("=")
    if not sep:
        raise ConfigError(
            f'expected key=value after the host name, got "{field_text}"',
            file=path,
            line=number,
            column=column,
            hint="write slots=N (one host per line)",
        )
    if key not in HOSTFILE_KEYS:
        close = difflib.get_close_matches(key, HOSTFILE_KEYS, n=1)
        raise ConfigError(
            f'unknown hostfile key "{key}"',
            file=path,
            line=number,
            column=column,
            key=key,
            hint=f'did you mean "{close[0]}"?' if close else "known keys: slots, max_slots",
        )
    if not is_ascii_digits(value) or not 1 <= int(value) <= MAX_NPROC_PER_NODE:
        raise ConfigError(
            f'{key} must be a whole number from 1 to {MAX_NPROC_PER_NODE}, got "{value}"',
            file=path,
            line=number,
            column=column + len(key) + 1,
            key=key,
            hint=f"write {key}=4",
        )
    return _Field(key, int(value))
