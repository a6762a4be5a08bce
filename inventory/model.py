"""Frozen dataclasses describing hosts, inventories, rendezvous settings and jobs."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from inventory.specs import SlurmSpec, SyncSpec

NprocSpec = int | Literal["gpu", "cpu", "auto"]
GpuSpec = int | Literal["auto"] | tuple[int, ...]  # a count, "auto", or selected GPU indices

LOCAL_ADDRESSES = frozenset({"localhost", "127.0.0.1", "::1"})


def _frozen_env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return MappingProxyType(dict(env or {}))


@dataclass(frozen=True)
class Host:
    """One machine of the inventory. `None` fields fall back to ssh_config / defaults."""

    name: str
    address: str
    user: str | None = None
    port: int | None = None
    python: str = "python3"
    workdir: str | None = None  # None: the job file's directory (shared filesystem)
    gpus: GpuSpec = "auto"
    slots: int | None = None  # from an MPI/DeepSpeed hostfile
    env: Mapping[str, str] = field(default_factory=lambda: _frozen_env(None))
    spare: bool = False  # used only once a restart leaves a host out ([restart], inventory spare = true)
    # [defaults.metrics] / a host's [hosts.metrics] textfile_dir: node_exporter's textfile collector's
    # directory there; a running job writes its series into it (node_agent/runtime/metrics_file.py)
    metrics_dir: str | None = None

    @property
    def is_local(self) -> bool:
        return self.address in LOCAL_ADDRESSES


LOCALHOST = Host(name="localhost", address="127.0.0.1", python=sys.executable)


# [defaults] keep_runs: the run directories each launch keeps (on every host, and in runs/ here). A
# run directory holds a run's logs, a few MB for most jobs: 50 is weeks of a few runs a day, a
# few GB at most for chatty jobs (docs/cluster.md).
DEFAULT_KEEP_RUNS = 50
MAX_KEEP_RUNS = 100_000

# [defaults] quarantine, quarantine_after, quarantine_window: a host with this many host faults within
# this window (since its last release) is left out of `up` and of every restart attempt
# (orchestrator/hostops/quarantine.py; docs/restarts.md, "Host ledger and quarantine").
DEFAULT_QUARANTINE_AFTER = 2
DEFAULT_QUARANTINE_WINDOW = 24 * 3600.0
MAX_QUARANTINE_WINDOW = 366 * 24 * 3600.0


@dataclass(frozen=True)
class Inventory:
    hosts: tuple[Host, ...]
    source: Path | None = None  # None: the embedded localhost default
    keep_runs: int = DEFAULT_KEEP_RUNS  # [defaults] keep_runs: see DEFAULT_KEEP_RUNS
    quarantine: bool = True  # [defaults] quarantine: false keeps every host in, whatever its faults
    quarantine_after: int = DEFAULT_QUARANTINE_AFTER  # host faults that quarantine a host...
    quarantine_window: float = DEFAULT_QUARANTINE_WINDOW  # ... within this many seconds

    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def get(self, name_or_address: str) -> Host | None:
        for h in self.hosts:
            if name_or_address in (h.name, h.address):
                return h
        return None


def local_inventory() -> Inventory:
    return Inventory(hosts=(LOCALHOST,), source=None)


@dataclass(frozen=True)
class Rendezvous:
    master_addr: str | None = None  # None: the first selected host's address
    master_port: int | Literal["auto"] = 29500
    backend: Literal["static", "c10d"] = "static"
    # The rendezvous watchdog: ranks not all joined this many seconds after torchrun started on
    # every node (0: off). Well under torch's own timeouts (600 s to join, 30 min in a collective).
    join_timeout: float = 120.0
    # GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME set per host to the interface that routes to the
    # master, where the job leaves them unset and the library's own choice would fail
    pick_interfaces: bool = True


@dataclass(frozen=True)
class RestartSpec:
    """[restart]: one budget of restarts for the whole job, spent by ddpctl (never torchrun's own,
    which stays at --max-restarts 0): orchestrator/restarts/loop.py. 0 restarts: a failure ends
    the job, as without the table."""

    max_restarts: int = 0
    min_nodes: int | None = None  # with no spare left, the job may shrink to this many hosts
    host_fault_exit_codes: tuple[int, ...] = ()  # a rank exiting so means its host is faulty
    checkpoint_dir: str | None = None  # DDPCTL_CHECKPOINT_DIR; a newer file in it is progress
    backoff: float = 5.0  # seconds before the first restart, doubled for each one after it
    max_backoff: float = 60.0
    quarantine: bool = True  # false: this job leaves no quarantined host out (the inventory's switch too)


@dataclass(frozen=True)
class WatchSpec:
    """[watch]: what `ddpctl up` watches the running job for (orchestrator/watch/)."""

    total_steps: int | None = None  # the steps the job will take: DDPCTL_TOTAL_STEPS, for the ETA
    hang_after: float = 60.0  # no rank stepped for max(this, 5 x the p95 step time): a hang
    pulse: float = 30.0  # seconds between two progress lines when stdout is not a terminal
    straggler_threshold: float = 0.10  # a rank this much slower than the others is named
    straggler_warmup: float = 30.0  # seconds after the first step in which no straggler is named
    straggler_recovery: float = 15.0  # a named rank back under half the threshold this long is back to pace
    sample_every: float = 10.0  # seconds between two samples of each node's GPUs, CPU and memory (0: none)
    gpu_idle_after: float = 120.0  # a GPU of the job idle this long while it steps is a finding


@dataclass(frozen=True)
class MetricsSpec:
    """The job file's [metrics]: Prometheus series while the job runs (docs/metrics.md)."""

    port: int | None = None  # `up` serves the run's series on this port (--metrics-port wins)
    every: float = 5.0  # seconds between two writes of a host's textfile (hosts with a metrics_dir)
    keep_ended: float = 300.0  # a host's textfile says the job ended this long, then is removed


