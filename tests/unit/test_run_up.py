"""`run_up` (orchestrator/run_up.py), the one function behind `ddpctl up` and `orchestrator.up()`, the
SSH flags declared once (commands/common.py `ssh_flags`), and the job control that `ps`, `down`,
`logs`, `stacks` and `top` go through (hostops/control.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from inventory import ConfigError, load_job
from inventory.specs import SlurmSpec
from orchestrator.commands.common import ssh_flags
from orchestrator.hostops.control import HostJobs, SlurmJobs, job_control
from orchestrator.launch.observer import Collected
from orchestrator.remote.ssh_options import Connection, SshOptions
from orchestrator.run_up import DryRun, UpRequest, check_restartable, run_up


def write_job(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "train.py").write_text("")
    job = tmp_path / "job.toml"
    job.write_text('[job]\nname = "thin"\nscript = "train.py"\nnproc_per_node = 2\n'
                   f'[rendezvous]\nmaster_port = 29557\n{extra}')
    return job


def test_a_dry_run_returns_the_plan_and_starts_nothing(tmp_path: Path) -> None:
    observer = Collected()
    outcome = run_up(load_job(write_job(tmp_path)), UpRequest(dry_run=True), observer)
    assert isinstance(outcome, DryRun)
    assert outcome.batch is None and outcome.checks
    assert [(hl.host.name, hl.nproc) for hl in outcome.plan.hosts] == [("localhost", 2)]
    assert observer.plan is None and observer.states == []


def test_restarts_follow_the_flag_else_the_job_file(tmp_path: Path) -> None:
    job = load_job(write_job(tmp_path, "[restart]\nmax_restarts = 2\n"))
    assert UpRequest().restart_budget(job) == 2
    assert UpRequest(max_restarts=0).restart_budget(job) == 0
    assert not UpRequest(detach=True).attached and not UpRequest(dry_run=True).attached and UpRequest().attached


def test_a_detached_slurm_job_with_restarts_is_refused_before_anything_starts(tmp_path: Path) -> None:
    job = dataclasses.replace(load_job(write_job(tmp_path)), slurm=SlurmSpec(nodes=2))
    check_restartable(job, UpRequest(detach=True))  # no restarts: fine
    with pytest.raises(ConfigError, match="--detach with restarts on Slurm"):
        check_restartable(job, UpRequest(detach=True, max_restarts=1))


def test_the_python_api_up_stays_a_function_beside_the_run_up_module() -> None:
    import orchestrator
    import orchestrator.run_up
    from orchestrator import api, up

    assert up is api.up and orchestrator.up is api.up


def test_ssh_flags_are_declared_once_and_arrive_as_one_connection(tmp_path: Path) -> None:
    seen: list[Connection] = []
    app = typer.Typer()

    @app.command()
    @ssh_flags(connect_timeout=5.0)
    def probe(name: str = "x", *, connection: Connection) -> None:
        seen.append(connection)

    config = tmp_path / "ssh_config"
    result = CliRunner().invoke(app, ["--ssh-config", str(config), "--known-hosts", "a", "--known-hosts", "b",
                                      "--accept-new-host-keys", "--parallel", "3"])
    assert result.exit_code == 0, result.output
    assert seen == [Connection(SshOptions(config, (Path("a"), Path("b")), True, 5.0), 3)]
    assert "--connect-timeout" in CliRunner().invoke(app, ["--help"]).output


def test_a_command_may_leave_out_the_connect_timeout() -> None:
    seen: list[Connection] = []
    app = typer.Typer()

    @app.command()
    @ssh_flags(connect_timeout=None)
    def probe(*, connection: Connection) -> None:
        seen.append(connection)

    assert CliRunner().invoke(app, []).exit_code == 0
    assert seen == [Connection()]
    assert "--connect-timeout" not in CliRunner().invoke(app, ["--help"]).output


def test_job_control_is_slurm_for_a_slurm_job_file_unless_told_ssh(tmp_path: Path) -> None:
    job = write_job(tmp_path, "[slurm]\nnodes = 2\n")
    with job_control(Connection(), str(job), None, None, None) as control:
        assert isinstance(control, SlurmJobs) and control.name == "thin"
    with job_control(Connection(), str(job), "ssh", None, None) as control:
        assert isinstance(control, HostJobs) and control.name == "thin"
    with job_control(Connection(), None, "slurm", None, None) as control:
        assert isinstance(control, SlurmJobs) and control.name is None
    with job_control(Connection(), "some-id", None, None, None) as control:
        assert isinstance(control, HostJobs) and [h.name for h in control.inventory.hosts] == ["localhost"]


def test_job_control_refuses_a_job_file_that_is_not_there(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"), \
            job_control(Connection(), str(tmp_path / "gone.toml"), None, None, None):
        pass
