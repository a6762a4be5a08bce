"""One error type for bad configuration input, located by file, line and key path."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class ConfigError(Exception):
    """Bad user input. Rendered by the CLI as one screen, exit code 2, no traceback."""

    message: str
    file: Path | None = None
    line: int | None = None
    column: int | None = None
    key: str | None = None  # dotted key path, e.g. "hosts[2].port"
    hint: str | None = None  # the fix, e.g. 'did you mean "workdir"?'

    def location(self) -> str:
        parts = []
        if self.file is not None:
            loc = str(self.file)
            if self.line is not None:
                loc += f":{self.line}"
                if self.column is not None:
                    loc += f":{self.column}"
            parts.append(loc)
        if self.key:
            # a key starting with "-" is a command-line flag (an override), not a file key
            parts.append(f"option {self.key}" if self.key.startswith("-") else f"key {self.key}")
        return ", ".join(parts)

    def __str__(self) -> str:
        where = self.location()
        text = f"{where}: {self.message}" if where else self.message
        if self.hint:
            text += f"\n  fix: {self.hint}"
        return text
