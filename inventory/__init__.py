"""What the cluster and the job are: frozen dataclasses and TOML loading with located errors."""

from inventory.errors import ConfigError
from inventory.hostfile import load_hostfile
from inventory.hostrange import expand_hostnames
from inventory.jobfile import apply_overrides, load_job, parse_env_assignment
from inventory.loading import load_inventory
from inventory.model import (
    LOCALHOST,
    Host,
    HostNproc,
    Inventory,
    Job,
    JobOverrides,
    NprocSpec,
    Rendezvous,
    local_inventory,
)

__all__ = [
    "LOCALHOST",
    "ConfigError",
    "Host",
    "HostNproc",
    "Inventory",
    "Job",
    "JobOverrides",
    "NprocSpec",
    "Rendezvous",
    "apply_overrides",
    "expand_hostnames",
    "load_hostfile",
    "load_inventory",
    "load_job",
    "local_inventory",
    "parse_env_assignment",
]
