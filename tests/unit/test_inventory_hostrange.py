"""Host range expansion: plain names, ranges, padding, lists, several groups, and errors."""

from __future__ import annotations

import pytest

from inventory.hostrange import MAX_EXPANSION, expand_hostnames, is_range_pattern


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("node0", ["node0"]),
        ("198.18.0.10", ["198.18.0.10"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("gpu[01-03]", ["gpu01", "gpu02", "gpu03"]),
        ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),
        ("n[9-11]", ["n9", "n10", "n11"]),
        ("n[001-002]", ["n001", "n002"]),
        ("n[1,3,5-6]", ["n1", "n3", "n5", "n6"]),
        ("n[1, 3]", ["n1", "n3"]),
        ("n[05]", ["n05"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("[1-2].example", ["1.example", "2.example"]),
        ("198.18.0.[10-12]", ["198.18.0.10", "198.18.0.11", "198.18.0.12"]),
        ("n[1,01]", ["n1", "n01"]),
    ],
)
def test_expand_hostnames(pattern: str, expected: list[str]) -> None:
    assert expand_hostnames(pattern) == expected


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("", "empty host pattern"),
        ("node[3-1]", "range 3-1 is reversed (write 1-3)"),
        ("node[1-3", "'[' at position 5 is never closed"),
        ("node1-3]", "']' at position 8 has no matching '['"),
        ("node[]", "empty brackets"),
        ("node[a-c]", "'a-c' inside brackets is not a number"),
        ("node[1,,2]", "'' inside brackets is not a number"),
        ("node[1-2-3]", "'1-2-3' inside brackets is not a number"),
        ("n[[1-2]]", "nested '['"),
        ("n[1,1]", "yields 'n1' more than once"),
        (f"n[0-{MAX_EXPANSION}]", "more than"),
        ("a[0-999]b[0-999]", "expands to 1000000 names"),
    ],
)
def test_expand_hostnames_errors(pattern: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        expand_hostnames(pattern)
    assert message in str(info.value)
    if pattern:
        assert repr(pattern) in str(info.value)


def test_is_range_pattern() -> None:
    assert is_range_pattern("n[1-2]")
    assert not is_range_pattern("node1")
