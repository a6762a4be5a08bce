"""Fixtures shared by the unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from job_dir import HOSTS


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    """A directory with hosts.toml (node0..node2) and train.py."""
    (tmp_path / "hosts.toml").write_text(HOSTS, encoding="utf-8")
    (tmp_path / "train.py").write_text("print('hi')\n", encoding="utf-8")
    return tmp_path
