"""What the cluster and the job are: frozen dataclasses and TOML loading with located errors."""

from inventory.errors import ConfigError
from inventory.model import (
    LOCALHOST,
    Host,
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
    "Inventory",
    "Job",
    "JobOverrides",
    "NprocSpec",
    "Rendezvous",
    "local_inventory",
]
