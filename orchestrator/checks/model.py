"""Doctor's typed data: the context it checks, probe outcomes, findings, report (per-host facts are
the facts op's typed reply, remote.wire.HostFacts)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inventory import Host, HostNproc
from orchestrator.errors import HostError
from orchestrator.remote.wire import HostFacts
from train_jobs.hostcheck.figures import DeepFigures


class CheckStatus(str, enum.Enum):
    OK = "ok"
    INFO = "info"
    SKIP = "skip"
    WARN = "warn"
    FAIL = "fail"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {CheckStatus.SKIP: 0, CheckStatus.OK: 1, CheckStatus.INFO: 2, CheckStatus.WARN: 3,
         CheckStatus.FAIL: 4}


@dataclass(frozen=True)
class Basis:
    """What a measured verdict rests on (doctor --deep): how many measurements, with which
    partners and their figures, against what reference."""

    measurements: int
    partners: tuple[str, ...] = ()
    figures: tuple[float, ...] = ()  # by partner (a host's own figure where it has no partner)
    reference: float | None = None  # what the figures were compared with (the median)
    unit: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"measurements": self.measurements, "partners": list(self.partners),
                "figures": [round(f, 3) for f in self.figures],
                "reference": None if self.reference is None else round(self.reference, 3), "unit": self.unit}


@dataclass(frozen=True)
class Finding:
    """One result of one check on one host (host None: about the whole cluster)."""

    check: str
    status: CheckStatus
    host: str | None
    message: str
    evidence: str = ""
    fix: str = ""
    basis: Basis | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"check": self.check, "status": self.status.value, "host": self.host,
               "message": self.message, "evidence": self.evidence, "fix": self.fix}
        if self.basis is not None:
            out["basis"] = self.basis.to_json()
        return out


@dataclass(frozen=True)
class DoctorContext:
    """What doctor checks: the hosts (first = master unless named), rendezvous and job env."""

    hosts: tuple[Host, ...]
    master: Host
    master_addr: str
    master_port: int | None  # None: "auto" (a free port is picked at launch)
    workdirs: Mapping[str, str]  # host name -> workdir
    script: str | None = None  # relative to workdir
    env: Mapping[str, str] = field(default_factory=dict)  # the job's env (wins over the host's)
    nproc_per_node: object = 1  # the job's ("gpu" asks every host for GPUs)
    # what decides each host's process count, where a job gives it (its slots may differ per host)
    nprocs: Mapping[str, HostNproc] = field(default_factory=dict)
    rdzv_backend: str = "static"  # "c10d" looks every host's own hostname up ...
    # ... unless the launch gives torchrun each host's address (--local-addr: up does, from the
    # address the host reported, addressing.Addressing.own; a Slurm batch script does not)
    gives_local_addr: bool = False
    connect_timeout_s: float = 4.0  # the probe's bound per pair, retries included
    timeout_s: float = 120.0
    use_cache: bool = True  # hosts may reuse torch facts cached under an exact key
    session: str = "non-interactive SSH session"  # what runs the launch on a host (fixes name it)
    python_key: str = "python = \"/absolute/path/to/python\" for {host} in the inventory"
    # The job has [sync]: the command that syncs it, and the SHA-256 of this machine's script
    # (every host's copy must match it, not only each other).
    sync_command: str | None = None
    script_sha256: str | None = None
    # False: the job names no master_addr, so it is picked from the master's routes
    # (doctor/addressing.py; `master_addr` is the inventory's address until then), and
    # `master_picked` says how it was once picked
    master_given: bool = True
    master_picked: str = ""
    pick_interfaces: bool = True  # [rendezvous] pick_interfaces (GLOO/NCCL_SOCKET_IFNAME)
    # [restart] checkpoint_dir as the job gives it (relative to each host's workdir unless
    # absolute, `~` the host's); None: the checkpoint check does not run. `checkpoint_markers`:
    # host -> the marker file it writes there for one doctor run (gather.checkpoint_markers)
    checkpoint_dir: str | None = None
    checkpoint_markers: Mapping[str, str] = field(default_factory=dict)
    # [restart] max_restarts of the job file; above 0 the restarts check runs: does the first
    # host's interpreter find ddpctl (`up --detach` runs the job's restarts from there)
    max_restarts: int = 0

    @property
    def local_only(self) -> bool:
        return all(h.is_local for h in self.hosts)

    def host_env(self, host: Host, host_facts_env: Mapping[str, str]) -> dict[str, str]:
        """The env a launched process sees: host env < inventory env < job env."""
        return {**host_facts_env, **host.env, **self.env}


@dataclass(frozen=True)
class ProbeOutcome:
    """One TCP connect of the probe phase: `source` dialed `target_host` at `address:port`."""

    source: str
    target_host: str
    address: str
    port: int
    purpose: str  # "master_port" or "ephemeral"
    ok: bool
    kind: str  # ok / refused / timeout / unreachable / unresolved / error / not_listening
    error: str = ""
    attempts: int = 1  # dials made (a timed-out dial is retried within the probe's bound)
    waited_ms: tuple[float, ...] = ()  # how long each failed dial waited


@dataclass
class ProbeResults:
    outcomes: list[ProbeOutcome] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # purpose -> why not run
    errors: dict[str, str] = field(default_factory=dict)  # host -> probe agent failure
    sampled: str = ""  # how the dials were sampled (doctor/probeplan.py); "" where all pairs were


@dataclass(frozen=True)
class Observations:
    """Everything the checks read: pure input, no connections."""

    ctx: DoctorContext
    facts: Mapping[str, HostFacts]
    failed: Mapping[str, HostError]
    probes: ProbeResults


@dataclass
class Report:
    hosts: list[str]
    checks: list[str]
    findings: list[Finding]
    unreachable: set[str] = field(default_factory=set)
    elapsed_s: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # phase -> seconds
    bandwidth: dict[str, Any] | None = None  # --bandwidth: the allreduce_bench BANDWIDTH json
    deep: DeepFigures | None = None  # --deep: the host check's figures (orchestrator/doctor/deep.py)
    facts: Mapping[str, HostFacts] = field(default_factory=dict)  # what each host that answered said (not in --json)

    def cell(self, host: str, check: str) -> CheckStatus:
        """The worst status of `check` on `host` (cluster-wide findings count for every host
        that answered)."""
        scopes = (host,) if host in self.unreachable else (host, None)
        statuses = [f.status for f in self.findings if f.check == check and f.host in scopes]
        return max(statuses, key=lambda s: s.rank, default=CheckStatus.SKIP)

    def count(self, status: CheckStatus) -> int:
        return sum(1 for f in self.findings if f.status == status)

    def exit_code(self, strict: bool = False) -> int:
        if self.count(CheckStatus.FAIL) or (strict and self.count(CheckStatus.WARN)):
            return 1
        return 0

    def to_json(self, strict: bool = False) -> dict[str, Any]:
        return {
            "ok": self.exit_code(strict) == 0,
            "exit_code": self.exit_code(strict),
            "hosts": self.hosts,
            "checks": self.checks,
            "table": {h: {c: self.cell(h, c).value for c in self.checks} for h in self.hosts},
            "summary": {s.value: self.count(s) for s in CheckStatus},
            "findings": [f.to_json() for f in self.findings],
            "elapsed_s": round(self.elapsed_s, 3),
            "phases": {k: round(v, 3) for k, v in self.phases.items()},
            "bandwidth": self.bandwidth,
            "deep": None if self.deep is None else self.deep.to_json(),
        }
