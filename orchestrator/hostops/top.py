"""`ddpctl top`: one row per host (per node of a job) from every host's top op, worst first.

The rows are data: rendering lives in orchestrator/commands/top.py. A host that cannot be reached
or whose agent fails is a row with its error; a host whose nvidia-smi fails is a row with that
error and everything else it sampled (CPU, memory, steps)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inventory import Host
from inventory.specs import SlurmSpec
from node_agent.wire.layout import slurm_state_dir
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.hostops import slurm_jobs
from orchestrator.remote.agent import call_agent
from orchestrator.remote.pool import HostPool
from orchestrator.remote.slurm_client import SlurmClient, on_every_node
from orchestrator.remote.transport import Transport
from orchestrator.remote.wire import HostTop, TopNode, parse_top, selected_gpus

DEFAULT_INTERVAL_S = 2.0
REPLY_SLACK_S = 15.0  # a host's reply may come this long after its sampling interval
SLURM_SLACK_S = 60.0  # srun --overlap on every node of the job, on top of the interval
MIB_PER_GIB = 1024.0
# A host that gave no answer for one of these reasons is unreachable; any other failure is an error.
UNREACHABLE_KINDS = frozenset({HostErrorKind.UNREACHABLE, HostErrorKind.SSHD_DOWN, HostErrorKind.UNRESOLVED,
                               HostErrorKind.TIMEOUT, HostErrorKind.LOST})


class TopState(str, enum.Enum):
    """A host's state in `top`'s row."""

    RUNNING = "running"
    NO_JOB = "no job"
    UNREACHABLE = "unreachable"
    ERROR = "error"


@dataclass(frozen=True)
class TopRow:
    """One host (one node of a job on it, where it runs several) as `top` shows it."""

    host: str
    state: TopState
    job_id: str | None = None
    node_rank: int | None = None
    ranks_alive: int | None = None
    ranks_expected: int | None = None
    step: int | None = None  # the most optimizer steps a rank of it took
    total: int | None = None
    steps_per_s: float | None = None  # the slowest rank's
    p50_ms: float | None = None  # the slowest rank's
    p95_ms: float | None = None
    stalled: bool = False  # a live rank's step record is stale
    gpus: int = 0
    gpu_util_min: float | None = None
    gpu_util_max: float | None = None
    gpu_memory_used_mib: float | None = None
    gpu_memory_total_mib: float | None = None
    power_w: float | None = None
    cpu_pct: float | None = None
    rss_bytes: int | None = None
    iface: str | None = None
    iface_source: str | None = None
    tx_bytes_per_s: float | None = None
    rx_bytes_per_s: float | None = None
    log_age_s: float | None = None
    error: str | None = None
    fix: str | None = None
    detail: str | None = None  # e.g. how a job's node that no longer runs ended

    @property
    def gpu_memory_used_gib(self) -> float | None:
        return None if self.gpu_memory_used_mib is None else self.gpu_memory_used_mib / MIB_PER_GIB

    @property
    def gpu_memory_total_gib(self) -> float | None:
        return None if self.gpu_memory_total_mib is None else self.gpu_memory_total_mib / MIB_PER_GIB

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "state": self.state.value, "job_id": self.job_id, "node_rank": self.node_rank,
                "ranks_alive": self.ranks_alive, "ranks_expected": self.ranks_expected, "step": self.step,
                "total": self.total, "steps_per_s": self.steps_per_s, "p50_ms": self.p50_ms, "p95_ms": self.p95_ms,
                "stalled": self.stalled, "gpus": self.gpus, "gpu_util_min": self.gpu_util_min,
                "gpu_util_max": self.gpu_util_max, "gpu_memory_used_mib": self.gpu_memory_used_mib,
                "gpu_memory_total_mib": self.gpu_memory_total_mib, "power_w": self.power_w,
                "cpu_pct": self.cpu_pct, "rss_bytes": self.rss_bytes, "iface": self.iface,
                "iface_source": self.iface_source, "tx_bytes_per_s": self.tx_bytes_per_s,
                "rx_bytes_per_s": self.rx_bytes_per_s, "log_age_s": self.log_age_s, "error": self.error,
                "fix": self.fix, "detail": self.detail}


@dataclass(frozen=True)
class TopReport:
    job: str | None  # what the user asked for (None: every job)
    rows: tuple[TopRow, ...]
    failed: tuple[str, ...] = ()  # hosts whose agent gave no answer (their rows say why)

    @property
    def running(self) -> bool:
        return any(r.job_id is not None and r.detail is None for r in self.rows)

    def to_json(self) -> dict[str, Any]:
        return {"job": self.job, "rows": [r.to_json() for r in self.rows]}


# -- rows -----------------------------------------------------------------------------------------

def _gpu_fields(host: HostTop, select: Sequence[str] | None) -> dict[str, Any]:
    gpus = selected_gpus(host.gpus, select)
    utils = [g.util_pct for g in gpus if g.util_pct is not None]
    used = [g.memory_used_mib for g in gpus if g.memory_used_mib is not None]
    total = [g.memory_total_mib for g in gpus if g.memory_total_mib is not None]
    power = [g.power_w for g in gpus if g.power_w is not None]
    errors = ([host.gpu_error] if host.gpu_error else []) + [f"{g.label}: {g.error}" for g in gpus if g.error]
    return {"gpus": len(gpus), "gpu_util_min": min(utils) if utils else None,
            "gpu_util_max": max(utils) if utils else None,
            "gpu_memory_used_mib": sum(used) if used else None,
            "gpu_memory_total_mib": sum(total) if total else None,
            "power_w": round(sum(power), 1) if power else None,
            "error": "; ".join(errors) if errors else None}


def _min(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return min(got) if got else None


def _max(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return max(got) if got else None


def node_row(host: HostTop, node: TopNode) -> TopRow:
    gpu = _gpu_fields(host, node.gpu_select)
    steps = [r.step for r in node.ranks if r.step is not None]
    totals = [r.total for r in node.ranks if r.total is not None]
    detail = None if node.running else f"node {node.node_rank} {node.status}" + (
        f" (exit code {node.exit_code})" if node.exit_code is not None else "")
    state = TopState.RUNNING if node.running else TopState.NO_JOB
    return TopRow(
        host.host, TopState.ERROR if gpu["error"] else state, node.job_id, node.node_rank,
        node.ranks_alive, node.ranks_expected, max(steps) if steps else None, max(totals) if totals else None,
        _min(r.steps_per_s for r in node.ranks) if node.running else None,
        _max(r.p50_ms for r in node.ranks), _max(r.p95_ms for r in node.ranks),
        node.running and any(r.stalled for r in node.ranks),
        gpu["gpus"], gpu["gpu_util_min"], gpu["gpu_util_max"], gpu["gpu_memory_used_mib"],
        gpu["gpu_memory_total_mib"], gpu["power_w"], node.cpu_pct, node.rss_bytes, node.iface, node.iface_source,
        node.tx_bytes_per_s, node.rx_bytes_per_s, node.log_age_s, gpu["error"], None, detail)


def host_rows(host: HostTop) -> list[TopRow]:
    """One row per node the host reported; a host that runs none is one `no job` row (with its GPUs)."""
    if host.nodes:
        return [node_row(host, n) for n in host.nodes]
    gpu = _gpu_fields(host, None)
    return [TopRow(host.host, TopState.ERROR if gpu["error"] else TopState.NO_JOB, gpus=gpu["gpus"],
                   gpu_util_min=gpu["gpu_util_min"], gpu_util_max=gpu["gpu_util_max"],
                   gpu_memory_used_mib=gpu["gpu_memory_used_mib"], gpu_memory_total_mib=gpu["gpu_memory_total_mib"],
                   power_w=gpu["power_w"], error=gpu["error"])]


def failed_row(host: str, err: HostError) -> TopRow:
    state = TopState.UNREACHABLE if err.kind in UNREACHABLE_KINDS else TopState.ERROR
    return TopRow(host, state, error=err.message, fix=err.fix or None)


def sort_key(row: TopRow) -> tuple[int, float, str, str, int]:
    """Worst first: unreachable and error rows, then a stalled host, then the slowest steps/s, then
    hosts running without a rate yet, then the hosts that run no job; by name within each."""
    if row.state in (TopState.UNREACHABLE, TopState.ERROR):
        group, rate = 0, 0.0
    elif row.stalled:
        group, rate = 1, 0.0
    elif row.state is TopState.RUNNING and row.steps_per_s is not None:
        group, rate = 2, row.steps_per_s
    elif row.state is TopState.RUNNING:
        group, rate = 3, 0.0
    else:
        group, rate = 4, 0.0
    return group, rate, row.host, row.job_id or "", row.node_rank if row.node_rank is not None else -1


def build_report(job: str | None, results: Mapping[str, HostTop], failed: Mapping[str, HostError]) -> TopReport:
    """Every host's rows, worst first."""
    rows = [row for host in results.values() for row in host_rows(host)]
    rows += [failed_row(host, err) for host, err in failed.items()]
    return TopReport(job, tuple(sorted(rows, key=sort_key)), tuple(failed))