NPROC_FROM_JOB = "job nproc_per_node"


@dataclass(frozen=True)
class HostNproc:
    """What decides one host's process count, and where it came from (the dry run shows it)."""

    spec: NprocSpec
    source: str  # NPROC_FROM_JOB, "hostfile slots", "inventory slots" or "default"


@dataclass(frozen=True)
class Job:
    name: str
    inventory: Inventory
    hosts: tuple[Host, ...]  # selected hosts; order is node_rank order
    script: str | None = None  # exactly one of script / module is set
    module: str | None = None
    args: tuple[str, ...] = ()
    nproc_per_node: NprocSpec | None = None  # None: not set, each host's slots decide (nproc_of)
    rendezvous: Rendezvous = field(default_factory=Rendezvous)
    env: Mapping[str, str] = field(default_factory=lambda: _frozen_env(None))
    source: Path | None = None  # the job file
    base_dir: Path = field(default_factory=Path.cwd)  # directory of the job file
    slurm: SlurmSpec | None = None  # set: the job runs on Slurm ([slurm] or --backend slurm)
    sync: SyncSpec | None = None  # set: the source is copied to every host before it runs ([sync])
    # [supervise] lost_after: seconds a silent host may stay out of reach before the job stops
    # (None: the fault model's default, orchestrator/launch/faults.py)
    lost_after: float | None = None
    restart: RestartSpec = field(default_factory=RestartSpec)
    watch: WatchSpec = field(default_factory=WatchSpec)
    metrics: MetricsSpec = field(default_factory=MetricsSpec)

    @property
    def spares(self) -> tuple[Host, ...]:
        """The inventory's spare hosts the job does not run on, in inventory order."""
        return tuple(h for h in self.inventory.hosts if h.spare and h not in self.hosts)

    @property
    def backend(self) -> Literal["ssh", "slurm"]:
        return "slurm" if self.slurm is not None else "ssh"

    @property
    def nproc_or_one(self) -> NprocSpec:
        """nproc_per_node, 1 where the job sets none (what a host without slots runs)."""
        return self.nproc_per_node if self.nproc_per_node is not None else 1

    def nproc_of(self, host: Host) -> HostNproc:
        """The job's nproc_per_node (file or flag); where it sets none, the host's slots (a
        DeepSpeed/MPI hostfile's `slots=2`, as `deepspeed --hostfile` runs them), else 1."""
        if self.nproc_per_node is not None:
            return HostNproc(self.nproc_per_node, NPROC_FROM_JOB)
        if host.slots is not None:
            toml = self.inventory.source is not None and self.inventory.source.suffix.lower() == ".toml"
            return HostNproc(host.slots, "inventory slots" if toml else "hostfile slots")
        return HostNproc(self.nproc_or_one, "default")

    @property
    def master_host(self) -> Host:
        """The host that runs the rendezvous store (named by master_addr, else the first)."""
        addr = self.rendezvous.master_addr
        if addr is not None:
            for h in self.hosts:
                if addr in (h.name, h.address):
                    return h
        return self.hosts[0]

    @property
    def master_address(self) -> str:
        """The address other hosts use to reach the master."""
        addr = self.rendezvous.master_addr
        if addr is None:
            return self.hosts[0].address
        host = self.inventory.get(addr)
        return host.address if host is not None else addr

    def sync_root(self, host: Host) -> str:
        """Where [sync] puts the host's copy of the source (requires `sync`)."""
        assert self.sync is not None
        return self.sync.root_for(host.workdir)

    def workdir_for(self, host: Host) -> str:
        """The directory the job runs in on `host`: with [sync], the job file's directory inside
        the host's copy; else the host's workdir, else the job file's (shared filesystem)."""
        if self.sync is not None:
            return self.sync.job_dir_in(self.sync_root(host), self.base_dir)
        return host.workdir if host.workdir is not None else str(self.base_dir)


@dataclass(frozen=True)
class JobOverrides:
    """Command-line overrides, applied after the job file."""

    nproc_per_node: NprocSpec | None = None
    master_port: int | Literal["auto"] | None = None
    env: tuple[tuple[str, str], ...] = ()
    hosts: tuple[str, ...] | None = None
    backend: Literal["ssh", "slurm"] | None = None  # None: [slurm] in the job file decides
    metrics_port: int | None = None  # --metrics-port: replaces [metrics] port
