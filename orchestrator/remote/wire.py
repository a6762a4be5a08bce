"""Typed replies of the node agent's ops: each op's JSON result is parsed here, once, into dataclasses.

Nothing above the remote layer indexes an agent reply by string keys; commands and the launch
pipeline read these types (facts, port owners and kill reports, a supervised node's result, the
jobs a host runs, what `down` stopped, what `logs` found).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import HostError, HostErrorKind

# The start of a node's stop reason when `ddpctl down` stopped it (node_agent/runstate.py writes it).
STOPPED_BY_DOWN = "stopped by `ddpctl down`"


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def one_line(argv: Sequence[str]) -> str:
    """A command line for a table cell: arguments joined, newlines and runs of spaces collapsed."""
    return " ".join(" ".join(argv).split())


# -- ports (port_owners, kill_port, and the facts op's master_port) ----------------------------

@dataclass(frozen=True)
class PortOwner:
    pid: int
    user: str
    command: str
    age_s: float | None
    status: str  # LISTEN, ESTABLISHED, BOUND (udp) ...
    ddpctl_job_id: str | None
    is_torchrun: bool
    refusal: str | None  # why it will not be killed, or None
    torchrun_agent: int | None = None  # a torchrun worker's agent pid: the kill takes the agent's whole tree
    job_live: bool = False  # its ddpctl job's supervisor on that host still runs it

    def describe(self, width: int = 160) -> str:
        job = f", ddpctl job {self.ddpctl_job_id}" if self.ddpctl_job_id else ""
        return f"pid {self.pid} (user {self.user}{job}): {self.command[:width]}"


def parse_owner(o: Mapping[str, Any]) -> PortOwner:
    return PortOwner(int(o["pid"]), str(o.get("user")), one_line(o.get("cmdline") or [o.get("name") or "?"]),
                     o.get("age_s"), str(o.get("status")), o.get("ddpctl_job_id"), bool(o.get("is_torchrun")),
                     o.get("refusal"), _int_or_none(o.get("torchrun_agent")), bool(o.get("job_live")))


@dataclass(frozen=True)
class KilledProcess:
    pid: int
    command: str
    signal: str  # the signal that ended it: SIGTERM, or SIGKILL after the grace period
    owner: bool  # held the port itself (False: part of its process tree)


@dataclass(frozen=True)
class RefusedProcess:
    pid: int | None  # None: a socket whose process the agent cannot see
    reason: str


@dataclass(frozen=True)
class UnseenSocket:
    """A socket on the port held by a process the agent's user cannot see (another user's)."""

    status: str
    laddr: str
    user: str


@dataclass(frozen=True)
class PortReport:
    host: str
    port: int
    proto: str
    owners: tuple[PortOwner, ...]
    time_wait: int  # TIME_WAIT sockets with no process
    time_wait_max_s: float
    killed: tuple[KilledProcess, ...] = ()
    refused: tuple[RefusedProcess, ...] = ()
    errors: tuple[str, ...] = ()  # signals that could not be sent, processes that survived SIGKILL
    free_after: bool | None = None  # None: nothing was attempted
    unseen: tuple[UnseenSocket, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def free(self) -> bool:
        """No process holds the port (TIME_WAIT alone does not stop a SO_REUSEADDR bind)."""
        return self.free_after if self.free_after is not None else not self.owners and not self.unseen

    @property
    def killable(self) -> list[PortOwner]:
        return [o for o in self.owners if o.refusal is None]


def parse_report(host: str, r: Mapping[str, Any]) -> PortReport:
    owners = tuple(parse_owner(o) for o in r.get("owners", []))
    killed = tuple(KilledProcess(int(k["pid"]), one_line([str(k.get("cmdline", ""))]), str(k.get("signal")),
                                 bool(k.get("owner"))) for k in r.get("killed", []))
    refused = tuple(RefusedProcess(_int_or_none(x.get("pid")), str(x["reason"])) for x in r.get("refused", []))
    unseen = tuple(UnseenSocket(str(u.get("status")), str(u.get("laddr")), str(u.get("user")))
                   for u in r.get("unseen", []))
    errors = tuple(f"pid {e.get('pid')}: {e.get('error')}" for e in r.get("errors", []))
    return PortReport(host, int(r["port"]), str(r.get("proto", "tcp")), owners, int(r.get("time_wait", 0)),
                      float(r.get("time_wait_max_s", 0.0)), killed, refused, errors,
                      r.get("free_after") if "killed" in r and not r.get("dry_run") else None, unseen, r)


@dataclass(frozen=True)
class MasterPortFact:
    """The facts op's look at the master port on the master host."""

    port: int
    bindable: bool
    bind_error: str | None
    owners: tuple[PortOwner, ...] | None  # None: this agent cannot list owners


