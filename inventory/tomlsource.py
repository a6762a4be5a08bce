"""Read a TOML file and map dotted key paths back to their line and column in the source."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from inventory.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

_KEY_PART = r"""(?:[A-Za-z0-9_-]+|"[^"\n]*"|'[^'\n]*')"""
_DOTTED = rf"{_KEY_PART}(?:\s*\.\s*{_KEY_PART})*"
_ARRAY_HEADER = re.compile(rf"^\s*\[\[\s*(?P<name>{_DOTTED})\s*\]\]")
_TABLE_HEADER = re.compile(rf"^\s*\[\s*(?P<name>{_DOTTED})\s*\]")
_KEY_VALUE = re.compile(rf"^(?P<indent>\s*)(?P<key>{_DOTTED})\s*=\s*")
_PART = re.compile(_KEY_PART)
_DECODE_AT = re.compile(r"\s*\(at line (?P<line>\d+), column (?P<col>\d+)\)\s*$")
_DECODE_END = re.compile(r"\s*\(at end of document\)\s*$")
_INDEX_SUFFIX = re.compile(r"\[\d+\]$")
BOM = "\ufeff"
MAX_NESTING = 32
"""Most levels a key path or a value may nest (dotted key parts; arrays and inline tables inside
each other). No ddpctl setting nests more than 4, and tomllib recurses once per bracket (a few
hundred exhaust Python's stack) and slows quadratically with a key's parts: deeper is refused
before the file reaches it."""
NESTING_HINT = ("no ddpctl setting nests that deep: args is one flat array of strings "
                '(args = ["--lr", "0.1"]) and tables nest at most [[hosts]] > env')


@dataclass(frozen=True)
class Position:
    """Where a key (and its value) starts in the source; 1-based."""

    line: int
    column: int
    value_column: int


class Reporter(Protocol):
    """Something that turns a key path and a message into a located ConfigError."""

    def error(
        self, key: str, message: str, hint: str | None = None, *, value: object = None
    ) -> ConfigError: ...

    def key_error(self, key: str, message: str, hint: str | None = None) -> ConfigError: ...


def join_key(prefix: str, name: str) -> str:
    """Append one key to a dotted path (`join_key("hosts[0]", "port")` -> "hosts[0].port")."""
    return f"{prefix}.{name}" if prefix else name


def parent_key(key: str) -> str:
    """The enclosing key path: "hosts[2].env.A" -> "hosts[2].env" -> "hosts[2]" -> "hosts"."""
    if _INDEX_SUFFIX.search(key):
        return _INDEX_SUFFIX.sub("", key)
    dot = key.rfind(".")
    return key[:dot] if dot != -1 else ""


def _parts(dotted: str) -> list[str]:
    return [p.strip("\"'") for p in _PART.findall(dotted)]


@dataclass(frozen=True)
class TooDeep:
    """Where the text first nests past MAX_NESTING: the line, column and the key it belongs to."""

    line: int
    column: int
    key: str
    what: str  # "value" (arrays and inline tables), "key" / "header" / "inline key" (dotted key parts)

    def message(self) -> str:
        if self.what == "value":
            where = f"the value of {self.key}" if self.key else "a value"
            return f"{where} nests arrays or inline tables more than {MAX_NESTING} levels deep"
        where = {"header": "a table header",
                 "inline key": f"a dotted key in the value of {self.key}",
                 "key": f"a dotted key in [{self.key}]" if self.key else "a dotted key"}[self.what]
        return f"{where} has more than {MAX_NESTING} parts"


@dataclass
class _ScanState:
    prefix: str = ""
    array_counts: dict[str, int] = field(default_factory=dict)
    depth: int = 0  # open [ / { of a value that spans lines
    in_string: str | None = None  # delimiter of an open multi-line string
    line: int = 0
    value_key: str = ""  # the key whose value is being scanned
    dots: int = 0  # "." since the last separator of a value: an inline table's dotted key
    too_deep: TooDeep | None = None

    def deeper(self, column: int, what: str, key: str | None = None) -> None:
        if self.too_deep is None:
            self.too_deep = TooDeep(self.line, column, self.value_key if key is None else key, what)


