"""What a job argument of `ps`, `down`, `logs`, `stacks` and `top` names: a job file or a job id,
the inventory its hosts are in, or the Slurm side that runs it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from inventory import ConfigError, Inventory, load_inventory, load_job, local_inventory
from inventory.specs import SlurmSpec

BackendName = Literal["ssh", "slurm"]


def inventory_at(path: Path | None) -> Inventory:
    """The inventory at `path` (hosts.toml or a hostfile); none: this machine."""
    return local_inventory() if path is None else load_inventory(path)


def require_job_file(job: str) -> None:
    """A job argument that reads as a path (`*.toml`, or with a `/`) must exist: it is not a job id."""
    if (job.endswith(".toml") or "/" in job) and not Path(job).exists():
        raise ConfigError(f"job file {job} does not exist",
                          hint="give the job.toml the job was started from, or its job id: "
                               "`ddpctl ps` lists running jobs and their ids")


@dataclass(frozen=True)
class HostsTarget:
    """A job on the hosts of an inventory, reached over SSH."""

    name: str | None  # a job id or name; None: every ddpctl job
    inventory: Inventory


@dataclass(frozen=True)
class SlurmSide:
    """A job run by Slurm: where its commands run, and how its nodes start."""

    name: str | None  # a Slurm job id, a ddpctl job id or a job name; None: every ddpctl job in the queue
    login: str | None
    inventory: Inventory  # where the login node may be named
    spec: SlurmSpec


def job_file(job: str | None) -> Path | None:
    """The job file a job argument names, where it is one (a `*.toml` that exists)."""
    return Path(job) if job is not None and job.endswith(".toml") and Path(job).exists() else None


def slurm_side(job: str | None, backend: BackendName | None, login: str | None,
               inventory: Path | None) -> SlurmSide | None:
    """A job.toml with [slurm] (unless backend ssh), or backend slurm: the Slurm side; else None."""
    if backend == "ssh":
        return None
    path = job_file(job)
    spec = load_job(path) if path is not None else None
    if spec is not None and spec.slurm is not None:
        return SlurmSide(spec.name, login or spec.slurm.login, spec.inventory, spec.slurm)
    if backend == "slurm":
        return SlurmSide(spec.name if spec else job, login, inventory_at(inventory), SlurmSpec(login=login))
    return None


def hosts_target(job: str | None, inventory: Path | None) -> HostsTarget:
    """A job.toml names the job and its inventory (-i overrides it); a bare id needs -i (or
    means this machine). A *.toml path that exists but is no file (a directory) is loaded too, to
    say so."""
    path = job_file(job)
    if path is not None:
        spec = load_job(path)
        return HostsTarget(spec.name, inventory_at(inventory) if inventory else spec.inventory)
    return HostsTarget(job, inventory_at(inventory))