def parse_master_port(d: Mapping[str, Any]) -> MasterPortFact:
    raw = d.get("owners")
    owners = None if raw is None else tuple(parse_owner(o) for o in raw if isinstance(o, Mapping) and o.get("pid"))
    return MasterPortFact(int(d.get("port") or 0), bool(d.get("bindable", True)), d.get("bind_error"), owners)


@dataclass(frozen=True)
class CheckpointFact:
    """The facts op's look at [restart] checkpoint_dir on one host (node_agent/facts.py)."""

    path: str  # as the host resolved it (workdir-relative, `~` expanded there)
    writable: bool  # it exists or was created, and a file could be written in it
    existed: bool | None  # it was there before doctor looked (False: doctor created it)
    step: str | None  # where it failed: "mkdir", "write" or "timeout"
    error: str | None  # ... with the OS error
    seen: tuple[str, ...] | None  # hosts whose marker file it saw there (None: it did not look)
    list_error: str | None  # why it could not list the directory
    cleanup_error: str | None  # its marker file could not be removed


def parse_checkpoint(d: Mapping[str, Any]) -> CheckpointFact:
    seen = d.get("seen")
    existed = d.get("existed")
    return CheckpointFact(str(d.get("path") or ""), bool(d.get("writable")),
                          None if existed is None else bool(existed), d.get("step"), d.get("error"),
                          None if seen is None else tuple(str(h) for h in seen), d.get("list_error"),
                          d.get("cleanup_error"))


@dataclass(frozen=True)
class ModuleLookupFact:
    """Whether a host's interpreter finds a module, looked up there without importing it (its
    parent packages are imported): node_agent/torch_facts.py lookup_module."""

    found: bool
    origin: str | None  # the module's file where found
    executable: str  # the interpreter that looked (its sys.executable)
    error: str | None  # a parent package failed to import (then not found)


def parse_module_lookup(d: Mapping[str, Any]) -> ModuleLookupFact:
    origin, error = d.get("origin"), d.get("error")
    return ModuleLookupFact(bool(d.get("found")), None if origin is None else str(origin),
                            str(d.get("executable") or ""), None if error is None else str(error))


