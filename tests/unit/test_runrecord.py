"""A job found by its id (orchestrator/hostops/runrecord.py): `up` keeps a run record in
runs/<id>/run.json; a later command given the id alone reaches the job's hosts through it, with
the SSH settings `up` used, unless -i or --backend says otherwise."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from inventory import ConfigError
from orchestrator.hostops.control import HostJobs, SlurmJobs, job_control
from orchestrator.hostops.runrecord import (
    Reach,
    find_record,
    follow_up,
    new_record,
    read_record,
    record_path,
    write_record,
)
from orchestrator.remote.ssh_options import Connection, SshOptions
from tests.cluster_files import write_hosts_toml


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def inventory(directory: Path, name: str = "hosts; $(x) 'q'.toml") -> Path:
    path = directory / name
    write_hosts_toml(path, [("node0", "198.18.0.1"), ("node1", "198.18.0.2")], "python3", [])
    return path


def test_the_record_keeps_where_the_job_runs_and_every_attempts_hosts(here: Path) -> None:
    inv, ssh_config = inventory(here), here / "ssh config"
    ssh_config.write_text("")
    reach = Reach.of(Connection(SshOptions(ssh_config=Path("ssh config"), connect_timeout=3.0)))
    write_record(Path("runs"), new_record("job-1", "train", ["node0", "node1"], Path(inv.name), None, "ssh", None,
                                          reach, detached=False))
    write_record(Path("runs"), new_record("job-1", "train", ["node0", "node2"], Path(inv.name), None, "ssh", None,
                                          reach, detached=False))  # attempt 1, on a spare
    record = find_record("job-1")
    assert record is not None and record.hosts == ("node0", "node1", "node2")
    assert record.inventory == str(inv) and record.reach.ssh_config == str(ssh_config)  # absolute: any cwd
    assert record.up_pid > 0 and record.started > 0 and not record.detached
    assert [p.name for p in (here / "runs" / "job-1").iterdir()] == ["run.json"]  # no temporary file left


def test_a_job_file_or_an_unknown_id_has_no_record(here: Path) -> None:
    assert find_record("job.toml") is None and find_record("a/b") is None and find_record("nope") is None
    assert find_record(None) is None


def test_a_record_whose_inventory_is_gone_says_so(here: Path) -> None:
    inv = inventory(here)
    write_record(Path("runs"), new_record("job-2", "t", ["node0"], inv, None, "ssh", None, Reach(), False))
    inv.unlink()
    with pytest.raises(ConfigError, match=r"names the inventory .* which no longer exists"):
        find_record("job-2")


def test_an_unreadable_record_is_an_error_naming_it(here: Path) -> None:
    path = record_path(Path("runs"), "job-3")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match=r"run record runs/job-3/run\.json cannot be read"):
        read_record(path)


def test_the_id_alone_reaches_the_records_hosts_and_an_explicit_inventory_wins(here: Path) -> None:
    inv, other = inventory(here), inventory(here, "other.toml")
    write_hosts_toml(other, [("elsewhere", "198.18.9.9")], "python3", [])
    write_record(Path("runs"), new_record("job-4", "t", ["node0", "node1"], inv, None, "ssh", None,
                                          Reach(known_hosts=(str(here / "kh"),)), False))
    with job_control(Connection(), "job-4", None, None, None) as control:
        assert isinstance(control, HostJobs)
        assert [h.name for h in control.inventory.hosts] == ["node0", "node1"]
        assert control.pool.options.known_hosts == (here / "kh",)  # `up`'s SSH settings
    with job_control(Connection(), "job-4", None, None, other) as control:
        assert isinstance(control, HostJobs) and [h.name for h in control.inventory.hosts] == ["elsewhere"]


def test_a_slurm_jobs_record_goes_to_slurm(here: Path) -> None:
    write_record(Path("runs"), new_record("job-5", "t", ["c1"], None, None, "slurm", None, Reach(), False))
    with job_control(Connection(), "job-5", None, None, None) as control:
        assert isinstance(control, SlurmJobs)


def test_follow_up_lines_work_as_printed(here: Path) -> None:
    inv = inventory(here, "my hosts $(x) 'q'.toml")
    logs = follow_up("job-6", inv).split("; ")[0]  # no record here: the inventory, quoted
    assert shlex.split(logs) == ["ddpctl", "logs", "job-6", "-f", "-i", str(inv)]
    write_record(Path("runs"), new_record("job-6", "t", ["node0"], inv, None, "ssh", None, Reach(), False))
    assert follow_up("job-6", inv) == "ddpctl logs job-6 -f; ddpctl top job-6; ddpctl down job-6"
    assert json.loads((here / "runs" / "job-6" / "run.json").read_text())["version"] == 1
