"""The job file's `[sync]` table: copy the job's source directory to every host before it runs,
for hosts that share no filesystem with this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inventory.fields import check_keys, expect_bool, expect_str, expect_str_list
from inventory.specs import SyncSpec
from inventory.tomlsource import Reporter

SYNC_KEYS = ("src", "dest", "delete", "exclude", "gitignore", "checksum")




def read_sync(src: Reporter, key: str, table: dict[str, Any], base_dir: Path) -> SyncSpec:
    """Validate a [sync] table; every bad value is a located error naming its key."""
    check_keys(src, key, table, SYNC_KEYS)

    def k(name: str) -> str:
        return f"{key}.{name}"

    source = base_dir
    if "src" in table:
        text = expect_str(src, k("src"), table["src"])
        source = (base_dir / Path(text).expanduser()).resolve()
        if not source.is_dir():
            raise src.error(k("src"), f"{source} is not a directory",
                            f"src is relative to the job file's directory ({base_dir}); name the "
                            "directory to copy to the hosts", value=text)
    dest = None
    if "dest" in table:
        dest = expect_str(src, k("dest"), table["dest"])
        if "\n" in dest or "\0" in dest or dest != dest.strip():
            raise src.error(k("dest"), "dest has a newline or surrounding whitespace", value=dest)
    patterns = expect_str_list(src, k("exclude"), table.get("exclude", []))
    for i, pattern in enumerate(patterns):
        _check_pattern(src, f"{k('exclude')}[{i}]", pattern)
    return SyncSpec(src=source, dest=dest, delete=expect_bool(src, k("delete"), table.get("delete", True)),
                    exclude=tuple(patterns), gitignore=expect_bool(src, k("gitignore"), table.get("gitignore", True)),
                    checksum=expect_bool(src, k("checksum"), table.get("checksum", False)))


def _check_pattern(src: Reporter, key: str, pattern: str) -> None:
    if not pattern.strip() or "\n" in pattern:
        raise src.error(key, "an exclude pattern must be one non-empty line",
                        'write .gitignore-style patterns, e.g. "data/" or "*.ckpt"', value=pattern)
    import pathspec  # here, not at the top: every command loads job files, few have exclude patterns

    try:
        pathspec.GitIgnoreSpec.from_lines([pattern])
    except ValueError as err:
        raise src.error(key, f'"{pattern}" is not a .gitignore pattern: {err}',
                        'write e.g. "data/", "*.ckpt" or "/outputs"', value=pattern) from None