# -- facts -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HostFacts:
    """The facts op's answer for one host, with the round trip's timing.

    Doctor's checks read sub-facts by name (`get`); the launch reads the typed properties."""

    host: str
    facts: Mapping[str, Any]
    errors: Mapping[str, str]
    sent_at: float = 0.0  # orchestrator wall clock before the call
    received_at: float = 0.0  # ... and after it

    def get(self, name: str, default: Any = None) -> Any:
        return self.facts.get(name, default)

    @property
    def hostname(self) -> str:
        return str(self.facts.get("hostname") or self.host)

    @property
    def route_source(self) -> str | None:
        """The source address of this host's route to the master (not loopback, not the master's
        own local route): the address its peers reach it at."""
        routes = (self.facts.get("resolution") or {}).get("routes") or {}
        for route in routes.values():
            src = route.get("src") if isinstance(route, Mapping) else None
            if src and not str(src).startswith("127.") and route.get("type") != "local":
                return str(src)
        return None

    @property
    def cpu_count(self) -> int:
        return int(self.facts.get("cpu_count") or 1)

    @property
    def gpu_count(self) -> int:
        return int(self.facts.get("gpu_count") or 0)

    @property
    def python_found(self) -> bool:
        return bool((self.facts.get("python") or {}).get("found"))

    @property
    def workdir_exists(self) -> bool:
        return bool((self.facts.get("workdir") or {}).get("exists"))

    @property
    def free_port(self) -> int | None:
        return _int_or_none(self.facts.get("free_port"))

    @property
    def master_port(self) -> MasterPortFact | None:
        mp = self.facts.get("master_port")
        return parse_master_port(mp) if isinstance(mp, Mapping) else None

    @property
    def checkpoint(self) -> CheckpointFact | None:
        """[restart] checkpoint_dir here, with what the host saw of its peers' markers once its
        session ended (the control plane merges that in: doctor/gather.py)."""
        ck = self.facts.get("checkpoint")
        return parse_checkpoint(ck) if isinstance(ck, Mapping) else None

    @property
    def ddpctl_lookup(self) -> ModuleLookupFact | None:
        """Whether the inventory's interpreter here finds ddpctl's CLI (doctor asks the job's first
        host, where `up --detach` runs a job's restarts)."""
        found = self.facts.get("ddpctl_lookup")
        return parse_module_lookup(found) if isinstance(found, Mapping) else None


# -- supervise ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class RankError:
    """The exception that ended a rank, from ddpctl's rank wrapper (or torchelastic's error file
    where the script uses @record), with its traceback and when (the host's clock) it happened."""

    local_rank: int | str | None
    message: str
    traceback: str
    timestamp: float | None
    file: str | None
    rank: int | None = None  # the global rank (RANK), when the wrapper recorded it
    kind: str = ""  # the exception's type name ("" from an error file: it is in the message)
    step: int | None = None  # the optimizer steps the rank had taken when it failed (the wrapper's)
    exit_code: int | None = None  # the code it exited with (sys.exit), where that ended it

    @property
    def summary(self) -> str:
        """`RuntimeError: boom` (or the error file's message, which already reads so)."""
        return f"{self.kind}: {self.message}" if self.kind and not self.message.startswith(self.kind) \
            else self.message


def parse_rank_error(e: Mapping[str, Any]) -> RankError:
    rank = _int_or_none(e.get("rank"))
    return RankError(e.get("local_rank"), str(e.get("message") or ""), str(e.get("traceback") or ""),
                     e.get("timestamp", e.get("time")), e.get("file"),
                     rank if rank is not None and rank >= 0 else None, str(e.get("type") or ""),
                     _int_or_none(e.get("step")), _int_or_none(e.get("exit_code")))


