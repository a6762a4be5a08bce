"""The node agent's replies, decoded from their one definition (node_agent/wire/replies.py).

`decode` reads any reply dataclass from its JSON by the class's own annotations (nested dataclasses,
Optional and Union, tuples, lists, dicts, enums): no key is copied by hand here. A reply that does
not fit its class is the host's HostError; the facts op's answer is read sub-fact by sub-fact
(`parse_facts`: one that does not fit is that sub-fact's error). Around them, the views only the
control plane has: a host's facts with its timing, a log event's lines, the supervise result.
Nothing above the remote layer indexes an agent reply by string keys.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, Union

from node_agent.wire.replies import one_line
from node_agent.wire.replies_facts import (
    CheckpointSeen,
    Facts,
    FactsReply,
    FirewallFact,
    InterfaceAddress,
    InterfaceFact,
    IptablesFact,
    MasterRoute,
    MemlockFact,
    MetricsDirFact,
    MetricsReader,
    NetFacts,
    NftFact,
    NvidiaSmiFact,
    PythonFact,
    ResolutionFact,
    ResolvedAddress,
    ScriptFact,
    SmiApp,
    SmiGpu,
    TableRoute,
    TorchFact,
    UfwFact,
    WorkdirFact,
)
from node_agent.wire.replies_gpu import GpuHealth, GpuHealthReport, XidEvent
from node_agent.wire.replies_jobs import LogEvent, LogsFound, RunningJob, RunningJobs, StoppedJob, StoppedJobs
from node_agent.wire.replies_ports import (
    CheckpointFact,
    KilledProcess,
    MasterPortFact,
    ModuleLookupFact,
    PortOwner,
    PortReport,
    RefusedProcess,
    UnseenSocket,
)
from node_agent.wire.replies_run import (
    RANK_ENDS,
    CheckpointWritten,
    DetachedStart,
    Failed,
    NcclChoice,
    RankError,
    RankPhase,
    StepWindow,
    SuperviseResult,
)
from node_agent.wire.replies_top import GpuStat, HostSample, HostTop, RankSteps, TopNode, selected_gpus
from orchestrator.errors import HostError, HostErrorKind

__all__ = [
    "RANK_ENDS", "CheckpointFact", "CheckpointSeen", "CheckpointWritten", "DetachedStart", "Facts", "FirewallFact",
    "GpuHealth",
    "GpuHealthReport", "GpuStat", "HostFacts", "HostSample", "HostTop", "InterfaceAddress", "InterfaceFact",
    "IptablesFact", "KilledProcess", "LogLine", "LogsFound", "MasterPortFact", "MasterRoute", "MemlockFact",
    "MetricsDirFact", "MetricsReader",
    "ModuleLookupFact", "NcclChoice", "NetFacts", "NftFact", "NvidiaSmiFact", "PortOwner", "PortReport",
    "PythonFact", "RankError", "RankPhase", "RankSteps", "RefusedProcess", "ResolutionFact", "ResolvedAddress",
    "RunningJob", "ScriptFact", "SmiApp", "SmiGpu", "StepWindow", "StoppedJob", "SuperviseResult", "TableRoute",
    "TopNode", "TorchFact", "UfwFact", "UnseenSocket", "WorkdirFact", "XidEvent", "decode", "one_line",
    "parse_facts", "parse_net", "parse_settled", "selected_gpus",
]

T = TypeVar("T")

# node_agent names its annotations' typing helpers for the checker only: they are resolved here.
_TYPING = {name: getattr(typing, name) for name in ("Any", "Dict", "List", "Optional", "Sequence", "Tuple", "Union")}


class Malformed(ValueError):
    """A value that does not fit its field's type; the message names the field's path."""


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, globalns={**_TYPING, **vars(sys.modules[cls.__module__])})


def _object(cls: type[T], data: Any, path: str, fill: Mapping[str, Any]) -> T:
    if not isinstance(data, Mapping):
        raise Malformed(f"{path} is {type(data).__name__}, not an object")
    hints, values = _hints(cls), dict(fill)  # type: ignore[arg-type]
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in values:
            continue
        if f.name in data:
            values[f.name] = _value(hints[f.name], data[f.name], f"{path}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise Malformed(f"{path}.{f.name} is missing")
    return cls(**values)


def _items(tp: Any, value: Any, path: str) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise Malformed(f"{path} is {type(value).__name__}, not a list")
    args = typing.get_args(tp)
    if typing.get_origin(tp) is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        if len(args) != len(value):
            raise Malformed(f"{path} has {len(value)} items, not {len(args)}")
        return [_value(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True))]
    return [_value(args[0] if args else Any, v, f"{path}[{i}]") for i, v in enumerate(value)]


def _dict(tp: Any, value: Any, path: str) -> dict[Any, Any]:
    if not isinstance(value, Mapping):
        raise Malformed(f"{path} is {type(value).__name__}, not an object")
    key_type, value_type = typing.get_args(tp) or (Any, Any)
    return {_value(key_type, int(k) if key_type is int and isinstance(k, str) and k.lstrip("-").isdigit() else k,
                   f"{path} key"): _value(value_type, v, f"{path}[{k!r}]") for k, v in value.items()}


def _scalar(tp: Any, value: Any, path: str) -> Any:
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if tp in (int, str, bool) and type(value) is tp:
        return value
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            pass
    raise Malformed(f"{path} is {value!r}, not {getattr(tp, '__name__', tp)}")


def _value(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin is Union or origin is types.UnionType:
        if value is None and type(None) in typing.get_args(tp):
            return None
        arms = [arm for arm in typing.get_args(tp) if arm is not type(None)]
        if len(arms) == 1:  # Optional[X]: X's own message
            return _value(arms[0], value, path)
        for arm in arms:
            try:
                return _value(arm, value, path)
            except Malformed:
                continue
        raise Malformed(f"{path} is {value!r}, not {tp}")
    if dataclasses.is_dataclass(tp):
        return _object(tp, value, path, {})  # type: ignore[arg-type]
    if origin in (tuple, list, Sequence, typing.Sequence):
        items = _items(tp, value, path)
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping):
        return _dict(tp, value, path)
    return _scalar(tp, value, path)


def decode(cls: type[T], data: Any, host: str = "", what: str = "reply", fill: Mapping[str, Any] | None = None) -> T:
    """`cls` (a node_agent/wire/replies.py dataclass) read from an agent reply's JSON; keys it does not
    declare are ignored, fields in `fill` (the control plane's own: `host`) set. Malformed: the
    host's HostError."""
    try:
        return _object(cls, data, cls.__name__, fill or {})
    except Malformed as exc:
        raise HostError(host, HostErrorKind.PROTOCOL, f"the node agent sent a malformed {what}: {exc}",
                        "this is a ddpctl bug") from None


# -- the ops' entry points ---------------------------------------------------------------------

def parse_report(host: str, r: Mapping[str, Any]) -> PortReport:
    return decode(PortReport, r, host, "port report", {"host": host})


def parse_master_port(d: Mapping[str, Any], host: str = "") -> MasterPortFact:
    return decode(MasterPortFact, d, host, "master_port fact")


def parse_supervise(r: Mapping[str, Any], host: str = "") -> SuperviseResult:
    """The supervise op's result; an agent that crashed answers `Failed` instead."""
    try:
        return decode(SuperviseResult, r, host, "supervise result")
    except HostError:
        failed = decode(Failed, r, host, "supervise result")
        return SuperviseResult(failed.exit_code, error=failed.error.message)


def parse_rank_phase(fields: Mapping[str, Any], host: str = "") -> RankPhase:
    return decode(RankPhase, fields, host, "rank event")


def parse_checkpoint(fields: Mapping[str, Any], host: str = "") -> CheckpointWritten:
    return decode(CheckpointWritten, fields, host, "checkpoint event")


def parse_sample(fields: Mapping[str, Any], host: str = "") -> HostSample:
    return decode(HostSample, fields, host, "sample event")


def parse_detached(host: str, r: Mapping[str, Any]) -> DetachedStart:
    return decode(DetachedStart, r, host, "detached start", {"host": host})


def parse_ps(host: str, r: Mapping[str, Any]) -> list[RunningJob]:
    return [dataclasses.replace(j, host=host) for j in decode(RunningJobs, r, host, "ps reply").jobs]


def parse_down(r: Mapping[str, Any], host: str = "") -> list[StoppedJob]:
    return list(decode(StoppedJobs, r, host, "down reply").stopped)


def parse_logs(r: Mapping[str, Any], host: str = "") -> LogsFound:
    return decode(LogsFound, r, host, "logs reply")


def parse_top(host: str, r: Mapping[str, Any]) -> HostTop:
    return decode(HostTop, r, host, "top reply", {"host": host})


def parse_gpu_health(host: str, r: Mapping[str, Any]) -> GpuHealthReport:
    return decode(GpuHealthReport, r, host, "gpu_health reply", {"host": host})


# -- facts -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HostFacts:
    """The facts op's answer for one host (parse_facts), with the round trip's timing: its typed
    sub-facts (`hf.facts.resolution.routes`; None where it sent none), the error of each one that
    failed (by the sub-fact's name, as `select` names them), and what the launch reads off them."""

    host: str
    facts: Facts
    errors: Mapping[str, str] = dataclasses.field(default_factory=dict)
    sent_at: float = 0.0  # orchestrator wall clock before the call
    received_at: float = 0.0  # ... and after it
    sent: frozenset[str] = frozenset()  # the sub-facts it sent, a None value too (`gpus`: no nvidia-smi)
    # What the host's agent cache did on this call (orchestrator/remote/agent.py): "cached",
    # "written", "not written: <why>"; "" where the call did not say (a request read from a file)
    agent_cache: str = ""

    def ran(self, name: str) -> bool:
        """The host ran sub-fact `name` (its request selected it): it sent a value, or its error."""
        return name in self.sent or name in self.errors

    @property
    def hostname(self) -> str:
        return self.facts.hostname or self.host

    @property
    def resolution(self) -> ResolutionFact:
        """master_addr as this host resolved it, and its routes there (none where it sent none)."""
        return self.facts.resolution or ResolutionFact()

    @property
    def route_source(self) -> str | None:
        """The source address of this host's route to the master (not loopback, not the master's
        own local route): the address its peers reach it at."""
        for route in self.resolution.routes.values():
            if route.src and not route.src.startswith("127.") and route.type != "local":
                return route.src
        return None

    @property
    def cpu_count(self) -> int:
        return self.facts.cpu_count or 1

    @property
    def gpu_count(self) -> int:
        return self.facts.gpu_count or 0

    @property
    def python_found(self) -> bool:
        return self.facts.python is not None and bool(self.facts.python.found)

    @property
    def workdir_exists(self) -> bool:
        return self.facts.workdir is not None and self.facts.workdir.exists


def _each_field(cls: type[T], data: Mapping[str, Any], what: str) -> tuple[T, dict[str, str]]:
    """`cls` read field by field: a field `data` lacks takes its default, and so does one that does
    not fit its type, whose problem is returned under the field's name."""
    hints: dict[str, Any] = _hints(cls)  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    problems: dict[str, str] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            try:
                values[f.name] = _value(hints[f.name], data[f.name], f.name)
            except Malformed as exc:
                problems[f.name] = f"the node agent sent a malformed {f.name} {what}: {exc} (a ddpctl bug)"
    return cls(**values), problems


def parse_facts(host: str, reply: Mapping[str, Any], sent_at: float = 0.0, received_at: float = 0.0) -> HostFacts:
    """The facts op's answer (its `facts` event or its result). Each sub-fact is decoded on its own:
    one that does not fit its declaration (node_agent/wire/replies_facts.py Facts) is None, with the
    problem as its error; the other sub-facts stand."""
    got = decode(FactsReply, reply, host, "facts reply")
    sent = got.facts or {}
    facts, malformed = _each_field(Facts, sent, "fact")
    return HostFacts(host, facts, {**malformed, **(got.errors or {})}, sent_at, received_at, frozenset(sent))


def parse_settled(host: str, result: Mapping[str, Any]) -> CheckpointSeen | None:
    """What a host saw of its peers' checkpoint markers, from the result that ends doctor's session
    (None: it looked for none)."""
    return decode(FactsReply, result, host, "facts result").checkpoint


def parse_net(host: str, net: Any) -> NetFacts:
    """A host's interfaces and routes as its probe's `listening` event carries them (none: empty)."""
    return decode(NetFacts, net, host, "listening event") if net is not None else NetFacts()


# -- logs --------------------------------------------------------------------------------------

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


def decode_log_event(host: str, fields: Mapping[str, Any]) -> list[LogLine]:
    """The lines of one `log` event of the node agent's logs op (node_agent/wire/replies.py LogEvent)."""
    event = decode(LogEvent, fields, host, "log event")
    texts = event.text.split("\n")
    times = [t for count, t in event.times for _ in range(count)]
    ranks = [r for count, r in event.labels for _ in range(count)]
    if not len(texts) == len(times) == len(ranks):
        raise HostError(host, HostErrorKind.PROTOCOL, "the node agent sent a malformed log event: "
                        f"{len(texts)} lines, {len(times)} times, {len(ranks)} labels", "this is a ddpctl bug")
    return [LogLine(t, host, r, text) for t, r, text in zip(times, ranks, texts, strict=True)]
