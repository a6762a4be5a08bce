"""The job file's `[sync]` table: copy the job's source directory to every host before it runs,
for hosts that share no filesystem with this machine."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from inventory.fields import check_keys, expect_bool, expect_str, expect_str_list
from inventory.tomlsource import Reporter

SYNC_KEYS = ("src", "dest", "delete", "exclude", "gitignore", "checksum")


@dataclass(frozen=True)
class SyncSpec:
    """What `up` (and `ddpctl sync`) copies where. A host's copy lands in its own `workdir`, else
    in `dest`, else at the same path as `src` (the layout a shared filesystem would give)."""

    src: Path  # absolute: the directory whose contents every host gets
    dest: str | None = None  # on the hosts; relative paths and "~" are from the login's home
    delete: bool = True  # remove files the source no longer has (excluded ones are kept)
    exclude: tuple[str, ...] = ()  # .gitignore-style patterns, relative to src
    gitignore: bool = True  # also skip what the .gitignore files under src ignore
    checksum: bool = False  # compare contents (SHA-256), not size + modification time

    def root_for(self, workdir: str | None) -> str:
        """Where a host's copy of `src` lands, given the host's own workdir setting."""
        if workdir is not None:
            return workdir
        return self.dest if self.dest is not None else str(self.src)

    def job_dir_in(self, root: str, base_dir: Path) -> str:
        """The job file's directory inside a host's copy (the job runs there, as it would here)."""
        try:
            rel = base_dir.relative_to(self.src)
        except ValueError:
            return root
        return root if rel == Path(".") else str(PurePosixPath(root) / rel.as_posix())


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