@dataclass(frozen=True)
class StepWindow:
    """A rank's steps since its last `step` record (node_agent/rankwrap.py): how many, the wall
    seconds they took, the step time's p50/p95, and DDP's per-iteration medians (None: no DDP
    model, or no sample): the time it waited in the gradient all-reduce after its own backward
    pass, the time from its previous step to its forward pass, its forward + backward compute."""

    steps: int
    seconds: float
    p50_ms: float
    p95_ms: float
    wait_ms: float | None = None
    data_ms: float | None = None
    compute_ms: float | None = None
    samples: int = 0  # DDP iterations sampled

    @property
    def rate(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class RankPhase:
    """A rank's milestone, as its wrapper recorded it: started, init, joined, step, or error."""

    local_rank: int | None
    rank: int | None
    phase: str
    time: float | None
    error: RankError | None  # with phase "error"
    step: int | None = None  # with phase "step" (and "error"): its optimizer steps so far
    window: StepWindow | None = None  # with phase "step": the steps since the record before
    total: int | None = None  # with phase "step": the steps the job will take, when stated


def _float_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def parse_window(w: Any) -> StepWindow | None:
    if not isinstance(w, Mapping):
        return None
    steps, seconds = _int_or_none(w.get("steps")), _float_or_none(w.get("seconds"))
    p50, p95 = _float_or_none(w.get("p50_ms")), _float_or_none(w.get("p95_ms"))
    if not steps or seconds is None or p50 is None or p95 is None:
        return None
    raw = w.get("ddp")
    ddp: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    return StepWindow(steps, seconds, p50, p95, _float_or_none(ddp.get("wait_ms")),
                      _float_or_none(ddp.get("data_ms")), _float_or_none(ddp.get("compute_ms")),
                      _int_or_none(ddp.get("n")) or 0)


# A rank's own end: its exception ("error", the rank wrapper's), or the signal that ended it ("ended",
# torchrun's or the node supervisor's, when it left no error: the OOM killer's SIGKILL, a SIGSEGV).
RANK_ENDS = ("error", "ended")


def parse_rank_phase(fields: Mapping[str, Any]) -> RankPhase:
    rank = _int_or_none(fields.get("rank"))
    phase = str(fields.get("phase") or "")
    return RankPhase(_int_or_none(fields.get("local_rank")), rank if rank is not None and rank >= 0 else None,
                     phase, fields.get("time"), parse_rank_error(fields) if phase in RANK_ENDS else None,
                     _int_or_none(fields.get("step")), parse_window(fields.get("window")),
                     _int_or_none(fields.get("total")))


@dataclass(frozen=True)
class NcclChoice:
    """What NCCL chose on one host, parsed from its NCCL_DEBUG=INFO log (--nccl-debug)."""

    files: tuple[str, ...]
    networks: tuple[str, ...]
    interfaces: tuple[str, ...]
    bootstrap: tuple[str, ...]
    transports: tuple[str, ...]


@dataclass(frozen=True)
class SuperviseResult:
    """One host's supervised torchrun, as its supervisor reports it when it ends."""

    exit_code: int | None
    stop_reason: str | None
    first_error: RankError | None
    nccl: NcclChoice | None
    error: str | None  # the agent itself failed
    log: str | None
    rank_errors: tuple[RankError, ...] = ()  # every rank error on the host, earliest first
    steps: int | None = None  # the most optimizer steps a rank of the host took (None: unknown)
    checkpointed: bool = False  # a file in [restart] checkpoint_dir is newer than at the start


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value or ())


def parse_supervise(r: Mapping[str, Any]) -> SuperviseResult:
    fe = r.get("first_error")
    first = parse_rank_error(fe) if isinstance(fe, Mapping) else None
    errors = tuple(parse_rank_error(e) for e in r.get("rank_errors") or () if isinstance(e, Mapping))
    n = r.get("nccl")
    nccl = None if not isinstance(n, Mapping) else NcclChoice(
        _strs(n.get("files")), _strs(n.get("networks")), _strs(n.get("interfaces")),
        _strs(n.get("bootstrap")), _strs(n.get("transports")))
    err = r.get("error")
    error = str(err.get("message")) if isinstance(err, Mapping) else (str(err) if err else None)
    c = r.get("checkpoint")
    checkpointed = isinstance(c, Mapping) and isinstance(c.get("after"), (int, float)) and \
        (not isinstance(c.get("before"), (int, float)) or c["after"] > c["before"])
    return SuperviseResult(_int_or_none(r.get("exit_code")), r.get("stop_reason"), first, nccl, error,
                           r.get("log"), errors, _int_or_none(r.get("steps")), checkpointed)


@dataclass(frozen=True)
class DetachedStart:
    """A detached supervisor's answer: it runs on as a daemon."""

    host: str
    pid: int | None  # None: the daemon wrote no state in time
    state_dir: str | None
    log: str | None


