"""A job's run record on the machine that launched it, `<runs dir>/<job id>/run.json`: where the
job runs (its hosts, its inventory and job file, the backend), how they were reached (the SSH
settings that are data) and who launched it. `up` writes it as each launch is planned; `logs`,
`top`, `down`, `stacks` and `ps --job` read it, so that the id `up` printed is all they need
(an explicit -i or --backend still wins)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from inventory import ConfigError
from orchestrator.remote.ssh_options import Connection

RECORD = "run.json"
VERSION = 1
DEFAULT_RUNS_DIR = Path("runs")  # `up`'s --runs-dir default: the record is looked for there


@dataclass(frozen=True)
class Reach:
    """The SSH settings `up` reached the hosts with, as data (a later command that gives none
    reaches them the same way)."""

    ssh_config: str | None = None
    known_hosts: tuple[str, ...] = ()
    connect_timeout: float | None = None

    @classmethod
    def of(cls, connection: Connection) -> Reach:
        ssh = connection.ssh
        return cls(str(ssh.ssh_config.resolve()) if ssh.ssh_config else None,
                   tuple(str(p.resolve()) for p in ssh.known_hosts), ssh.connect_timeout)

    def applied_to(self, connection: Connection) -> Connection:
        """`connection` with these settings where the command gave none of its own."""
        ssh = connection.ssh
        if ssh.ssh_config is None and self.ssh_config is not None:
            ssh = replace(ssh, ssh_config=Path(self.ssh_config))
        if not ssh.known_hosts and self.known_hosts:
            ssh = replace(ssh, known_hosts=tuple(Path(p) for p in self.known_hosts))
        return replace(connection, ssh=ssh)


@dataclass(frozen=True)
class RunRecord:
    job_id: str  # the run's id (a restarted run: the same for every attempt)
    job_name: str
    hosts: tuple[str, ...]  # every host the run has used (a restart adds a spare)
    inventory: str | None  # the inventory's absolute path; None: this machine
    job_file: str | None = None
    backend: str = "ssh"  # "ssh" or "slurm"
    login: str | None = None  # Slurm's login node, where the job file names one
    reach: Reach = field(default_factory=Reach)
    up_pid: int = 0  # the `up` that launched it, on this machine
    started: float = 0.0  # time.time()
    detached: bool = False
    version: int = VERSION

    @property
    def inventory_path(self) -> Path | None:
        return Path(self.inventory) if self.inventory is not None else None


def record_path(runs_dir: Path, job_id: str) -> Path:
    return runs_dir / job_id / RECORD


def write_record(runs_dir: Path, record: RunRecord) -> Path:
    """Write (or extend: the hosts of every attempt) the run's record, atomically."""
    path = record_path(runs_dir, record.job_id)
    old = read_record(path)
    if old is not None:
        hosts = (*old.hosts, *(h for h in record.hosts if h not in old.hosts))
        record = replace(record, hosts=hosts, started=old.started or record.started)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{RECORD}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(record), indent=2))
    tmp.replace(path)
    return path


def new_record(job_id: str, job_name: str, hosts: Sequence[str], inventory: Path | None, job_file: Path | None,
               backend: str, login: str | None, reach: Reach, detached: bool) -> RunRecord:
    return RunRecord(job_id, job_name, tuple(hosts), str(inventory.resolve()) if inventory else None,
                     str(job_file.resolve()) if job_file else None, backend, login, reach, os.getpid(),
                     time.time(), detached)


def read_record(path: Path) -> RunRecord | None:
    """The record at `path`; None where there is none. One that cannot be read is an error
    naming the file."""
    try:
        data: Any = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"run record {path} cannot be read: {exc}", hint="give -i <inventory> to find the job "
                          "on its hosts instead") from None
    if not isinstance(data, dict) or data.get("version") != VERSION:
        return None  # another version's: -i finds the job
    with contextlib.suppress(TypeError, ValueError):
        reach = Reach(**{**data.get("reach", {}), "known_hosts": tuple(data.get("reach", {}).get("known_hosts", ()))})
        fields = {k: v for k, v in data.items() if k not in ("reach", "hosts")}
        return RunRecord(**fields, hosts=tuple(data.get("hosts", ())), reach=reach)
    raise ConfigError(f"run record {path} is not one this ddpctl wrote", hint="give -i <inventory>")


def find_record(job: str | None, runs_dir: Path = DEFAULT_RUNS_DIR) -> RunRecord | None:
    """The record of a job named by its id (not a job file), under `runs_dir` here; None where
    there is none. A record whose inventory is gone is an error naming both."""
    if job is None or job.endswith(".toml") or "/" in job or job in (".", ".."):
        return None
    record = read_record(record_path(runs_dir, job))
    if record is not None and record.inventory is not None and not Path(record.inventory).is_file():
        raise ConfigError(f"job {job}: its run record {record_path(runs_dir, job)} names the inventory "
                          f"{record.inventory}, which no longer exists",
                          hint="give the job's inventory with -i hosts.toml")
    return record


def follow_up(job_id: str, inventory: Path | None) -> str:
    """The commands that follow a job, as they work from here: the id alone where this
    machine's record finds it from the current directory, else with the inventory."""
    try:
        found = find_record(job_id) is not None
    except ConfigError:
        found = False
    where = "" if found or inventory is None else f" -i {shlex.quote(str(inventory))}"
    return f"ddpctl logs {job_id} -f{where}; ddpctl top {job_id}{where}; ddpctl down {job_id}{where}"
