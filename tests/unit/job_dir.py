"""A job file's directory for inventory tests (the `cluster` fixture in conftest.py makes one):
hosts.toml (node0..node2) beside train.py."""

from __future__ import annotations

import textwrap
from pathlib import Path

HOSTS = """\
[defaults]
user = "ddp"

[[hosts]]
name = "node[0-2]"
address = "198.18.0.[10-12]"
"""


def write_job(directory: Path, text: str, name: str = "job.toml") -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path