# -- sampling over SSH ------------------------------------------------------------------------------

@dataclass
class TopSession:
    """Samples the hosts again and again over the pool's connections (`ddpctl top` refreshing): a
    host that timed out or lost its connection gets a fresh one the next time (the old one may be
    stuck in TCP backoff)."""

    pool: HostPool
    hosts: Sequence[Host]
    job: str | None
    interval: float = DEFAULT_INTERVAL_S
    _stale: set[str] = field(default_factory=set)

    def _one(self, t: Transport) -> HostTop:
        if t.host.name in self._stale:
            t.reconnect()
            self._stale.discard(t.host.name)
        reply = call_agent(t, "top", {"job": self.job, "interval": self.interval},
                           timeout=self.interval + REPLY_SLACK_S)
        return parse_top(t.host.name, reply.result)

    def sample(self) -> TopReport:
        fan = self.pool.map(self.hosts, self._one)
        self._stale |= {h for h, err in fan.failed.items() if err.kind in (HostErrorKind.TIMEOUT, HostErrorKind.LOST)}
        return build_report(self.job, fan.succeeded, fan.failed)


def collect(pool: HostPool, hosts: Sequence[Host], job: str | None,
            interval: float = DEFAULT_INTERVAL_S) -> TopReport:
    """One sample of every host (`top --once`)."""
    return TopSession(pool, hosts, job, interval).sample()


