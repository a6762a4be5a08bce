"""orchestrator/sizes.py: the one way ddpctl writes a byte count (sync, prune, top, doctor --bandwidth)."""

from __future__ import annotations

import pytest

from orchestrator.sizes import size_text


@pytest.mark.parametrize(("n", "si", "text"), [
    (0, False, "0 B"),
    (1023, False, "1023 B"),
    (1024, False, "1.0 KiB"),
    (2 << 10, False, "2.0 KiB"),
    (3 << 20, False, "3.0 MiB"),
    (20 << 20, False, "20 MiB"),
    (64 << 20, False, "64 MiB"),
    (3 << 30, False, "3.0 GiB"),
    (1536 << 30, False, "1536 GiB"),
    (999, True, "999 B"),
    (1500, True, "1.5 kB"),
    (4_200_000, True, "4.2 MB"),
    (120_000_000, True, "120 MB"),
    (2 * 10**9, True, "2.0 GB"),
])
def test_a_size_has_one_decimal_below_ten_of_its_unit_and_none_from_there(n: int, si: bool, text: str) -> None:
    assert size_text(n, si=si) == text
