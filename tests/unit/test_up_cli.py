"""`ddpctl up --dry-run` and bad input through typer's CliRunner: exact commands, masked secrets."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inventory import Job
from orchestrator.cli import app
from orchestrator.commands import up
from orchestrator.run_up import UpOutcome, UpRequest, run_up

runner = CliRunner()


def write_two_host_job(tmp_path: Path, backend: str = "static") -> Path:
    (tmp_path / "hosts.toml").write_text(
        '[defaults]\npython = "/opt/py/bin/python"\n\n'
        '[[hosts]]\nname = "n0"\naddress = "198.18.7.1"\n\n'
        '[[hosts]]\nname = "n1"\naddress = "198.18.7.2"\n')
    (tmp_path / "train.py").write_text("")
    job = tmp_path / "job.toml"
    job.write_text(
        'inventory = "hosts.toml"\n[job]\nname = "dry"\nscript = "train.py"\n'
        'args = ["--msg", "a b; $(touch x)"]\nnproc_per_node = 2\n'
        f'[rendezvous]\nmaster_port = 29555\nbackend = "{backend}"\n'
        '[env]\nHF_TOKEN = "abc"\nGLOO_SOCKET_IFNAME = "eth0"\n')
    return job


def command_lines(output: str) -> list[str]:
    return [line.split("command: ", 1)[1] for line in output.splitlines() if "command: " in line]


def test_dry_run_shows_the_exact_command_per_host_with_masked_secrets(tmp_path: Path) -> None:
    out = runner.invoke(app, ["up", str(write_two_host_job(tmp_path)), "--dry-run"])
    assert out.exit_code == 0, out.output
    cmds = [shlex.split(c) for c in command_lines(out.output)]
    assert len(cmds) == 2
    for node_rank, argv in enumerate(cmds):
        assert argv[:7] == ["/opt/py/bin/python", "-m", "torch.distributed.run", "--nnodes", "2",
                            "--nproc-per-node", "2"]
        assert argv[argv.index("--node-rank") + 1] == str(node_rank)
        assert argv[argv.index("--master-addr") + 1] == "198.18.7.1"
        assert argv[argv.index("--master-port") + 1] == "29555"
        assert Path(argv[-3]).name == "train.py"
        assert argv[-2:] == ["--msg", "a b; $(touch x)"]  # quoted, one argument
    assert "env: HF_TOKEN=***" in out.output
    assert "abc" not in out.output
    assert "env: GLOO_SOCKET_IFNAME=eth0" in out.output
    assert "n0 (node_rank 0, nproc 2 (job nproc_per_node), ssh 198.18.7.1" in out.output
    assert "n1 (node_rank 1, nproc 2 (job nproc_per_node), ssh 198.18.7.2" in out.output
    assert not (tmp_path / "x").exists()
    assert all(Path(argv[-4]).name == "rankwrap.py" and argv[-4].startswith("~/.ddpctl/runs/") for argv in cmds)


def test_dry_run_says_what_it_did_not_check_without_the_hosts(tmp_path: Path) -> None:
    job = write_two_host_job(tmp_path)
    out = runner.invoke(app, ["up", str(job), "--dry-run"])
    assert out.exit_code == 0, out.output
    assert "not checked (a dry run does not contact the hosts for it)" in out.output
    assert "master port reachable from every host" in out.output and f"ddpctl doctor {job}" in out.output
    quiet = runner.invoke(app, ["up", str(job), "--dry-run", "--no-checks"])
    assert quiet.exit_code == 0 and "not checked" not in quiet.output


def test_dry_run_c10d_and_overrides(tmp_path: Path) -> None:
    job = write_two_host_job(tmp_path, backend="c10d")
    out = runner.invoke(app, ["up", str(job), "--dry-run", "--master-port", "29600", "-e", "MY_KEY=zzz",
                              "-e", "PLAIN=v=1", "--nproc-per-node", "3", "--hosts", "n1,n0"])
    assert out.exit_code == 0, out.output
    cmds = [shlex.split(c) for c in command_lines(out.output)]
    assert len(cmds) == 2
    for argv in cmds:
        assert argv[argv.index("--rdzv-endpoint") + 1] == "198.18.7.2:29600"  # n1 is first: master
        assert argv[argv.index("--nproc-per-node") + 1] == "3"
        assert "--node-rank" not in argv
    assert "n1 (node_rank 0" in out.output
    assert "env: MY_KEY=***" in out.output and "zzz" not in out.output
    assert "env: PLAIN=v=1" in out.output


def test_missing_job_file_exits_2_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    out = runner.invoke(app, ["up", str(missing), "--dry-run"])
    assert out.exit_code == 2
    assert "nope.toml" in out.output
    assert "Traceback" not in out.output


def test_bad_master_port_exits_2(tmp_path: Path) -> None:
    out = runner.invoke(app, ["up", str(write_two_host_job(tmp_path)), "--dry-run", "--master-port", "http"])
    assert out.exit_code == 2
    assert "--master-port" in out.output and "'http'" in out.output
    assert "Traceback" not in out.output


def test_bad_env_assignment_exits_2(tmp_path: Path) -> None:
    out = runner.invoke(app, ["up", str(write_two_host_job(tmp_path)), "--dry-run", "-e", "NOEQUALS"])
    assert out.exit_code == 2
    assert "NOEQUALS" in out.output and "KEY=VALUE" in out.output
    assert "Traceback" not in out.output


def test_bad_key_in_job_file_exits_2_naming_file_and_key(tmp_path: Path) -> None:
    job = write_two_host_job(tmp_path)
    job.write_text(job.read_text().replace("nproc_per_node = 2", 'nproc_per_node = "many"'))
    out = runner.invoke(app, ["up", str(job), "--dry-run"])
    assert out.exit_code == 2
    assert "job.toml" in out.output and "nproc_per_node" in out.output
    assert "Traceback" not in out.output


def test_dry_run_of_a_synced_job_names_the_copy_and_needs_none_yet(tmp_path: Path) -> None:
    """A dry run before the first sync: the hosts (this machine here) have no copy yet, and that
    is fine (nproc "cpu" makes it ask the host); it says where the copy goes and how to see it."""
    (tmp_path / "train.py").write_text("")
    (tmp_path / "hosts.toml").write_text(
        f'[[hosts]]\nname = "me"\naddress = "127.0.0.1"\nworkdir = "{tmp_path / "not-yet"}"\n')
    job = tmp_path / "job.toml"
    job.write_text('inventory = "hosts.toml"\n[job]\nscript = "train.py"\nnproc_per_node = "cpu"\n[sync]\n')
    out = runner.invoke(app, ["up", str(job), "--dry-run"])
    assert out.exit_code == 0, out.output
    assert f"sync first: {tmp_path} -> {tmp_path / 'not-yet'} on every host" in out.output
    assert f"ddpctl sync {job} --dry-run" in out.output
    assert f"cwd {tmp_path / 'not-yet'}" in out.output
    assert not (tmp_path / "not-yet").exists()  # a dry run copies nothing


def test_help_texts_keep_their_table_names() -> None:
    """rich reads "[sync]" in a help string as markup and drops it unless it is escaped."""
    wide = {"COLUMNS": "200"}
    assert "its [sync] table says what goes where" in runner.invoke(app, ["sync", "--help"], env=wide).output
    up_help = runner.invoke(app, ["up", "--help"], env=wide).output
    assert "though the job file has [sync]" in up_help and "[slurm] table" in up_help
    assert "a job.toml with [slurm] says so" in runner.invoke(app, ["ps", "--help"], env=wide).output


@pytest.mark.parametrize(("flag", "port"), [([], 9400), (["--metrics-port", "9500"], 9500)])
def test_metrics_port_flag_replaces_the_job_files_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: list[str], port: int
) -> None:
    job = write_two_host_job(tmp_path)
    job.write_text(job.read_text() + "[metrics]\nport = 9400\n")
    seen: list[Job] = []

    def spy(given: Job, request: UpRequest, observer: object) -> UpOutcome:
        seen.append(given)
        return run_up(given, request, observer)  # type: ignore[arg-type]

    monkeypatch.setattr(up, "run_up", spy)
    out = runner.invoke(app, ["up", str(job), "--dry-run", *flag])
    assert out.exit_code == 0, out.output
    assert [j.metrics.port for j in seen] == [port]


@pytest.mark.parametrize("value", ["0", "65536"])
def test_metrics_port_out_of_range_is_an_error_naming_the_flag(tmp_path: Path, value: str) -> None:
    out = runner.invoke(app, ["up", str(write_two_host_job(tmp_path)), "--dry-run", "--metrics-port", value])
    assert out.exit_code == 2, out.output
    assert f"error: option --metrics-port: port {value} is outside 1-65535" in out.stderr
    assert "fix: use a port between 1 and 65535" in out.stderr and "Traceback" not in out.output


def test_metrics_port_that_is_no_number_is_a_usage_error(tmp_path: Path) -> None:
    out = runner.invoke(app, ["up", str(write_two_host_job(tmp_path)), "--dry-run", "--metrics-port", "http"])
    assert out.exit_code == 2 and "--metrics-port" in out.output and "Traceback" not in out.output