class KeyIndex:
    """Best-effort map from dotted key path to position, built by scanning the text once."""

    def __init__(self, text: str) -> None:
        self._lines = text.splitlines()
        self._positions: dict[str, Position] = {}
        state = _ScanState()
        for number, line in enumerate(self._lines, start=1):
            state.line = number
            self._scan_line(state, number, line)
        self.too_deep = state.too_deep  # the first place the text nests past MAX_NESTING

    def find(self, key: str, value: object = None) -> Position | None:
        """Position of `key`, else of its nearest located ancestor (refined by `value`)."""
        probe = key
        while probe:
            pos = self._positions.get(probe)
            if pos is not None:
                return pos if probe == key else self._refine(pos, key, value)
            probe = parent_key(probe)
        return None

    def _refine(self, pos: Position, key: str, value: object) -> Position:
        """Inside an ancestor's value: look for the key name or the quoted value itself."""
        last = re.split(r"[.\[]", key)[-1].rstrip("]")
        needles: list[re.Pattern[str]] = []
        if isinstance(value, str):
            needles.append(re.compile(re.escape(f'"{value}"') + "|" + re.escape(f"'{value}'")))
        if last and not last.isdigit():
            needles.append(re.compile(rf"(?<![\w-]){re.escape(last)}\s*="))
        next_lines = [p.line for p in self._positions.values() if p.line > pos.line]
        stop = min(next_lines, default=len(self._lines) + 1)
        for needle in needles:
            for number in range(pos.line, stop):
                text = self._lines[number - 1]
                start = pos.value_column - 1 if number == pos.line else 0
                match = needle.search(text, start)
                if match:
                    return Position(number, match.start() + 1, match.start() + 1)
        return pos

    def _scan_line(self, state: _ScanState, number: int, line: str) -> None:
        if state.in_string is not None or state.depth > 0:
            self._skip_value(state, line, 0)
            return
        header = _ARRAY_HEADER.match(line) or _TABLE_HEADER.match(line)
        if header and len(_parts(header.group("name"))) > MAX_NESTING:
            state.deeper(header.start("name") + 1, "header", "")
            return
        header = _ARRAY_HEADER.match(line)
        if header:
            *outer, last = _parts(header.group("name"))
            path = join_key(self._resolve(state, outer), last)
            index = state.array_counts.get(path, 0)
            state.array_counts[path] = index + 1
            state.prefix = f"{path}[{index}]"
            self._record(state.prefix, number, header.start("name") + 1, header.end() + 1)
            return
        header = _TABLE_HEADER.match(line)
        if header:
            state.prefix = self._resolve(state, _parts(header.group("name")))
            self._record(state.prefix, number, header.start("name") + 1, header.end() + 1)
            return
        pair = _KEY_VALUE.match(line)
        if pair:
            parts = _parts(pair.group("key"))
            if len(parts) > MAX_NESTING:
                state.deeper(pair.start("key") + 1, "key", state.prefix)
                return
            key = state.prefix
            for part in parts:
                key = join_key(key, part)
            self._record(key, number, pair.start("key") + 1, pair.end() + 1)
            state.value_key, state.dots = key, 0
            self._skip_value(state, line, pair.end())

    @staticmethod
    def _resolve(state: _ScanState, parts: list[str]) -> str:
        path = ""
        for part in parts:
            path = join_key(path, part)
            if path in state.array_counts:  # [hosts.env] after [[hosts]]: the latest element
                path = f"{path}[{state.array_counts[path] - 1}]"
        return path

    def _record(self, key: str, line: int, column: int, value_column: int) -> None:
        self._positions.setdefault(key, Position(line, column, value_column))

    @staticmethod
    def _skip_value(state: _ScanState, line: str, pos: int) -> None:
        """Advance over strings and comments, tracking multi-line strings and bracket depth."""
        i = 0 if state.in_string is not None else pos
        while i < len(line):
            if state.in_string is not None:
                end = _find_close(line, i, state.in_string)
                if end == -1:
                    return
                state.in_string = None
                i = end
                continue
            ch = line[i]
            if ch == "#":
                return
            if line.startswith('"""', i) or line.startswith("'''", i):
                state.in_string = line[i : i + 3]
                i += 3
            elif ch in "\"'":
                state.in_string = ch
                i += 1
                end = _find_close(line, i, ch)
                state.in_string = None  # single-line strings never span lines
                i = len(line) if end == -1 else end
            else:
                KeyIndex._count_nesting(state, ch, i + 1)
                i += 1

    @staticmethod
    def _count_nesting(state: _ScanState, ch: str, column: int) -> None:
        """Bracket depth, and the dots of an inline table's dotted key (a number has one at most)."""
        if ch in "[{":
            state.depth += 1
            if state.depth > MAX_NESTING:
                state.deeper(column, "value")
        elif ch in "]}":
            state.depth = max(0, state.depth - 1)
        elif ch == ".":
            state.dots += 1
            if state.dots >= MAX_NESTING:
                state.deeper(column, "inline key")
            return
        elif ch not in ",=":
            return
        state.dots = 0


def _find_close(line: str, start: int, delim: str) -> int:
    """Index just past the closing `delim` from `start`, or -1; basic strings honour `\\`."""
    i = start
    while i < len(line):
        if delim[0] == '"' and line[i] == "\\":
            i += 2
            continue
        if line.startswith(delim, i):
            return i + len(delim)
        i += 1
    return -1


