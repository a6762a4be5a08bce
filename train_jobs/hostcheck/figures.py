"""The host check's figures, declared once (pure; standard library only: it runs on the hosts, inside
the inline program, on their Python): the one message node 0 prints as `DDPCTL-DEEP <json>` and doctor
reads (orchestrator/doctor/deep.py) and shows in `--json` as "deep".

Node 0's coordinator builds a DeepFigures (coordinate.py) and check.py prints its to_json; doctor
decodes the line with from_json, adds the hosts by rank and the logs, and every reader takes
attributes. The JSON:

    {"schema": 2, "bytes": 2097152, "iters": 2, "rounds": 7, "all_pairs": true,
     "links": [LinkRow, ...], "compute": [ComputeRow, ...], "tested": [0, 1, ...],
     "missed": [Missed, ...], "phases": {"join_s": 0.5, "compute_s": 1.9, "links_s": 4.2},
     "backend": "gloo", "coordinator_host_error": "...", "hosts": ["node0", ...], "logs": "runs/..."}

`coordinator_host_error` only where node 0's own worker failed, `hosts` and `logs` only once doctor
has added them, a phase only where it ran. Each value is kept as it travels (seconds at 3 decimals,
a link's first figure None where it is its figure), so a message equals its decoded copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from train_jobs.hostcheck.verdict import Figure

SCHEMA = 2  # the figures' version: a line of another is not read

# The lines every host's check prints, declared once: node 0's figures, and the marks of its start
# that doctor's side reads to bound a start no coordinator can (orchestrator/doctor/deep_start.py).
RESULT = "DDPCTL-DEEP "  # node 0: "DDPCTL-DEEP <json>", the figures
STARTED = "DDPCTL-DEEP-START"  # "... rank=<r> store=<host:port>": the check runs (torch imported) and dials node 0
JOINED = "DDPCTL-DEEP-JOINED"  # "... rank=<r>": it reached node 0's store and joined
SERVING = "DDPCTL-DEEP-SERVING"  # node 0: "... <host:port>": its store serves; the coordinator waits for the joins
ROUND = "DDPCTL-DEEP-ROUND"  # node 0: "... <i> <pairs>", as each link round ends (progress)
LATE = "DDPCTL-DEEP-LATE"  # a host that lost the coordinator (named late already)


def _seconds(value: float) -> float:
    """Seconds as they travel: 3 decimals."""
    return round(float(value), 3)


def _optional_seconds(value: Any) -> float | None:
    return None if value is None else _seconds(value)


@dataclass(frozen=True)
class ComputeRow:
    """One device of one host (coordinate.best_windows): its best window's TFLOP/s, and every window's."""

    rank: int
    device: str  # "cpu" or "cuda:<i>"
    gpu: str | None  # the GPU's name (None: the host's CPU)
    model: str  # what it is compared with: the GPU's name, or the CPU's model and threads
    tflops: float  # its best window's
    seconds: float = 0.0  # how long that window ran
    windows: tuple[float, ...] = ()  # every window's TFLOP/s, in order
    kernel_shared_by: int = 1  # the hosts on its kernel (timed in turns)

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "device": self.device, "gpu": self.gpu, "model": self.model,
                "tflops": self.tflops, "seconds": self.seconds, "windows": list(self.windows),
                "kernel_shared_by": self.kernel_shared_by}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> ComputeRow:
        gpu = row.get("gpu")
        return cls(int(row["rank"]), str(row["device"]), None if gpu is None else str(gpu), str(row["model"]),
                   float(row["tflops"]), float(row.get("seconds", 0.0)),
                   tuple(float(w) for w in row.get("windows", ())), int(row.get("kernel_shared_by", 1)))


@dataclass(frozen=True)
class LinkRow:
    """One pair's figure (ranks a < b) and the rounds it was measured in."""

    a: int
    b: int
    figure: Figure
    rounds: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, **self.figure.to_json(), "rounds": list(self.rounds)}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> LinkRow:
        return cls(int(row["a"]), int(row["b"]), Figure.from_json(row), tuple(int(r) for r in row.get("rounds", ())))


