"""Slow-host faults on a namespace cluster (../shared/CLUSTER-RECIPE.md, "A slow link and a slow
host"): a token-bucket rate limit on both ends of one host's link, and a CPU quota on everything a
host's sshd starts from now on. Each is a context manager that undoes itself."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from tests.cluster import Cluster, ClusterError

CPU_CGROUPS = Path("/sys/fs/cgroup/cpu")


def _tc(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30)


@contextmanager
def slow_link(cluster: Cluster, i: int, rate: str = "40mbit") -> Iterator[None]:
    """Host `i`'s link limited to `rate` both ways (tbf on eth0 inside, and on its bridge-side veth)."""
    h = cluster.hosts[i]
    spec = ["root", "tbf", "rate", rate, "burst", "64kb", "latency", "200ms"]
    _tc(["tc", "-n", h.netns, "qdisc", "add", "dev", "eth0", *spec])
    try:
        _tc(["tc", "qdisc", "add", "dev", h.veth, *spec])
        try:
            yield
        finally:
            with suppress(subprocess.CalledProcessError):
                _tc(["tc", "qdisc", "del", "dev", h.veth, "root"])
    finally:
        with suppress(subprocess.CalledProcessError):
            _tc(["tc", "-n", h.netns, "qdisc", "del", "dev", "eth0", "root"])


@contextmanager
def cpu_quota(cluster: Cluster, i: int, percent: int) -> Iterator[None]:
    """Every session host `i`'s sshd forks from now on gets `percent` % of one core (cgroup v1's
    cpu controller, as ../shared/CLUSTER-RECIPE.md has it)."""
    if not (CPU_CGROUPS / "cpu.cfs_quota_us").exists():
        raise ClusterError(f"no cgroup v1 cpu controller at {CPU_CGROUPS}: a host's CPU quota needs one")
    pid = cluster.sshd_pid(i)
    group = CPU_CGROUPS / f"{cluster.prefix}-{cluster.hosts[i].name}-slow"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(percent * 1000))
        (group / "cgroup.procs").write_text(str(pid))
        yield
    finally:
        for _ in range(3):  # move back every process in it (sessions forked meanwhile too), then remove it
            for line in (group / "cgroup.procs").read_text().split():
                with suppress(OSError):
                    (CPU_CGROUPS / "cgroup.procs").write_text(line)
            with suppress(OSError):
                os.rmdir(group)
                break
