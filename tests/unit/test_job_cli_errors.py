"""`ddpctl logs / down / stacks` through the real CLI: a job file that does not exist, a job no host
runs, a host that cannot be reached, py-spy missing: each an `error:` line and its `fix:`, no
traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.hostops import control
from orchestrator.hostops.stacks import StacksReport, assemble

runner = CliRunner()


@pytest.fixture
def state_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "state"
    monkeypatch.setenv("DDPCTL_STATE_ROOT", str(root))  # no job runs here
    return root


@pytest.mark.parametrize("command", ["logs", "down", "stacks"])
@pytest.mark.parametrize("job", ["missing.toml", "jobs/missing.toml", "jobs/train-20260101-000000-abcd"])
def test_a_job_file_that_does_not_exist_is_not_taken_for_a_job_id(command: str, job: str) -> None:
    result = runner.invoke(app, [command, job])
    assert result.exit_code == 2, result.output
    assert f"error: job file {job} does not exist" in result.stderr
    assert "fix:" in result.stderr and "`ddpctl ps`" in result.stderr
    assert "Traceback" not in result.output and result.stdout == ""


@pytest.mark.parametrize("command", ["logs", "down"])
def test_a_job_id_that_looks_like_no_path_is_still_a_job_id(command: str, state_root: Path) -> None:
    result = runner.invoke(app, [command, "train-20260101-000000-abcd"])
    assert result.exit_code == 1, result.output
    assert "error: job train-20260101-000000-abcd: no host has" in result.stderr


def test_stacks_of_a_job_no_host_runs(state_root: Path) -> None:
    result = runner.invoke(app, ["stacks", "ghost"])
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [
        "error: job ghost: no host has a rank of it running (checked 1 host: localhost)",
        "  fix: check the job id: `ddpctl ps` lists running jobs and their ids; for a job on other hosts add "
        "-i hosts.toml, or give its job.toml"]
    assert result.stdout == ""


def test_stacks_names_the_host_it_cannot_reach_and_the_fix(state_root: Path, tmp_path: Path) -> None:
    # 127.0.0.2 is this machine's loopback too: nothing listens on port 1, so the dial is refused at once
    (tmp_path / "hosts.toml").write_text(
        f'[defaults]\npython = "{sys.executable}"\n[[hosts]]\nname = "here"\naddress = "127.0.0.1"\n'
        '[[hosts]]\nname = "gone"\naddress = "127.0.0.2"\nport = 1\n')
    result = runner.invoke(app, ["stacks", "ghost", "-i", str(tmp_path / "hosts.toml")])
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert lines[0].startswith("error: gone: 127.0.0.2:1 (gone) refused the connection")
    assert lines[1].startswith("  fix: on gone: sudo systemctl start ssh")
    assert lines[2:] == ["error: job ghost: no host has a rank of it running (checked 1 of 2 hosts: here; "
                         "the others failed)",
                         f"  fix: check the job id: `ddpctl ps -i {tmp_path / 'hosts.toml'}` lists running jobs "
                         "and their ids"]
    assert "Traceback" not in result.output


def test_stacks_without_py_spy_is_an_error_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    ranks = [{"job_id": "j-1", "pid": 10 + r, "rank": r, "local_rank": r, "node_rank": 0} for r in range(2)]
    reply = {"job_ids": ["j-1"], "ranks": ranks, "py_spy": None, "error": "py-spy is not installed on this host",
             "fix": "pip install py-spy (it comes with ddpctl's train extra) in the job's environment"}

    def collect(pool: object, hosts: object, job: str) -> StacksReport:
        return assemble(job, {"localhost": reply}, {})

    monkeypatch.setattr(control, "collect", collect)
    result = runner.invoke(app, ["stacks", "j-1"])
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines() == ["ranks 0–1 on localhost: no stack: py-spy is not installed on this host"]
    assert result.stderr.splitlines() == [
        "error: localhost: py-spy is not installed on this host",
        "  fix: pip install py-spy (it comes with ddpctl's train extra) in the job's environment"]