@dataclass(frozen=True)
class Missed:
    """A deadline that a host (or pair) missed."""

    phase: str  # "join", "compute" or "links"
    ranks: tuple[int, ...]
    after_s: float  # the deadline it missed
    others_s: float | None  # the median time of those that made it
    detail: str = ""
    round: int | None = None  # the link round

    def __post_init__(self) -> None:  # seconds as they travel
        object.__setattr__(self, "after_s", _seconds(self.after_s))
        object.__setattr__(self, "others_s", _optional_seconds(self.others_s))

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "ranks": list(self.ranks), "after_s": self.after_s, "others_s": self.others_s,
                "detail": self.detail, "round": self.round}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> Missed:
        number = row.get("round")
        return cls(str(row["phase"]), tuple(int(r) for r in row["ranks"]), float(row["after_s"]),
                   _optional_seconds(row.get("others_s")), str(row.get("detail", "")),
                   None if number is None else int(number))


@dataclass(frozen=True)
class Phases:
    """Seconds each phase took (None: it did not run; the links need two hosts)."""

    join_s: float | None = None
    compute_s: float | None = None
    links_s: float | None = None

    def __post_init__(self) -> None:  # seconds as they travel
        for name in ("join_s", "compute_s", "links_s"):
            object.__setattr__(self, name, _optional_seconds(getattr(self, name)))

    def to_json(self) -> dict[str, float]:
        every = (("join_s", self.join_s), ("compute_s", self.compute_s), ("links_s", self.links_s))
        return {name: value for name, value in every if value is not None}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> Phases:
        return cls(_optional_seconds(row.get("join_s")), _optional_seconds(row.get("compute_s")),
                   _optional_seconds(row.get("links_s")))


@dataclass(frozen=True)
class DeepFigures:
    """Everything the host check measured: node 0 prints it, doctor judges it (`hosts`: by rank)."""

    nbytes: int  # each way, per timed exchange ("bytes")
    iters: int  # timed exchanges per pair, at least
    rounds: int  # link rounds run
    all_pairs: bool  # every pair of every host was measured (False: a covering schedule, or a host left out)
    links: tuple[LinkRow, ...]
    compute: tuple[ComputeRow, ...]
    tested: tuple[int, ...]  # the ranks that finished their compute test in time
    missed: tuple[Missed, ...]
    phases: Phases
    backend: str  # "gloo" or "nccl": what the pairs exchanged over
    coordinator_host_error: str | None = None  # node 0's own worker failed (its figures are missing)
    hosts: tuple[str, ...] | None = None  # the hosts by rank: doctor's, once it read the line
    logs: str | None = None  # the job's run directory: doctor's

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCHEMA, "bytes": self.nbytes, "iters": self.iters, "rounds": self.rounds,
            "all_pairs": self.all_pairs, "links": [row.to_json() for row in self.links],
            "compute": [row.to_json() for row in self.compute], "tested": list(self.tested),
            "missed": [m.to_json() for m in self.missed], "phases": self.phases.to_json(), "backend": self.backend}
        if self.coordinator_host_error is not None:
            out["coordinator_host_error"] = self.coordinator_host_error
        if self.hosts is not None:
            out["hosts"] = list(self.hosts)
        if self.logs is not None:
            out["logs"] = self.logs
        return out

    @classmethod
    def from_json(cls, data: Any) -> DeepFigures:
        """The figures of one JSON object; ValueError where it is not (a key missing, a value of the
        wrong kind, another schema)."""
        try:
            return cls._decode(data)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not the host check's figures: {type(exc).__name__}: {exc}") from exc

    @classmethod
    def _decode(cls, data: Mapping[str, Any]) -> DeepFigures:
        if data["schema"] != SCHEMA:
            raise ValueError(f"schema {data['schema']!r}, not {SCHEMA}")
        error, hosts, logs = data.get("coordinator_host_error"), data.get("hosts"), data.get("logs")
        return cls(int(data["bytes"]), int(data["iters"]), int(data["rounds"]), bool(data["all_pairs"]),
                   tuple(LinkRow.from_json(row) for row in data["links"]),
                   tuple(ComputeRow.from_json(row) for row in data["compute"]),
                   tuple(int(r) for r in data["tested"]), tuple(Missed.from_json(m) for m in data["missed"]),
                   Phases.from_json(data["phases"]), str(data["backend"]), None if error is None else str(error),
                   None if hosts is None else tuple(str(h) for h in hosts), None if logs is None else str(logs))
