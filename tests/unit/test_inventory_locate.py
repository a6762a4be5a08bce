"""The key locator: dotted key paths map back to the right line/column of the TOML text."""

from __future__ import annotations

import pytest

from inventory.tomlsource import KeyIndex, parent_key, tomllib

TEXT = '''\
top = 1
# port = 99 (a comment, not a key)
[job]
script = "train.py"
notes = """
[fake]
port = 1
"""
args = [
  "--port=3",
  "x",
]
hosts = ["a", "b",
         "c"]
[[hosts]]
name = "n0"
[[hosts]]
name = "n1"
vars = { A = "1", B = 2 }
[hosts.env]
C = "3"
[[hosts]]
  name = "n2"   # indented
site.rack = "r1"
"quoted key" = 1
[rendezvous]
master_port = 29500
'''


@pytest.mark.parametrize(
    ("key", "value", "line", "column"),
    [
        ("top", None, 1, 7),
        ("job", None, 3, 6),
        ("job.script", None, 4, 10),
        ("job.notes", None, 5, 9),
        ("job.args", None, 9, 8),
        ("job.args[1]", None, 9, 8),  # array element without a value: the array's line
        ("job.hosts[2]", "c", 14, 10),  # element found by its quoted value
        ("hosts[0]", None, 15, 10),
        ("hosts[1].name", None, 18, 8),
        ("hosts[1].vars", None, 19, 8),
        ("hosts[1].vars.B", 2, 19, 19),  # inline table member found by name
        ("hosts[1].env.C", None, 21, 5),  # [hosts.env] belongs to the latest [[hosts]]
        ("hosts[2].name", None, 23, 10),
        ("hosts[2].site.rack", None, 24, 13),
        ("hosts[2].quoted key", None, 25, 16),
        ("rendezvous.master_port", None, 27, 15),
        ("rendezvous.missing", None, 26, 13),  # falls back to the table header
    ],
)
def test_find(key: str, value: object, line: int, column: int) -> None:
    tomllib.loads(TEXT)  # the sample is valid TOML
    pos = KeyIndex(TEXT).find(key, value)
    assert pos is not None
    assert (pos.line, pos.value_column) == (line, column)


def test_strings_and_comments_are_not_keys() -> None:
    index = KeyIndex(TEXT)
    assert index.find("fake") is None
    assert index.find("port") is None
    assert index.find("job.port") is not None  # falls back to [job] ...
    assert index.find("job.port").line == 3  # type: ignore[union-attr]  # ... not line 7


def test_key_column_for_unknown_keys() -> None:
    pos = KeyIndex("[job]\n  scirpt = 1\n").find("job.scirpt")
    assert pos is not None
    assert (pos.line, pos.column) == (2, 3)


@pytest.mark.parametrize(
    ("key", "parent"),
    [("hosts[2].env.A", "hosts[2].env"), ("hosts[2]", "hosts"), ("job", ""), ("a.b", "a")],
)
def test_parent_key(key: str, parent: str) -> None:
    assert parent_key(key) == parent
