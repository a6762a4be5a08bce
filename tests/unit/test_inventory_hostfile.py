"""DeepSpeed/MPI hostfiles: parsing, comments, known keys only, located errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from inventory import ConfigError, load_hostfile, load_inventory


def write(tmp_path: Path, text: str, name: str = "hostfile") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_hostfile_hosts_slots_comments(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "# cluster\n\nworker-1 slots=4\nworker-2 slots=2 max_slots=8  # big one\n198.18.0.12\n",
    )
    inv = load_inventory(path)  # not .toml -> hostfile
    assert inv.source == path
    assert inv.names() == ["worker-1", "worker-2", "198.18.0.12"]
    assert [h.slots for h in inv.hosts] == [4, 2, None]
    assert all(h.address == h.name for h in inv.hosts)
    assert inv.hosts[0].python == "python3"


@pytest.mark.parametrize(
    ("text", "line", "message", "hint"),
    [
        ("a slots=4\nb slot=4\n", 2, 'unknown hostfile key "slot"', 'did you mean "slots"?'),
        ("a slots=4\nb gpus=4\n", 2, 'unknown hostfile key "gpus"', "known keys: slots"),
        ("a slots=four\n", 1, 'slots must be a whole number from 1 to 1024, got "four"', "slots=4"),
        ("a slots=0\n", 1, "slots must be a whole number from 1 to 1024", "slots=4"),
        ("a slots=1025\n", 1, 'slots must be a whole number from 1 to 1024, got "1025"', "slots=4"),
        ("a slots=\u00b2\n", 1, 'slots must be a whole number from 1 to 1024, got "\u00b2"', "slots=4"),
        ("a 4\n", 1, 'expected key=value after the host name, got "4"', "slots=N"),
        ("a slots=2\n\n# x\na slots=3\n", 4, 'host "a" is listed twice (lines 1 and 4)', None),
        ("a slots=4 max_slots=2\n", 1, "max_slots=2 is smaller than slots=4", None),
        ("-oProxyCommand=x\n", 1, "is not a host name", None),
        ("# only a comment\n\n", None, "hostfile lists no hosts", "one line per host"),
    ],
)
def test_hostfile_errors(
    tmp_path: Path, text: str, line: int | None, message: str, hint: str | None
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_hostfile(path)
    err = info.value
    assert message in err.message
    assert err.file == path
    assert err.line == line
    if hint is not None:
        assert err.hint is not None and hint in err.hint
    assert str(path) in str(err)


def test_hostfile_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="hostfile not found"):
        load_inventory(tmp_path / "nope")
