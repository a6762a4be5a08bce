"""The job's [slurm] and [sync] settings as frozen dataclasses (read and validated by slurm_table.py
and sync.py); nothing here imports the rest of the package."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

DEFAULT_SIGNAL = "USR1@90"

# Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
_TIME = re.compile(r"^(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
                   r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$")
SIGNAL_FORM = re.compile(r"^(?:B:)?(?:SIG)?(?P<name>[A-Z0-9]+)(?:@(?P<lead>\d+))?$")


def time_seconds(text: str) -> int | None:
    """Seconds of a Slurm time limit ("30", "1:30:00", "2-00:00:00"); None for UNLIMITED/INFINITE
    or a form Slurm does not take."""
    m = _TIME.match(text.strip())
    if m is None:
        return None
    if m.group("d") is not None:
        d, h, mi, s = (int(m.group(k) or 0) for k in ("d", "dh", "dm", "ds"))
        return ((d * 24 + h) * 60 + mi) * 60 + s
    parts = [int(p) for p in (m.group("a"), m.group("b"), m.group("c")) if p is not None]
    if len(parts) == 1:
        return parts[0] * 60  # minutes
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]  # minutes:seconds
    return (parts[0] * 60 + parts[1]) * 60 + parts[2]


@dataclass(frozen=True)
class SlurmSpec:
    """What `sbatch` is asked for and how each node starts its torchrun (one per node)."""

    nodes: int = 1
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None  # Slurm's own syntax, e.g. "01:00:00"
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    mem: str | None = None  # per node, e.g. "64G"
    constraint: str | None = None
    python: str = "python3"  # the interpreter on the nodes
    extra_sbatch: tuple[str, ...] = ()  # raw sbatch options, one per #SBATCH line
    setup: tuple[str, ...] = ()  # shell lines run on each node before torchrun
    requeue: bool = False
    signal: str = DEFAULT_SIGNAL  # NAME@seconds before the time limit, sent to the batch shell
    login: str | None = None  # run the Slurm commands there over SSH (else: here)
    workdir: str | None = None  # the job's directory on the cluster (default: the job file's)
    exclude: tuple[str, ...] = ()  # nodes a restart leaves out (sbatch --exclude): never from the job file
    metrics_dir: str | None = None  # [slurm.metrics] textfile_dir: node_exporter's, on every node

    @property
    def signal_name(self) -> str:
        m = SIGNAL_FORM.match(self.signal)
        return m.group("name") if m else "USR1"

    @property
    def signal_lead_s(self) -> int:
        m = SIGNAL_FORM.match(self.signal)
        return int(m.group("lead") or 60) if m else 90

    @property
    def time_s(self) -> int | None:
        return time_seconds(self.time) if self.time is not None else None

    def resource_options(self) -> list[str]:
        """Where the job may run and what each node gets, as sbatch options (the launch's and
        doctor's allocations): never --gpus-per-task, which hides a node's GPUs from each other."""
        named = (("partition", self.partition), ("account", self.account), ("qos", self.qos),
                 ("gpus-per-node", self.gpus_per_node), ("cpus-per-task", self.cpus_per_task), ("mem", self.mem),
                 ("constraint", self.constraint))
        return [f"--{name}={value}" for name, value in named if value is not None]


@dataclass(frozen=True)
class SyncSpec:
    """What `up` (and `ddpctl sync`) copies where. A host's copy lands in its own `workdir`, else
    in `dest`, else at the same path as `src` (the layout a shared filesystem would give)."""

    src: Path  # absolute: the directory whose contents every host gets
    dest: str | None = None  # on the hosts; relative paths and "~" are from the login's home
    delete: bool = True  # remove files the source no longer has (excluded ones are kept)
    exclude: tuple[str, ...] = ()  # .gitignore-style patterns, relative to src
    gitignore: bool = True  # also skip what the .gitignore files under src ignore
    checksum: bool = False  # compare contents (SHA-256), not size + modification time

    def root_for(self, workdir: str | None) -> str:
        """Where a host's copy of `src` lands, given the host's own workdir setting."""
        if workdir is not None:
            return workdir
        return self.dest if self.dest is not None else str(self.src)

    def job_dir_in(self, root: str, base_dir: Path) -> str:
        """The job file's directory inside a host's copy (the job runs there, as it would here)."""
        try:
            rel = base_dir.relative_to(self.src)
        except ValueError:
            return root
        return root if rel == Path(".") else str(PurePosixPath(root) / rel.as_posix())
