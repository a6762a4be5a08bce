"""The Python entry point (`orchestrator.up` / `plan`) runs the same core as `ddpctl up`."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

import orchestrator
from inventory import ConfigError, load_job
from orchestrator.launch.observer import Collected
from tests.ddpctl_run import REPO

pytestmark = pytest.mark.torch


def toy(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "train_jobs" / "toy", tmp_path / "toy")
    return tmp_path / "toy" / "job.toml"


def test_up_from_python_runs_the_job_and_returns_its_result(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = Collected()
    result = orchestrator.up(toy(tmp_path), nproc_per_node=1, env={"DDPCTL_TEST_VALUE": "a b;$(x)"},
                             observer=out, runs_dir=tmp_path / "runs", grace=3)
    assert result.ok and result.exit_code == 0 and result.first_failure is None
    assert [(h.host, h.state.value, h.exit_code) for h in result.hosts] == [("localhost", "exited", 0)]
    assert result.hosts[0].duration_s is not None and result.hosts[0].duration_s > 0
    assert any(rank == "0" and "world_size=1" in text for _h, rank, text in out.lines)
    assert out.plan is not None and out.plan.hosts[0].env["DDPCTL_TEST_VALUE"] == "a b;$(x)"
    summary = json.loads((tmp_path / "runs" / result.job_id / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["world_size"] == 1


def test_a_failing_script_from_python_names_the_rank_and_its_exception(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    job = replace(load_job(toy(tmp_path)), args=("--epochs", "1", "--fail-rank", "1"))  # a Job built in code
    result = orchestrator.up(job, observer=Collected(), runs_dir=tmp_path / "runs", grace=3)
    assert result.exit_code != 0 and result.first_failure is not None
    assert result.first_failure.host == "localhost"
    err = result.first_failure.first_error
    assert err is not None and err.local_rank == 1 and "RuntimeError" in err.message + err.traceback


def test_plan_from_python_is_the_dry_run_and_bad_input_raises_the_located_error(tmp_path: Path) -> None:
    job_file = toy(tmp_path)
    plan = orchestrator.plan(job_file, master_port=29531, nproc_per_node=3)
    (hl,) = plan.hosts
    assert hl.nproc == 3 and "--master-port" in hl.launcher and "29531" in hl.launcher
    assert hl.program == ("train.py", "--epochs", "2")
    with pytest.raises(ConfigError) as info:
        orchestrator.up(job_file, hosts=["node7"], observer=Collected())
    assert info.value.key == "--hosts" and 'host "node7" is not in the inventory' in info.value.message


def test_a_failing_pre_launch_check_raises_doctors_findings_and_starts_nothing(tmp_path: Path) -> None:
    from orchestrator.launch.preflight import ChecksFailed

    with pytest.raises(ChecksFailed) as info:
        orchestrator.up(toy(tmp_path), nproc_per_node=1024, runs_dir=tmp_path / "runs")
    (finding,) = [f for f in info.value.findings if f.status.value == "fail"]
    assert (finding.check, finding.host) == ("nproc", "localhost")
    assert "nproc_per_node = 1024 would start 1024 ranks on localhost" in finding.message
    assert "[nproc] localhost:" in str(info.value)
    assert not (tmp_path / "runs").exists()
