"""`up --detach`, `ps`, `logs`, `down` on this machine (run state under a private DDPCTL_STATE_ROOT)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from node_agent.host.runstate import alive, job_pids
from tests.ddpctl_run import run_ddpctl, wait_for, write_job


@pytest.fixture
def state_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "state"
    monkeypatch.setenv("DDPCTL_STATE_ROOT", str(root))  # inherited by ddpctl and its local agent
    yield root


def live_job_pids(job_id: str) -> list[int]:
    return [p for p in job_pids(job_id) if alive(p)]


def start_detached(tmp_path: Path, name: str) -> str:
    job = write_job(tmp_path, None, name, ["--epochs", "1000", "--steps-delay", "0.1"])
    up = run_ddpctl("up", str(job), "--detach", "--runs-dir", str(tmp_path / "runs"), timeout=120)
    assert up.returncode == 0, up.stderr[-3000:]
    job_id: str = json.loads(next((tmp_path / "runs").glob("*/detached.json")).read_text())["job_id"]
    assert f"ddpctl down {job_id}" in up.stderr
    return job_id


def test_detached_job_is_listed_logged_and_stopped(tmp_path: Path, state_root: Path) -> None:
    job_id = start_detached(tmp_path, "lifecycle")
    try:
        ps = run_ddpctl("ps", "--json", "--job", job_id)
        assert ps.returncode == 0, ps.stderr
        (row,) = json.loads(ps.stdout)["jobs"]
        assert (row["host"], row["job_id"], row["node_rank"], row["detached"]) == ("localhost", job_id, 0, True)
        assert row["pids"] and all(alive(p) for p in row["pids"])
        wait_for(lambda: "epoch=" in run_ddpctl("logs", job_id).stdout, 120, "logs to show training")
        logs = run_ddpctl("logs", job_id)
        assert logs.returncode == 0
        lines = [line for line in logs.stdout.splitlines() if line.strip()]
        assert all(line.startswith(("[localhost] ", "[localhost:")) for line in lines)
        assert "[localhost:0] epoch=0 " in logs.stdout  # replayed from the start, labelled by global rank
        assert "[default0]:" not in logs.stdout
        down = run_ddpctl("down", job_id, "--grace", "3")
        assert down.returncode == 0, down.stderr
        assert f"localhost: stopped {job_id}" in down.stdout
        wait_for(lambda: not live_job_pids(job_id), 30, "no process of the detached job left")
        assert json.loads(run_ddpctl("ps", "--json", "--job", job_id).stdout)["jobs"] == []
        assert "epoch=" in run_ddpctl("logs", job_id).stdout  # logs outlive the job
    finally:
        for pid in live_job_pids(job_id):
            os.kill(pid, 9)


def test_down_by_job_file_and_unknown_jobs(tmp_path: Path, state_root: Path) -> None:
    job_id = start_detached(tmp_path, "byfile")
    try:
        wait_for(lambda: live_job_pids(job_id), 60, "the detached job's processes")
        down = run_ddpctl("down", str(tmp_path / "byfile.toml"), "--grace", "3")
        assert down.returncode == 0, down.stderr
        assert f"localhost: stopped {job_id}" in down.stdout
        wait_for(lambda: not live_job_pids(job_id), 30, "no process of the job stopped by its file")
    finally:
        for pid in live_job_pids(job_id):
            os.kill(pid, 9)
    nothing = run_ddpctl("down", "no-such-job-123")
    assert nothing.returncode == 1
    assert "job no-such-job-123: no host has it running (checked 1 host: localhost)" in nothing.stderr
    assert "`ddpctl ps`" in nothing.stderr and "Traceback" not in nothing.stderr
    nologs = run_ddpctl("logs", "no-such-job-123")
    assert nologs.returncode == 1
    assert "job no-such-job-123: no host has a log of it (checked 1 host: localhost)" in nologs.stderr
