"""`ddpctl up` across real hosts: ranks, c10d, faults, fail-fast, no orphans, stale ports, detach."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cluster import Cluster
from tests.ddpctl_run import (
    ddpctl_argv,
    no_job_processes,
    only_summary,
    run_ddpctl,
    ssh_args,
    wait_for,
    write_job,
)

pytestmark = pytest.mark.cluster

IDENTITY = re.compile(r"rank=(\d) local_rank=(\d) world_size=(\d) node_rank=(\d) params_identical=(\w+)")
NASTY = 'a b "c" \'d\' $(touch {marker}) ; echo pwned `id` \\ end'


def identities(stdout: str) -> dict[int, tuple[int, int, int, str, str]]:
    """rank -> (local_rank, world_size, node_rank, params_identical, host label)."""
    found = {}
    for line in stdout.splitlines():
        m = IDENTITY.search(line)
        if m:
            host = line.split("]")[0].lstrip("[").split(":")[0]
            found[int(m.group(1))] = (int(m.group(2)), int(m.group(3)), int(m.group(4)), m.group(5), host)
    return found


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_two_hosts_two_processes_each_get_the_right_ranks(cluster2: Cluster, tmp_path: Path, backend: str) -> None:
    job = write_job(tmp_path, cluster2, f"ranks-{backend}", ["--epochs", "1"], backend=backend)
    runs = tmp_path / "runs"
    out = run_ddpctl("up", str(job), "--runs-dir", str(runs), *ssh_args(cluster2))
    assert out.returncode == 0, out.stderr[-2000:]
    ids = identities(out.stdout)
    assert sorted(ids) == [0, 1, 2, 3]
    assert all(world == 4 and same == "True" for _l, world, _n, same, _h in ids.values())
    for rank, (local, _w, node, _s, host) in ids.items():
        assert local == rank % 2
        assert host == f"node{node}"
        if backend == "static":
            assert node == rank // 2
    summary = only_summary(runs)
    assert summary["exit_code"] == 0 and [h["exit_code"] for h in summary["hosts"]] == [0, 0]
    for name in ("node0", "node1"):
        assert "params_identical=True" in (runs / summary["job_id"] / f"{name}.log").read_text()
    if backend == "c10d":
        assert "--rdzv-backend c10d" in summary["hosts"][0]["command"]
        assert f"--rdzv-id {summary['job_id']}" in summary["hosts"][0]["command"]
        # the hosts' names resolve nowhere (the cluster's default): each is given its own address
        for i, host in enumerate(summary["hosts"]):
            assert f"--local-addr {cluster2.hosts[i].address}" in host["command"], host["command"]


def test_arguments_reach_the_remote_script_verbatim(cluster2: Cluster, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    nasty = NASTY.format(marker=marker)
    job = write_job(tmp_path, cluster2, "verbatim", ["--epochs", "1", "--echo-args", nasty, "x;y"])
    out = run_ddpctl("up", str(job), "--runs-dir", str(tmp_path / "runs"), *ssh_args(cluster2))
    assert out.returncode == 0, out.stderr[-2000:]
    echoed = [json.loads(line.split("ARGS ", 1)[1]) for line in out.stdout.splitlines() if "ARGS [" in line]
    assert len(echoed) == 4
    assert all(args == ["--epochs", "1", "--echo-args", nasty, "x;y"] for args in echoed)
    assert not marker.exists()
    texts = [line.split("]", 1)[1].strip() for line in out.stdout.splitlines() if "]" in line]
    assert "pwned" not in texts  # `echo pwned` never ran


def test_stopped_sshd_fails_fast_naming_the_host(make_cluster: Callable[[int], Cluster], tmp_path: Path) -> None:
    cluster = make_cluster(2)
    cluster.stop_sshd(1)
    out = run_ddpctl("up", str(write_job(tmp_path, cluster, "nosshd")), *ssh_args(cluster), timeout=60)
    assert out.returncode == 1
    assert f"node1: {cluster.hosts[1].address}:22 (node1) refused the connection" in out.stderr
    assert "sudo systemctl start ssh" in out.stderr
    assert "Traceback" not in out.stderr


def test_unauthorized_key_is_reported_as_the_key_refused(
        make_cluster: Callable[[int], Cluster], tmp_path: Path) -> None:
    cluster = make_cluster(2)
    cluster.unauthorize_key(0)
    out = run_ddpctl("up", str(write_job(tmp_path, cluster, "nokey")), *ssh_args(cluster), timeout=60)
    assert out.returncode == 1
    assert f"node0: root@{cluster.hosts[0].address}:22 (node0) refused every key offered: {cluster.key}" \
        in out.stderr
    assert f"ssh-copy-id -i {cluster.key}.pub root@{cluster.hosts[0].address}" in out.stderr


def test_a_failing_rank_stops_every_host_and_names_host_rank_and_error(cluster2: Cluster, tmp_path: Path) -> None:
    job = write_job(tmp_path, cluster2, "failfast", ["--epochs", "200", "--steps-delay", "0.05",
                                                     "--fail-rank", "3", "--fail-at-step", "3"])
    runs = tmp_path / "runs"
    out = run_ddpctl("up", str(job), "--grace", "3", "--runs-dir", str(runs), *ssh_args(cluster2))
    assert out.returncode != 0
    assert "first failure: rank 3 on node1 (node_rank 1, local rank 1): RuntimeError: injected failure: " \
           "rank 3 at step 3" in out.stderr
    # the job had failed: torchrun was ended outright on both hosts, not sent a SIGTERM that every
    # torchrun reports with a traceback of its own saying nothing of the cause
    assert "SignalException" not in out.stdout + out.stderr
    summary = only_summary(runs)
    assert summary["first_failure"] == "node1"
    wait_for(lambda: no_job_processes(cluster2, summary["job_id"]), 30, "no process of the failed job left")


def start_long_job(cluster: Cluster, tmp_path: Path, name: str) -> tuple[subprocess.Popen[str], Path]:
    job = write_job(tmp_path, cluster, name, ["--epochs", "1000", "--steps-delay", "0.1"])
    runs = tmp_path / "runs"
    log = (tmp_path / f"{name}.out").open("w")
    proc = subprocess.Popen(ddpctl_argv("up", str(job), "--grace", "3", "--runs-dir", str(runs),
                                        *ssh_args(cluster)),
                            stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    wait_for(lambda: "epoch=" in (tmp_path / f"{name}.out").read_text(), 120, "training to start")
    return proc, runs


def running_job_id(runs: Path) -> str:
    (run_dir,) = list(runs.iterdir())
    return run_dir.name


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "sigkill"])
def test_ddpctl_interrupted_or_killed_leaves_no_job_process(
        cluster2: Cluster, tmp_path: Path, sig: signal.Signals) -> None:
    proc, runs = start_long_job(cluster2, tmp_path, f"stop-{sig.name.lower()}")
    job_id = running_job_id(runs)
    assert any(cluster2.job_pids(i, job_id) for i in range(2))
    try:
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    if sig == signal.SIGINT:
        assert proc.returncode == 130
        assert only_summary(runs)["interrupted"] is True
    wait_for(lambda: no_job_processes(cluster2, job_id), 45, "the supervisors to end every job process")


def listener(cluster: Cluster, port: int, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    # SO_REUSEADDR like torchrun's store: the previous job's connections may sit in TIME_WAIT
    code = (f"import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            f"s.bind(('', {port})); s.listen(); print('up', flush=True); time.sleep(600)")
    import os
    proc = cluster.exec_in(0, [sys.executable, "-c", code], env={**os.environ, **(env or {})},
                           stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"up"
    return proc


def test_stale_listener_of_an_earlier_job_is_freed_and_a_foreign_one_blocks(cluster2: Cluster, tmp_path: Path) -> None:
    port = 29631
    stale = listener(cluster2, port, {"DDPCTL_JOB_ID": "old-job-1234"})
    job = write_job(tmp_path, cluster2, "stale", ["--epochs", "1"], port=port)
    out = run_ddpctl("up", str(job), "--runs-dir", str(tmp_path / "runs"), *ssh_args(cluster2))
    assert out.returncode == 0, out.stderr[:2000] + "\n...\n" + out.stderr[-2000:]
    assert f"freed master port {port} on node0: killed pid(s) {stale.pid}" in out.stderr
    assert "old-job-1234" in out.stderr
    assert stale.wait(timeout=10) is not None
    foreign = listener(cluster2, port)
    try:
        blocked = run_ddpctl("up", str(job), "--runs-dir", str(tmp_path / "runs2"), *ssh_args(cluster2))
        assert blocked.returncode == 1
        assert f"master port {port} on node0 is held by pid {foreign.pid}" in blocked.stderr
        assert "kill-port" in blocked.stderr and foreign.poll() is None
    finally:
        foreign.kill()
        foreign.wait()


def test_detach_ps_logs_down_round_trip(cluster2: Cluster, tmp_path: Path) -> None:
    job = write_job(tmp_path, cluster2, "detached", ["--epochs", "1000", "--steps-delay", "0.1", "--echo-args"])
    inv = ["-i", str(cluster2.hosts_toml), *ssh_args(cluster2)]
    up = run_ddpctl("up", str(job), "--detach", "--runs-dir", str(tmp_path / "runs"), *ssh_args(cluster2))
    assert up.returncode == 0, up.stderr
    job_id = json.loads(next((tmp_path / "runs").glob("*/detached.json")).read_text())["job_id"]

    def listed() -> list[dict[str, object]]:
        ps = run_ddpctl("ps", "--json", "--job", job_id, *inv)
        jobs = json.loads(ps.stdout)["jobs"]
        return jobs if len(jobs) == 2 else []

    jobs = wait_for(listed, 60, "ps to list the job on both hosts")
    assert sorted((j["host"], j["node_rank"]) for j in jobs) == [("node0", 0), ("node1", 1)]
    wait_for(lambda: "epoch=" in run_ddpctl("logs", job_id, *inv).stdout, 90, "logs to show training")
    logs = run_ddpctl("logs", job_id, *inv).stdout
    assert "[node0:0] epoch=" in logs  # labelled host:global rank, as `up` labels them
    for label in ("node0:0", "node0:1", "node1:2", "node1:3"):
        assert f"[{label}] ARGS " in logs
    down = run_ddpctl("down", job_id, "--grace", "3", *inv)
    assert down.returncode == 0
    assert f"node0: stopped {job_id}" in down.stdout and f"node1: stopped {job_id}" in down.stdout
    wait_for(lambda: no_job_processes(cluster2, job_id), 30, "no process of the detached job left")
    assert json.loads(run_ddpctl("ps", "--json", "--job", job_id, *inv).stdout)["jobs"] == []