def parse_detached(host: str, r: Mapping[str, Any]) -> DetachedStart:
    return DetachedStart(host, _int_or_none(r.get("pid")), r.get("state_dir"), r.get("log"))


# -- ps / down / logs (LogLine and decode_log_event: at the end) ---------------------------------

@dataclass(frozen=True)
class RunningJob:
    """One node of a ddpctl job that runs on a host (`ps`)."""

    host: str
    job_id: str
    job_name: str | None
    node_rank: int | None
    pid: int | None
    pids: tuple[int, ...]
    uptime_s: float
    detached: bool
    log: str | None
    gpu_memory_mib: int | None

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "job_id": self.job_id, "job_name": self.job_name, "node_rank": self.node_rank,
                "pid": self.pid, "pids": list(self.pids), "uptime_s": self.uptime_s, "detached": self.detached,
                "log": self.log, "gpu_memory_mib": self.gpu_memory_mib}


def parse_ps(host: str, r: Mapping[str, Any]) -> list[RunningJob]:
    return [RunningJob(host, str(j["job_id"]), j.get("job_name"), _int_or_none(j.get("node_rank")),
                       _int_or_none(j.get("pid")), tuple(int(p) for p in j.get("pids") or ()),
                       float(j.get("uptime_s") or 0.0), bool(j.get("detached")), j.get("log"),
                       _int_or_none(j.get("gpu_memory_mib")))
            for j in r.get("jobs") or ()]


@dataclass(frozen=True)
class StoppedJob:
    """What `down` ended of one job on one host."""

    job_id: str
    terminated: tuple[int, ...]
    killed: tuple[int, ...]  # needed SIGKILL after the grace period
    commands: Mapping[int, str]
    left: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "terminated": list(self.terminated), "killed": list(self.killed),
                "commands": {str(k): v for k, v in self.commands.items()}, "left": list(self.left)}


def parse_down(r: Mapping[str, Any]) -> list[StoppedJob]:
    return [StoppedJob(str(s["job_id"]), tuple(int(p) for p in s.get("terminated") or ()),
                       tuple(int(p) for p in s.get("killed") or ()),
                       {int(k): str(v) for k, v in (s.get("commands") or {}).items()},
                       tuple(int(p) for p in s.get("left") or ()))
            for s in r.get("stopped") or ()]


@dataclass(frozen=True)
class LogsFound:
    """The `logs` op's closing answer: whether the host had the job's log at all."""

    found: bool
    job_id: str | None
    node_rank: int | None
    running: bool


def parse_logs(r: Mapping[str, Any]) -> LogsFound:
    return LogsFound(bool(r.get("found")), r.get("job_id"), _int_or_none(r.get("node_rank")), bool(r.get("running")))


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line of a job's output as `logs` shows it."""

    time: float  # when the host's node supervisor had written it (that host's clock)
    host: str
    rank: str | None  # the global rank ("local<N>" where unknown); None: torchrun's own line
    text: str

    @property
    def label(self) -> str:
        """`node0:3`, or `node0` for torchrun's own lines: as `ddpctl up` labels them."""
        return self.host if self.rank is None else f"{self.host}:{self.rank}"


def _expand(runs: Any, what: str) -> list[Any]:
    """[[2, a], [1, b]] -> [a, a, b]."""
    if not isinstance(runs, list):
        raise ValueError(f"{what} is not a list")
    out: list[Any] = []
    for count, value in runs:
        out += [value] * int(count)
    return out