@dataclass(frozen=True)
class TomlFile:
    """A parsed TOML document that can locate its own keys for error messages."""

    path: Path
    data: dict[str, Any]
    index: KeyIndex

    def error(
        self, key: str, message: str, hint: str | None = None, *, value: object = None
    ) -> ConfigError:
        pos = self.index.find(key, value)
        return ConfigError(
            message,
            file=self.path,
            line=pos.line if pos else None,
            column=pos.value_column if pos else None,
            key=key or None,
            hint=hint,
        )

    def key_error(self, key: str, message: str, hint: str | None = None) -> ConfigError:
        """Like `error`, but points at the key itself rather than its value."""
        pos = self.index.find(key)
        return ConfigError(
            message,
            file=self.path,
            line=pos.line if pos else None,
            column=pos.column if pos else None,
            key=key or None,
            hint=hint,
        )

    def line_of(self, key: str) -> int | None:
        pos = self.index.find(key)
        return pos.line if pos else None


@dataclass(frozen=True)
class FlagReporter:
    """Reports errors in a command-line override by naming its flag instead of a file line."""

    flag: str

    def error(
        self, key: str, message: str, hint: str | None = None, *, value: object = None
    ) -> ConfigError:
        return ConfigError(message, key=self.flag, hint=hint)

    def key_error(self, key: str, message: str, hint: str | None = None) -> ConfigError:
        return ConfigError(message, key=self.flag, hint=hint)


def read_text(path: Path, what: str) -> str:
    """Read a UTF-8 config file, turning OS errors into ConfigError.

    One leading byte-order mark (Windows editors write one) is dropped, so the text, and every
    line and column reported later, are those of the same file saved without it."""
    if path.is_dir():  # checked first: reading a directory fails differently across platforms
        raise directory_error(path, what)
    try:
        return path.read_text(encoding="utf-8").removeprefix(BOM)
    except FileNotFoundError:
        raise ConfigError(
            f"{what} not found", file=path, hint="check the path (relative paths start at cwd)"
        ) from None
    except IsADirectoryError:
        raise directory_error(path, what) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{what} is not valid UTF-8 (byte {exc.start})", file=path, hint="save it as UTF-8"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what}: {exc.strerror}", file=path) from None


def directory_error(path: Path, what: str) -> ConfigError:
    """`what` was given a directory: say so, and name the TOML files inside it that it may mean."""
    inside = toml_files_in(path)
    hint = f"give the path of the {what} itself, not of its directory"
    if inside:
        hint += "; it holds " + ", ".join(str(p) for p in inside)
    return ConfigError(f"{what} is a directory, not a file", file=path, hint=hint)


def toml_files_in(directory: Path, limit: int = 3) -> list[Path]:
    """Up to `limit` *.toml files directly in `directory`, sorted; none when it cannot be read."""
    try:
        return sorted(p for p in directory.glob("*.toml") if p.is_file())[:limit]
    except OSError:
        return []


def read_toml(path: Path, what: str = "config file") -> TomlFile:
    """Parse `path`; syntax errors become ConfigError with the line/column tomllib reports, and
    nesting past MAX_NESTING one located where it starts, before tomllib sees it."""
    text = read_text(path, what)
    index = KeyIndex(text)
    if index.too_deep is not None:
        raise _too_deep_error(path, index.too_deep)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _decode_error(path, text, exc) from None
    except RecursionError:  # a nesting the scan missed: still one located error, never a traceback
        raise ConfigError(f"{what} nests too deeply for the TOML parser", file=path, hint=NESTING_HINT) from None
    return TomlFile(path=path, data=data, index=index)


def _too_deep_error(path: Path, deep: TooDeep) -> ConfigError:
    return ConfigError(deep.message(), file=path, line=deep.line, column=deep.column, key=deep.key or None,
                       hint=NESTING_HINT)


def _decode_error(path: Path, text: str, exc: tomllib.TOMLDecodeError) -> ConfigError:
    message = str(exc.args[0]) if exc.args else str(exc)
    line: int | None = getattr(exc, "lineno", None)
    column: int | None = getattr(exc, "colno", None)
    at = _DECODE_AT.search(message)
    if at:
        line, column = int(at.group("line")), int(at.group("col"))
        message = message[: at.start()]
    elif _DECODE_END.search(message):
        message = _DECODE_END.sub("", message) + " (at end of file)"
        line = max(1, len(text.splitlines()))
        column = None
    return ConfigError(
        f"invalid TOML: {message}",
        file=path,
        line=line,
        column=column,
        hint="fix the TOML syntax at that position (strings need quotes, tables [name])",
    )
