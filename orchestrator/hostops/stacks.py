"""Where is every rank stuck: collect every rank's stack (the rank wrapper's own, or py-spy's) and
flight records from every host, collapse identical stacks, and name the collective the job waits in
and the ranks that never entered it (orchestrator/hostops/collectives.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inventory import Host, Inventory
from orchestrator.hostops.collectives import CollectiveVerdict, RankRecords, parse_entries, verdict
from orchestrator.hostops.jobs import JobAbsent
from orchestrator.remote.agent import call_agent
from orchestrator.remote.pool import FanOut, HostPool

LIBRARY_MARKERS = ("site-packages", "dist-packages", "/lib/python", "<frozen")
# ddpctl's rank wrapper and the runpy frames it runs the script through: the same on every rank
# but at a per-host path, so they are left out of the stacks (and of their grouping).
WRAPPER_FRAMES = ("rankwrap.py", "runpy.py", "<frozen runpy>")


@dataclass(frozen=True)
class Frame:
    name: str
    file: str
    short_file: str
    line: int

    @property
    def is_library(self) -> bool:
        return any(m in self.file for m in LIBRARY_MARKERS)

    def where(self) -> str:
        return f"{self.short_file}:{self.line}"


@dataclass(frozen=True)
class RankStack:
    host: str
    rank: int
    local_rank: int
    pid: int
    frames: tuple[Frame, ...]  # the main thread, innermost first
    error: str | None = None

    def signature(self) -> tuple[tuple[str, str, int], ...]:
        return tuple((f.name, f.file, f.line) for f in self.frames)


@dataclass
class StackGroup:
    ranks: list[RankStack]
    frames: tuple[Frame, ...]
    error: str | None = None

    def summary(self) -> str:
        if self.error:
            return f"no stack: {self.error}"
        if not self.frames:
            return "no Python frames"
        inner = self.frames[0]
        user = next((f for f in self.frames if not f.is_library), inner)
        return f"{inner.name} in {user.where()}" if user is not inner else f"{inner.name} in {inner.where()}"

    def label(self) -> str:
        hosts = sorted({r.host for r in self.ranks})
        text = ("rank " if len(self.ranks) == 1 else "ranks ") + format_ranges(r.rank for r in self.ranks)
        if len(hosts) == 1:
            text += f" on {hosts[0]}"
        return text


@dataclass
class StacksReport:
    job: str
    groups: list[StackGroup] = field(default_factory=list)
    host_errors: dict[str, str] = field(default_factory=dict)  # host -> why it gave no stacks
    host_fixes: dict[str, str] = field(default_factory=dict)  # host -> what to do about its error
    answered: tuple[str, ...] = ()  # the hosts whose agent answered (a failed one is in host_errors)
    verdict: CollectiveVerdict | None = None  # the collective it waits in, from the flight records
    records: list[RankRecords] = field(default_factory=list)
    absent: JobAbsent | None = None  # no host that answered runs a rank of the job (stacks_absent)


def format_ranges(numbers: Iterable[int]) -> str:
    """[0,1,2,3,5,7,8] -> '0–3, 5, 7–8'."""
    nums = sorted(set(numbers))
    parts: list[str] = []
    start = prev = None
    for n in [*nums, None]:
        if start is None:
            start = prev = n
        elif n is not None and prev is not None and n == prev + 1:
            prev = n
        else:
            parts.append(str(start) if start == prev else f"{start}–{prev}")
            start = prev = n
    return ", ".join(parts)


def main_thread(threads: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    for t in threads:
        if t.get("name") == "MainThread":
            return list(t.get("frames") or [])
    return list(threads[0].get("frames") or []) if threads else []


def parse_host(host: str, result: Mapping[str, Any]) -> list[RankStack]:
    stacks = []
    for w in result.get("ranks", []):
        frames = tuple(Frame(str(f.get("name")), str(f.get("file")), str(f.get("short_file") or f.get("file")),
                             int(f.get("line") or 0)) for f in main_thread(w.get("threads") or [])
                       if not str(f.get("file")).endswith(WRAPPER_FRAMES))
        error = w.get("error") or (None if "threads" in w else result.get("error"))
        stacks.append(RankStack(host, int(w["rank"]), int(w.get("local_rank", -1)), int(w["pid"]),
                                frames, error))
    return stacks


def innermost_user_frame(frames: Sequence[Frame]) -> str | None:
    user = next((f for f in frames if not f.is_library), None)
    return f"`{user.name}` at {user.where()}" if user is not None else None


def parse_records(host: str, result: Mapping[str, Any], stacks: Sequence[RankStack]) -> list[RankRecords]:
    """Each rank's flight records (or why it has none) and where its main thread is."""
    frames = {s.rank: s.frames for s in stacks}
    records = []
    for w in result.get("ranks", []):
        rank = int(w["rank"])
        fr = w.get("fr") if isinstance(w.get("fr"), Mapping) else None
        why = w.get("error") or w.get("fr_error") or (fr.get("error") if fr is not None else None)
        entries = fr.get("entries") if fr is not None else None
        collectives = parse_entries(entries) if isinstance(entries, list) else None
        step = fr.get("step") if fr is not None and isinstance(fr.get("step"), int) else None
        raw = fr.get("groups") if fr is not None else None
        groups = {str(name): tuple(int(r) for r in members) for name, members in raw.items()
                  if isinstance(members, list)} if isinstance(raw, Mapping) else {}
        records.append(RankRecords(host, rank, collectives, innermost_user_frame(frames.get(rank, ())),
                                   None if collectives is not None else str(why or "no flight records"), step,
                                   groups))
    return records