def decode_log_event(host: str, fields: Mapping[str, Any]) -> list[LogLine]:
    """The lines of one `log` event of the node agent's logs op: its lines' text joined by newlines,
    their times and rank labels run-length encoded ([[count, value], ...])."""
    try:
        texts = str(fields["text"]).split("\n")
        times = _expand(fields["times"], "times")
        ranks = _expand(fields["labels"], "labels")
        if not len(texts) == len(times) == len(ranks):
            raise ValueError(f"{len(texts)} lines, {len(times)} times, {len(ranks)} labels")
        return [LogLine(float(t), host, None if r is None else str(r), text)
                for t, r, text in zip(times, ranks, texts, strict=True)]
    except (KeyError, TypeError, ValueError) as exc:
        raise HostError(host, HostErrorKind.PROTOCOL, f"the node agent sent a malformed log event: {exc}",
                        "this is a ddpctl bug") from None


# -- top -----------------------------------------------------------------------------------------

def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class GpuStat:
    """One GPU as nvidia-smi's query showed it (None: the GPU does not report that field). A GPU
    the driver cannot reach (lost after an Xid 79) has only its bus id and its error."""

    index: int | None
    uuid: str | None
    name: str | None
    util_pct: float | None
    memory_used_mib: float | None
    memory_total_mib: float | None
    power_w: float | None
    error: str | None = None
    bus_id: str | None = None

    @property
    def label(self) -> str:
        return f"GPU {self.index}" if self.index is not None else f"GPU {self.bus_id or '?'}"


def selected_gpus(gpus: Sequence[GpuStat], select: Sequence[str] | None) -> list[GpuStat]:
    """The GPUs a node's CUDA_VISIBLE_DEVICES names (indices, or UUIDs and their prefixes), and
    every GPU the driver cannot reach (its index is unknown: it may be one of them)."""
    if select is None:
        return list(gpus)
    picked = []
    for g in gpus:
        by_index = g.index is not None and str(g.index) in select
        by_uuid = g.uuid is not None and any(s.startswith(("GPU-", "MIG-")) and g.uuid.startswith(s) for s in select)
        if by_index or by_uuid or g.index is None:
            picked.append(g)
    return picked


def parse_gpu_stat(g: Mapping[str, Any]) -> GpuStat:
    return GpuStat(_int_or_none(g.get("index")), _text_or_none(g.get("uuid")), _text_or_none(g.get("name")),
                   _float_or_none(g.get("util_pct")), _float_or_none(g.get("memory_used_mib")),
                   _float_or_none(g.get("memory_total_mib")), _float_or_none(g.get("power_w")),
                   _text_or_none(g.get("error")), _text_or_none(g.get("bus_id")))


@dataclass(frozen=True)
class RankSteps:
    """A rank's step record as the host read it: steps/s over its last window (0: the record is
    stale, the rank stalled), its step time's p50/p95, how old the record is (the host's clock)."""

    rank: int | None
    local_rank: int | None
    step: int | None
    total: int | None
    age_s: float | None
    steps_per_s: float | None
    p50_ms: float | None
    p95_ms: float | None
    stalled: bool


def parse_rank_steps(r: Mapping[str, Any]) -> RankSteps:
    rank = _int_or_none(r.get("rank"))
    return RankSteps(rank if rank is not None and rank >= 0 else None, _int_or_none(r.get("local_rank")),
                     _int_or_none(r.get("step")), _int_or_none(r.get("total")), _float_or_none(r.get("age_s")),
                     _float_or_none(r.get("steps_per_s")), _float_or_none(r.get("p50_ms")),
                     _float_or_none(r.get("p95_ms")), bool(r.get("stalled")))


@dataclass(frozen=True)
class TopNode:
    """One node of a job on a host, sampled by the top op over its interval."""

    job_id: str
    job_name: str | None
    node_rank: int | None
    running: bool
    status: str  # "running", or how the node's state ended ("exited", ...)
    exit_code: int | None
    ranks_alive: int
    ranks_expected: int | None  # torchrun's --nproc-per-node
    ranks: tuple[RankSteps, ...]
    log_age_s: float | None  # since the node's output.log last grew
    iface: str | None  # the interface(s) its collectives use, comma-separated
    iface_source: str | None  # why that one: NCCL_SOCKET_IFNAME=..., GLOO_SOCKET_IFNAME=..., route to ...
    tx_bytes_per_s: float | None
    rx_bytes_per_s: float | None
    cpu_pct: float | None  # of one core, over the job's processes
    rss_bytes: int | None
    processes: int
    gpu_select: tuple[str, ...] | None  # its CUDA_VISIBLE_DEVICES (indices or UUIDs); None: every GPU


