"""Which backend runs a job: Slurm when it has a [slurm] table (or --backend slurm), else SSH."""

from __future__ import annotations

from inventory import Job
from orchestrator.launch.backends.slurm import SlurmBackend
from orchestrator.launch.backends.ssh import SshBackend
from orchestrator.remote.pool import HostPool


def backend_for(pool: HostPool, job: Job) -> SshBackend | SlurmBackend:
    return SlurmBackend(pool, job) if job.slurm is not None else SshBackend(pool)
