"""A fake GPU host on the test cluster: the fake nvidia-smi (tests/fixtures/nvidia_smi/nvidia-smi,
replaying a recording) bind-mounted over /usr/local/sbin, the first directory of root's PATH over
SSH, inside one host's own mount namespace (its sshd's: `ip netns exec` gives each its own), so no
other host sees it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.cluster import Cluster
from tests.cluster_sys import read_pid
from tests.unit.top_fakes import install_fake_nvidia_smi

ON_PATH = "/usr/local/sbin"  # first on root's PATH in an SSH session; empty on this machine


@contextmanager
def fake_nvidia_smi(cluster: Cluster, i: int, recording: str, where: Path) -> Iterator[None]:
    """Host i's nvidia-smi replays `recording` while inside the block."""
    pid = read_pid(cluster.hosts[i].sshd_pid_file)
    assert pid is not None
    install_fake_nvidia_smi(where, recording)
    enter = ["nsenter", "-t", str(pid), "-m", "--"]
    done = subprocess.run([*enter, "mount", "--bind", str(where), ON_PATH], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    try:
        yield
    finally:
        subprocess.run([*enter, "umount", ON_PATH], capture_output=True, check=False)


