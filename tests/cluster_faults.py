"""Slow-host faults on a namespace cluster (../shared/CLUSTER-RECIPE.md, "A slow link and a slow
host"): a token-bucket rate limit on both ends of one host's link, a CPU quota on everything a
host's sshd starts from now on, and a job's store cut off from one host once its part of the job
runs. Each is a context manager that undoes itself."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from tests.cluster import Cluster, ClusterError
from tests.cluster_sys import all_netns_pids

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


Process = tuple[int, list[str], dict[str, str]]  # host index, argv, environment


def job_processes(cluster: Cluster, job_prefix: str) -> dict[int, Process]:
    """pid -> (host, argv, environment) of every process on the cluster whose DDPCTL_JOB_ID starts
    with `job_prefix` (one pass over /proc)."""
    needle = f"DDPCTL_JOB_ID={job_prefix}".encode()
    pids = all_netns_pids([h.netns for h in cluster.hosts])
    found: dict[int, Process] = {}
    for i, host in enumerate(cluster.hosts):
        for pid in pids[host.netns]:
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
            except OSError:
                continue
            if any(e.startswith(needle) for e in environ):
                env = dict(e.decode(errors="replace").partition("=")[::2] for e in environ if b"=" in e)
                found[pid] = (i, [a.decode(errors="replace") for a in cmdline], env)
    return found


@contextmanager
def store_cut_once_started(cluster: Cluster, i: int, job_prefix: str = "ddpctl-deep-") -> Iterator[list[str]]:
    """Host `i`'s packets to a per-host job's coordinator (its DDPCTL_COORDINATOR, host:port) dropped
    from the moment its part of the job runs (before, doctor's own probe of that port would find the
    firewall first). Yields the list the cut store's host:port is appended to."""
    cut: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.2):
            stores = {env["DDPCTL_COORDINATOR"] for host, _argv, env in job_processes(cluster, job_prefix).values()
                      if host == i and "DDPCTL_COORDINATOR" in env}
            if stores:
                addr, _, port = stores.pop().rpartition(":")
                cluster.iptables(i, "-I", "OUTPUT", "-p", "tcp", "-d", addr, "--dport", port, "-j", "DROP")
                cut.append(f"{addr}:{port}")
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield cut
    finally:
        done.set()
        watcher.join(5)
        for store in cut:
            addr, _, port = store.rpartition(":")
            cluster.iptables(i, "-D", "OUTPUT", "-p", "tcp", "-d", addr, "--dport", port, "-j", "DROP")
