"""`ddpctl up` across cluster hosts beyond test_launch_cluster.py: host order, auto nproc, lost host.

The main multi-host scenarios (ranks static/c10d, verbatim args, sshd down, unauthorized key,
fail-fast, SIGINT/SIGKILL, link down, stale/foreign port holders, detach/ps/logs/down) live in
test_launch_cluster.py and are not repeated here.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cluster import Cluster
from tests.ddpctl_run import ddpctl_argv, no_job_processes, only_summary, run_ddpctl, ssh_args, wait_for, write_job

pytestmark = pytest.mark.cluster

LOST_AFTER = 10.0  # --lost-after: the test's own, short limit

IDENTITY = re.compile(r"^\[(node\d):(\d)\]\s+rank=(\d) local_rank=(\d) world_size=(\d) node_rank=(\d) "
                      r"params_identical=True", re.MULTILINE)


def test_hosts_override_reorders_node_ranks_and_moves_the_master(cluster2: Cluster, tmp_path: Path) -> None:
    job = write_job(tmp_path, cluster2, "reorder", ["--epochs", "1"], nproc=1)
    runs = tmp_path / "runs"
    out = run_ddpctl("up", str(job), "--hosts", "node1,node0", "--runs-dir", str(runs), *ssh_args(cluster2))
    assert out.returncode == 0, out.stderr[-3000:]
    found = sorted(m.groups() for m in IDENTITY.finditer(out.stdout))
    # (host label, global rank in the label, rank, local_rank, world_size, node_rank)
    assert found == [("node0", "1", "1", "0", "2", "1"), ("node1", "0", "0", "0", "2", "0")]
    summary = only_summary(runs)
    assert [h["host"] for h in summary["hosts"]] == ["node1", "node0"]
    node1_addr = cluster2.hosts[1].address
    for host in summary["hosts"]:
        argv = shlex.split(host["command"])
        assert argv[argv.index("--master-addr") + 1] == node1_addr
    wait_for(lambda: no_job_processes(cluster2, summary["job_id"]), 30, "no job process left")


def test_dry_run_resolves_auto_nproc_and_port_over_ssh(cluster2: Cluster, tmp_path: Path) -> None:
    job = write_job(tmp_path, cluster2, "dry-auto", ["--epochs", "1"], env={"WANDB_API_KEY": "s3cret"})
    job.write_text(job.read_text().replace("nproc_per_node = 2", 'nproc_per_node = "cpu"'))
    out = run_ddpctl("up", str(job), "--dry-run", *ssh_args(cluster2), timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    commands = [shlex.split(line.split("command: ", 1)[1]) for line in out.stdout.splitlines() if "command: " in line]
    assert len(commands) == 2
    cpus = str(len(os.sched_getaffinity(0)))
    for argv in commands:
        port = argv[argv.index("--master-port") + 1]
        assert port.isdigit() and int(port) > 0
        assert argv[argv.index("--nproc-per-node") + 1] in (cpus, str(os.cpu_count()))
    assert "WANDB_API_KEY=***" in out.stdout and "s3cret" not in out.stdout
    assert not (tmp_path / "runs").exists()


CHATTY = """
import os, time
rank = int(os.environ["RANK"])
for i in range(100000):
    print(f"tick rank={rank} i={i}", flush=True)
    time.sleep(0.05)
"""


def test_lost_host_is_noticed_while_another_host_keeps_printing(
        make_cluster: Callable[[int], Cluster], tmp_path: Path) -> None:
    """A silent (lost) host must be noticed even when the other host's output never pauses."""
    cluster = make_cluster(2)
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    job = write_job(tmp_path, cluster, "chatty", script=script, nproc=1)
    out_path = tmp_path / "chatty.out"
    with out_path.open("w") as out:
        proc = subprocess.Popen(ddpctl_argv("up", str(job), "--grace", "3", "--runs-dir", str(tmp_path / "runs"),
                                            "--lost-after", str(LOST_AFTER), *ssh_args(cluster)),
                                stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_for(lambda: "tick rank=1 " in out_path.read_text() and "tick rank=0 " in out_path.read_text(),
                 120, "both hosts to print")
        cluster.link_down(1)
        try:
            proc.wait(timeout=LOST_AFTER + 45)
        except subprocess.TimeoutExpired:
            pytest.fail(f"ddpctl did not notice node1 was lost within {LOST_AFTER + 45:.0f}s while node0 "
                        "kept printing")
        output = out_path.read_text()
        assert proc.returncode != 0
        assert "node1 lost" in output
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
