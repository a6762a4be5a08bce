"""`ddpctl up` on this machine only (no SSH): the toy job, run dir, summary, verbatim arguments."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from node_agent.host.runstate import alive, job_pids
from tests.ddpctl_run import REPO, only_summary, run_ddpctl, wait_for, write_job
from tests.unit.ports_listeners import TIME_WAIT_MAKER, reap

IDENTITY = re.compile(r"rank=(\d) local_rank=(\d) world_size=(\d) node_rank=(\d) params_identical=(\w+)")


def test_toy_job_file_runs_two_ranks_and_writes_the_run_dir(tmp_path: Path) -> None:
    job_dir = tmp_path / "toy"
    shutil.copytree(REPO / "train_jobs" / "toy", job_dir)
    runs = tmp_path / "runs"
    out = run_ddpctl("up", str(job_dir / "job.toml"), "--runs-dir", str(runs), timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    ids = {int(m.group(1)): m.groups()[1:] for m in IDENTITY.finditer(out.stdout)}
    assert ids == {0: ("0", "2", "0", "True"), 1: ("1", "2", "0", "True")}
    summary = only_summary(runs)
    assert summary["exit_code"] == 0
    run_dir = runs / summary["job_id"]
    assert "params_identical=True" in (run_dir / "localhost.log").read_text()
    assert f"job {summary['job_id']} succeeded" in out.stderr


def test_arguments_reach_the_local_script_verbatim(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    args = ["--epochs", "1", "--echo-args", "two words", "it's \"quoted\"", f"$(touch {marker})",
            "a;touch " + str(marker), "`touch " + str(marker) + "`", "*", "$HOME"]
    job = write_job(tmp_path, None, "verbatim-local", args)
    out = run_ddpctl("up", str(job), "--runs-dir", str(tmp_path / "runs"), timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    echoed = [json.loads(line.split("ARGS ", 1)[1]) for line in out.stdout.splitlines() if "ARGS [" in line]
    assert echoed == [args, args]
    assert not marker.exists()


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_running_job_on_the_master_port_is_not_killed_as_stale(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a holder whose job is no longer supervised is stale; a live job blocks the launch."""
    monkeypatch.setenv("DDPCTL_STATE_ROOT", str(tmp_path / "state"))
    port = free_tcp_port()
    holder = write_job(tmp_path, None, "holder", ["--epochs", "1000", "--steps-delay", "0.1"], port=port)
    up = run_ddpctl("up", str(holder), "--detach", "--runs-dir", str(tmp_path / "runs"), timeout=120)
    assert up.returncode == 0, up.stderr[-3000:]
    job_id = json.loads(next((tmp_path / "runs").glob("*/detached.json")).read_text())["job_id"]
    try:
        wait_for(lambda: "epoch=" in run_ddpctl("logs", job_id).stdout, 120, "the first job to train")
        second = write_job(tmp_path, None, "second", ["--epochs", "1"], port=port)
        out = run_ddpctl("up", str(second), "--runs-dir", str(tmp_path / "runs2"), timeout=120)
        assert [p for p in job_pids(job_id) if alive(p)], f"the running job {job_id} was killed:\n{out.stderr}"
        assert out.returncode == 1
        assert job_id in out.stderr and f"ddpctl down {job_id}" in out.stderr
    finally:
        run_ddpctl("down", job_id, "--grace", "3")
        for pid in job_pids(job_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_second_ctrl_c_after_the_job_ended_still_exits_130(tmp_path: Path) -> None:
    import subprocess

    from tests.ddpctl_run import ddpctl_argv

    job = write_job(tmp_path, None, "twice", ["--epochs", "100000"])
    err = tmp_path / "err.txt"
    with err.open("w") as stderr:
        proc = subprocess.Popen(ddpctl_argv("up", str(job), "--runs-dir", str(tmp_path / "runs"), "--grace", "2"),
                                stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        assert proc.stdout is not None
        wait_for(lambda: "epoch=" in (proc.stdout.readline() or "epoch="), 120, "a rank to print")
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: "(exit 130)" in err.read_text() or proc.poll() is not None, 60, "the job to end")
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)  # the job is over: this one must not change the exit
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err.read_text()[-2000:]
    assert only_summary(tmp_path / "runs")["interrupted"] is True


def test_a_freed_master_port_that_does_not_bind_stops_the_launch_saying_why(tmp_path: Path) -> None:
    """A stale job's holder is killed, but its own TIME_WAIT (no SO_REUSEADDR) still refuses
    torchrun's store: the launch stops there, not in a rendezvous that fails with EADDRINUSE."""
    stale = subprocess.Popen([sys.executable, "-c", TIME_WAIT_MAKER], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "DDPCTL_JOB_ID": "old-job-77"})
    try:
        assert stale.stdout is not None
        port = int(stale.stdout.readline())
        with socket.create_connection(("127.0.0.1", port)) as cli:
            assert cli.recv(1) == b""  # the holder closed first: the TIME_WAIT is its own
        job = write_job(tmp_path, None, "unbound", ["--epochs", "1"], port=port)
        out = run_ddpctl("up", str(job), "--runs-dir", str(tmp_path / "runs"), timeout=120)
        assert out.returncode == 1, out.stderr[-3000:]
        assert f"killed pid(s) {stale.pid} of stale job(s) old-job-77" in out.stderr
        assert f"master port {port} on localhost is still busy after freeing it: no process holds it, " \
               "yet it does not bind" in out.stderr
        assert "Traceback" not in out.stderr and not list((tmp_path / "runs").glob("*/summary.json"))
    finally:
        reap(stale, [])
