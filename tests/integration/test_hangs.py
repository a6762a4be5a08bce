"""Hangs on the real cluster: `ddpctl stacks`, the --hang-timeout watchdog, doctor pre-launch finds."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import Cluster
from tests.ddpctl_run import no_job_processes, only_summary, run_ddpctl, ssh_args, wait_for, write_job

pytestmark = pytest.mark.cluster


def stacks_json(cluster: Cluster, job: str) -> dict[str, Any]:
    out = run_ddpctl("stacks", job, "-i", str(cluster.hosts_toml), "--json", *ssh_args(cluster), timeout=120)
    return json.loads(out.stdout) if out.stdout.strip().startswith("{") else {"groups": []}


def test_stacks_show_the_sleeping_rank_apart_from_ranks_blocked_in_all_reduce(
        cluster2: Cluster, tmp_path: Path) -> None:
    job = write_job(tmp_path, cluster2, "stacks-sleeper", ["--epochs", "100", "--sleep-rank", "1"])
    up = run_ddpctl("up", str(job), "--detach", "--runs-dir", str(tmp_path / "runs"), *ssh_args(cluster2))
    assert up.returncode == 0, up.stderr
    try:
        def four_ranks() -> dict[str, Any] | None:
            report = stacks_json(cluster2, "stacks-sleeper")
            ranks = [r["rank"] for g in report["groups"] for r in g["ranks"]]
            frames = " ".join(f["name"] for g in report["groups"] for f in g["frames"])
            settled = len(report["groups"]) == 2 and any(  # a rank still on its way to its sleep (get_data)
                "sleep_forever_before_collective" in g["summary"] for g in report["groups"])  # is a group too
            return report if sorted(ranks) == [0, 1, 2, 3] and "all_reduce" in frames and settled else None

        report = wait_for(four_ranks, 90, "all 4 ranks to be stuck, in two groups")
        odd, rest = report["groups"]
        assert [r["rank"] for r in odd["ranks"]] == [1]
        assert odd["ranks"][0]["host"] == "node0"
        assert "sleep_forever_before_collective" in odd["summary"] and "train.py:" in odd["summary"]
        assert sorted(r["rank"] for r in rest["ranks"]) == [0, 2, 3]
        assert rest["summary"].startswith("all_reduce in ") and "train.py:" in rest["summary"]
        text = run_ddpctl("stacks", "stacks-sleeper", "-i", str(cluster2.hosts_toml), *ssh_args(cluster2)).stdout
        first, second = text.splitlines()[:2]
        assert first.startswith("collectives: all_reduce #")
        assert "ranks 0, 2, 3 entered, rank 1 never did (node0)" in first
        assert "rank 1 is in `sleep_forever_before_collective` at train.py:" in first
        assert second.startswith("rank 1 on node0: sleep_forever_before_collective")
        assert report["verdict"]["missing"] == [1] and report["verdict"]["op"] == "all_reduce"
    finally:
        down = run_ddpctl("down", "stacks-sleeper", "-i", str(cluster2.hosts_toml), "--grace", "3",
                          *ssh_args(cluster2))
    assert down.returncode == 0, down.stderr
    job_id = json.loads((next((tmp_path / "runs").glob("*/detached.json"))).read_text())["job_id"]
    wait_for(lambda: no_job_processes(cluster2, job_id), 30, "no process of the job left")


def test_hang_timeout_dumps_stacks_then_stops_the_job_with_nothing_left(cluster2: Cluster, tmp_path: Path) -> None:
    job = write_job(tmp_path, cluster2, "hung", ["--epochs", "100", "--sleep-rank", "2"])
    runs = tmp_path / "runs"
    out = run_ddpctl("up", str(job), "--hang-timeout", "6", "--on-hang", "stop", "--grace", "3",
                     "--runs-dir", str(runs), *ssh_args(cluster2), timeout=240)
    assert out.returncode != 0
    assert "looks hung" in out.stderr
    (dump,) = list(runs.glob("*/stacks-hang-*.txt"))
    text = dump.read_text()
    assert "rank 2 on node1: sleep_forever_before_collective" in text
    assert "ranks 0–1, 3: all_reduce in" in text
    summary = only_summary(runs)
    wait_for(lambda: no_job_processes(cluster2, summary["job_id"]), 30, "no process of the hung job left")


def test_rank_failure_summary_shows_the_real_traceback_of_the_first_failing_rank(
        cluster2: Cluster, tmp_path: Path) -> None:
    job = write_job(tmp_path, cluster2, "crash", ["--epochs", "100", "--fail-rank", "2", "--fail-at-step", "2"])
    out = run_ddpctl("up", str(job), "--runs-dir", str(tmp_path / "runs"), *ssh_args(cluster2))
    assert out.returncode != 0
    assert "first failure: rank 2 on node1 (node_rank 1, local rank 0): RuntimeError: injected failure: " \
           "rank 2 at step 2" in out.stderr
    assert "Traceback (most recent call last)" in out.stderr
    assert "error_file: <N/A>" not in out.stderr


def doctor_json(cluster: Cluster, *extra: str) -> tuple[int, dict[str, Any]]:
    out = run_ddpctl("doctor", "-i", str(cluster.hosts_toml), "--json", *ssh_args(cluster), *extra)
    return out.returncode, json.loads(out.stdout)


def test_duplicate_hostnames_are_a_finding_naming_both_hosts(make_cluster: Callable[[int], Cluster]) -> None:
    cluster = make_cluster(2)
    cluster.set_hostname(1, cluster.hostname(0))
    _code, report = doctor_json(cluster)
    dup = [f for f in report["findings"] if "is shared by" in f["message"]]
    assert {f["host"] for f in dup} == {"node0", "node1"}
    assert all("node0, node1" in f["message"] for f in dup)


def test_missing_workdir_on_one_host_is_a_failure_naming_that_host(cluster2: Cluster, tmp_path: Path) -> None:
    present = tmp_path / "work"
    present.mkdir()
    inventory = tmp_path / "hosts.toml"
    text = cluster2.hosts_toml.read_text()
    addr1 = cluster2.hosts[1].address
    text = text.replace(f'address = "{addr1}"', f'address = "{addr1}"\nworkdir = "{tmp_path / "missing"}"')
    text = text.replace("[defaults]", f'[defaults]\nworkdir = "{present}"')
    inventory.write_text(text)
    out = run_ddpctl("doctor", "-i", str(inventory), "--json", *ssh_args(cluster2))
    assert out.returncode == 1
    report = json.loads(out.stdout)
    bad = [f for f in report["findings"] if f["status"] == "fail" and "does not exist" in f["message"]]
    assert [f["host"] for f in bad] == ["node1"]
    assert str(tmp_path / "missing") in bad[0]["message"]


def test_doctor_smoke_runs_gloo_all_reduce_through_the_launch_path(cluster2: Cluster, tmp_path: Path) -> None:
    job = write_job(tmp_path, cluster2, "smoky", env={"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1"})
    out = run_ddpctl("doctor", str(job), "--smoke", "--json", "--runs-dir", str(tmp_path / "runs"),
                     *ssh_args(cluster2))
    report = json.loads(out.stdout)
    smoke = [f for f in report["findings"] if f["check"] == "smoke"]
    assert out.returncode == 0, smoke
    assert smoke[0]["status"] == "ok" and "across 2 rank(s) on 2 host(s)" in smoke[0]["message"]
