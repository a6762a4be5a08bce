"""Build doctor's context from a job file, an inventory, or nothing (this machine)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from inventory import Inventory, Job
from orchestrator.checks.model import DoctorContext

DEFAULT_MASTER_PORT = 29500


def from_job(job: Job, master_port: int | None = None, timeout_s: float = 120.0,
             use_cache: bool = True, master_addr: str | None = None) -> DoctorContext:
    """`master_addr`: the address a launch settled on (the job then names it, in effect)."""
    port = job.rendezvous.master_port if master_port is None else master_port
    local_only = all(h.is_local for h in job.hosts)
    return DoctorContext(
        hosts=job.hosts,
        master=job.master_host,
        master_addr=master_addr or ("127.0.0.1" if local_only else job.master_address),
        master_port=None if port == "auto" else int(port),
        workdirs={h.name: job.workdir_for(h) for h in job.hosts},
        script=job.script,
        env=dict(job.env),
        nproc_per_node=job.nproc_or_one,
        nprocs={h.name: job.nproc_of(h) for h in job.hosts},
        rdzv_backend=job.rendezvous.backend,
        gives_local_addr=job.slurm is None,
        timeout_s=timeout_s,
        use_cache=use_cache,
        sync_command=f"ddpctl sync {job.source or 'job.toml'}" if job.sync is not None else None,
        script_sha256=_local_sha256(job.base_dir / job.script) if job.sync and job.script else None,
        master_given=local_only or job.rendezvous.master_addr is not None or master_addr is not None,
        pick_interfaces=job.rendezvous.pick_interfaces,
        checkpoint_dir=job.restart.checkpoint_dir,
        max_restarts=job.restart.max_restarts,
    )


def _local_sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def from_inventory(inventory: Inventory, master_port: int | None = None,
                   timeout_s: float = 120.0, use_cache: bool = True) -> DoctorContext:
    """Without a job: the first host is the master, port 29500, workdir from the inventory."""
    master = inventory.hosts[0]
    cwd = str(Path.cwd())
    return DoctorContext(
        hosts=inventory.hosts,
        master=master,
        master_addr=master.address,
        master_port=master_port or DEFAULT_MASTER_PORT,
        workdirs={h.name: h.workdir or cwd for h in inventory.hosts},
        timeout_s=timeout_s,
        use_cache=use_cache,
        master_given=all(h.is_local for h in inventory.hosts),
    )