def parse_top_node(n: Mapping[str, Any]) -> TopNode:
    select = n.get("gpu_select")
    return TopNode(str(n["job_id"]), _text_or_none(n.get("job_name")), _int_or_none(n.get("node_rank")),
                   bool(n.get("running")), str(n.get("status") or ""), _int_or_none(n.get("exit_code")),
                   int(n.get("ranks_alive") or 0), _int_or_none(n.get("ranks_expected")),
                   tuple(parse_rank_steps(r) for r in n.get("ranks") or () if isinstance(r, Mapping)),
                   _float_or_none(n.get("log_age_s")), _text_or_none(n.get("iface")),
                   _text_or_none(n.get("iface_source")), _float_or_none(n.get("tx_bytes_per_s")),
                   _float_or_none(n.get("rx_bytes_per_s")), _float_or_none(n.get("cpu_pct")),
                   _int_or_none(n.get("rss_bytes")), int(n.get("processes") or 0),
                   None if select is None else _strs(select))


@dataclass(frozen=True)
class HostTop:
    """The top op's answer for one host: its GPUs once, and each node of a job it runs."""

    host: str
    hostname: str
    interval_s: float
    gpus: tuple[GpuStat, ...]
    gpu_error: str | None  # nvidia-smi failed for the whole host (NVML could not start, ...)
    nvidia_smi: bool  # nvidia-smi is installed there
    proc_source: str | None  # "psutil" or "/proc" (None: no process was sampled)
    nodes: tuple[TopNode, ...]


def parse_top(host: str, r: Mapping[str, Any]) -> HostTop:
    try:
        return HostTop(host, str(r.get("hostname") or host), float(r.get("interval_s") or 0.0),
                       tuple(parse_gpu_stat(g) for g in r.get("gpus") or () if isinstance(g, Mapping)),
                       _text_or_none(r.get("gpu_error")), bool(r.get("nvidia_smi")),
                       _text_or_none(r.get("proc_source")),
                       tuple(parse_top_node(n) for n in r.get("nodes") or () if isinstance(n, Mapping)))
    except (KeyError, TypeError, ValueError) as exc:
        raise HostError(host, HostErrorKind.PROTOCOL, f"the node agent sent a malformed top reply: {exc!r}",
                        "this is a ddpctl bug") from None


@dataclass(frozen=True)
class HostSample:
    """A node supervisor's `sample` event: its job's processes' CPU (% of one core) and memory, and
    the job's GPUs as nvidia-smi showed them (none on a CPU host; `gpu_error`: nvidia-smi failed)."""

    cpu_percent: float | None
    rss_bytes: int | None
    gpus: tuple[GpuStat, ...] = ()
    gpu_error: str | None = None
    gpu_select: tuple[str, ...] | None = None  # the job's CUDA_VISIBLE_DEVICES; None: every GPU

    @property
    def job_gpus(self) -> list[GpuStat]:
        return selected_gpus(self.gpus, self.gpu_select)


def parse_sample(fields: Mapping[str, Any]) -> HostSample:
    raw = fields.get("gpus")
    gpus = tuple(parse_gpu_stat(g) for g in raw if isinstance(g, Mapping)) if isinstance(raw, list) else ()
    select = fields.get("gpu_select")
    return HostSample(_float_or_none(fields.get("cpu_percent")), _int_or_none(fields.get("rss_bytes")), gpus,
                      _text_or_none(fields.get("gpu_error")), None if select is None else _strs(select))