# -- sampling a Slurm job -----------------------------------------------------------------------------

def slurm_targets(client: SlurmClient, name: str | None) -> list[slurm_jobs.SlurmTarget]:
    """The running Slurm job `name` means (a Slurm id, ddpctl id or job name), or every running
    ddpctl job in the queue."""
    if name is None:
        return [slurm_jobs.SlurmTarget(j.name, j.job_id, j.state) for j in slurm_jobs.ddpctl_jobs(client)
                if j.state == "RUNNING"]
    target = slurm_jobs.find(client, name)
    if target is None:
        raise slurm_jobs.not_found(client, name)
    if target.slurm_id is None or target.state != "RUNNING":
        raise HostError(client.transport.host.name, HostErrorKind.SLURM,
                        f"Slurm job {target.slurm_id or target.job_id} is not running ({target.state or 'ended'})",
                        "`ddpctl ps --backend slurm` lists the running ones")
    return [target]


def slurm_sample(client: SlurmClient, spec: SlurmSpec, target: slurm_jobs.SlurmTarget,
                 interval: float) -> tuple[dict[str, HostTop], dict[str, HostError]]:
    """Every node of a running Slurm job, through `srun --overlap` (as `stacks` does): each node's
    answer (keyed by job id and hostname) under its own hostname; node<i> where it gave none."""
    assert target.slurm_id is not None
    count = client.show_job(target.slurm_id).get("NumNodes", "1").split("-")[0]
    names = [f"node{i}" for i in range(int(count) if count.isdigit() else 1)]
    replies, errors = on_every_node(client, spec, target.slurm_id, names, "top",
                                    {"job": target.job_id, "interval": interval},
                                    f"{slurm_state_dir(client.home(), target.job_id)}/top", interval + SLURM_SLACK_S)
    results: dict[str, HostTop] = {}
    for name, reply in replies.items():
        try:
            parsed = parse_top(name, reply)
        except HostError as err:
            errors[name] = err
            continue
        results[f"{target.job_id}/{parsed.hostname}"] = dataclasses.replace(parsed, host=parsed.hostname)
    return results, errors


def collect_slurm(client: SlurmClient, spec: SlurmSpec, name: str | None,
                  interval: float = DEFAULT_INTERVAL_S) -> TopReport:
    """One sample of the nodes of a running Slurm job (or of every running ddpctl Slurm job)."""
    results: dict[str, HostTop] = {}
    failed: dict[str, HostError] = {}
    for target in slurm_targets(client, name):
        got, errors = slurm_sample(client, spec, target, interval)
        results.update(got)
        failed.update({f"{target.job_id}/{node}" if name is None else node: err for node, err in errors.items()})
    return build_report(name, results, failed)