def collapse(stacks: Iterable[RankStack]) -> list[StackGroup]:
    """Identical main-thread stacks form one group; the smallest groups (odd ones out) first."""
    groups: dict[tuple[Any, ...], StackGroup] = {}
    for s in sorted(stacks, key=lambda s: s.rank):
        key = ("error", s.error) if s.error else s.signature()
        group = groups.setdefault(key, StackGroup([], s.frames, s.error))
        group.ranks.append(s)
    return sorted(groups.values(), key=lambda g: (len(g.ranks), g.ranks[0].rank))


def collect(pool: HostPool, hosts: Sequence[Host], job: str) -> StacksReport:
    fan: FanOut[Mapping[str, Any]] = pool.map(
        hosts, lambda t: call_agent(t, "stacks", {"job": job, "python": t.host.python}, timeout=90).result)
    return assemble(job, fan.succeeded, {host: err.message for host, err in fan.failed.items()},
                    {host: err.fix for host, err in fan.failed.items() if err.fix})


def assemble(job: str, results: Mapping[str, Mapping[str, Any]], failed: Mapping[str, str],
             fixes: Mapping[str, str] | None = None) -> StacksReport:
    """The stacks op's result per host (however it was run there) as one collapsed report;
    `failed`: the hosts that gave no result, and why (`fixes`: what to do about it)."""
    report = StacksReport(job, answered=tuple(results))
    all_stacks: list[RankStack] = []
    for host, result in results.items():
        if result.get("error") and (not result.get("ranks") or result.get("py_spy") is None):
            report.host_errors[host] = str(result["error"])
            if result.get("fix"):
                report.host_fixes[host] = str(result["fix"])
        stacks = parse_host(host, result)
        all_stacks += stacks
        report.records += parse_records(host, result, stacks)
    report.host_errors.update(failed)
    report.host_fixes.update(fixes or {})
    report.groups = collapse(all_stacks)
    report.verdict = verdict(report.records)
    return report


def stacks_absent(report: StacksReport, inventory: Inventory) -> JobAbsent | None:
    """No host that answered runs a rank of the job (the ones that failed report themselves)."""
    if report.groups or not report.answered:
        return None
    answered = tuple(h.name for h in inventory.hosts if h.name in report.answered)
    return JobAbsent(report.job, "a rank of it running", answered, len(inventory.hosts), inventory.source)


def report_json(report: StacksReport) -> dict[str, Any]:
    return {
        "job": report.job,
        "groups": [{"label": g.label(), "summary": g.summary(),
                    "ranks": [{"host": r.host, "rank": r.rank, "local_rank": r.local_rank, "pid": r.pid}
                              for r in g.ranks],
                    "error": g.error,
                    "frames": [{"name": f.name, "file": f.file, "line": f.line} for f in g.frames]}
                   for g in report.groups],
        "host_errors": {host: host_error_text(report, host) for host in report.host_errors},
        "verdict": report.verdict.to_json() if report.verdict is not None else None,
    }


def verdict_text(report: StacksReport) -> list[str]:
    """The flight records' verdict, first: the collective and the ranks that never entered it."""
    return [f"collectives: {report.verdict.text}"] if report.verdict is not None else []


def groups_text(report: StacksReport, frames: int = 8) -> list[str]:
    """The stack groups, each with its innermost `frames` frames."""
    lines = []
    for g in report.groups:
        lines.append(f"{g.label()}: {g.summary()}")
        for f in g.frames[:frames]:
            lines.append(f"    {f.name} ({f.where()})")
    return lines


def host_error_text(report: StacksReport, host: str) -> str:
    fix = report.host_fixes.get(host)
    return f"{report.host_errors[host]} (fix: {fix})" if fix else report.host_errors[host]


def report_text(report: StacksReport, frames: int = 8) -> list[str]:
    """The whole report as lines of text (the groups, then each host's error)."""
    lines = [] if report.groups else [f"no running rank of {report.job} found"]
    lines += verdict_text(report)
    lines += groups_text(report, frames)
    lines += [f"{host}: {host_error_text(report, host)}" for host in report.host_errors]
    return lines
