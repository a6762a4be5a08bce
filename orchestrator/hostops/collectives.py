"""The hang verdict: which collective, which rank. Every rank's flight recorder (torch's ring of its
last collectives, dumped by the rank wrapper's side thread on request) numbers the collectives of
each process group in order; a rank that never entered the one the others wait in is the one that
holds them, and its stack says where it is instead."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_GROUPS = ("0", "default_pg", "")


@dataclass(frozen=True)
class Collective:
    """One flight-recorder entry: the group's seq-th collective, as this rank entered it."""

    group: str
    seq: int
    op: str  # "all_reduce" (the backend's prefix dropped)
    done: bool  # retired: it returned on this rank
    sizes: str = ""


@dataclass(frozen=True)
class RankRecords:
    """One rank's dump: its collectives (None: it gave none) and where its main thread is."""

    host: str
    rank: int
    collectives: tuple[Collective, ...] | None
    where: str | None = None  # "load_batch at train.py:88"
    why: str | None = None  # why there are no collectives (did not answer, stopped, recorder off)
    step: int | None = None
    groups: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # group name -> its global ranks


@dataclass(frozen=True)
class CollectiveVerdict:
    text: str
    group: str | None = None
    seq: int | None = None
    op: str | None = None
    entered: tuple[int, ...] = ()
    missing: tuple[int, ...] = ()  # ranks that never entered it (or could not say)

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "group": self.group, "seq": self.seq, "op": self.op,
                "entered": list(self.entered), "missing": list(self.missing)}


def parse_entries(entries: Iterable[Mapping[str, Any]]) -> tuple[Collective, ...]:
    """The rank wrapper's trimmed flight-recorder entries; point-to-point ones are left out."""
    out = []
    for e in entries:
        if e.get("is_p2p") or not isinstance(e.get("collective_seq_id"), int) or not e["collective_seq_id"]:
            continue
        pg = e.get("process_group")
        group = str(pg[0] if isinstance(pg, list) and pg else e.get("pg_id", "0"))
        op = str(e.get("profiling_name") or "collective").split(":")[-1]
        out.append(Collective(group, int(e["collective_seq_id"]), op, bool(e.get("retired")),
                              str(e.get("input_sizes") or "")))
    return tuple(out)


def group_name(group: str) -> str:
    return "the default group" if group in DEFAULT_GROUPS else f"process group {group}"


def ranks_text(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in sorted(ranks))


def verdict(ranks: Sequence[RankRecords]) -> CollectiveVerdict | None:
    """The collective the job is stuck in and the ranks that never entered it; None when no rank
    gave a dump (no flight recorder: the stacks alone have to tell)."""
    answered = [r for r in ranks if r.collectives is not None]
    silent = [r for r in ranks if r.collectives is None]
    if not answered:
        return None
    groups = sorted({c.group for r in answered for c in r.collectives or ()},
                    key=lambda g: (g not in DEFAULT_GROUPS, g))
    for group in groups:
        found = _stuck_in(group, answered, silent, default=group in DEFAULT_GROUPS)
        if found is not None:
            return found
    if silent:
        return CollectiveVerdict(_silent_text(silent), missing=tuple(r.rank for r in silent))
    return None


def _last(records: RankRecords, group: str) -> Collective | None:
    mine = [c for c in records.collectives or () if c.group == group]
    return max(mine, key=lambda c: c.seq) if mine else None


def _members(group: str, ranks: list[RankRecords]) -> set[int] | None:
    """The group's ranks as the ranks themselves told (None: none said; then its entries tell)."""
    told = [set(r.groups[group]) for r in ranks if group in r.groups]
    return set().union(*told) if told else None


def _stuck_in(group: str, answered: list[RankRecords], silent: list[RankRecords],
              default: bool) -> CollectiveVerdict | None:
    told = None if default else _members(group, answered)
    if told is not None:
        members = [r for r in answered if r.rank in told]
        silent = [r for r in silent if r.rank in told]
    else:
        members = answered if default else [r for r in answered if _last(r, group) is not None]
    last = {r.rank: _last(r, group) for r in members}
    top = max((c.seq for c in last.values() if c is not None), default=0)
    ahead = {rank: c for rank, c in last.items() if c is not None and c.seq == top}
    if not ahead or (all(c.done for c in ahead.values()) and len(ahead) == len(members)):
        return None  # every member that answered returned from its last one (a silent rank entered it too)
    ops = sorted({c.op for c in ahead.values()})
    behind = [r for r in members if r.rank not in ahead]
    in_flight = [rank for rank, c in ahead.items() if not c.done]
    if not behind and not silent:
        if len(ops) > 1:
            parts = "; ".join(f"{ranks_text([k for k, c in ahead.items() if c.op == op])} in {op}" for op in ops)
            return CollectiveVerdict(f"collective #{top} on {group_name(group)} differs between the ranks: "
                                     f"{parts} (they call collectives in a different order)", group, top,
                                     None, tuple(sorted(ahead)))
        if not in_flight:
            return None
        return CollectiveVerdict(f"{ops[0]} #{top} on {group_name(group)}: every rank entered it and none "
                                 "returned (the network or the collective library, not a missing rank)",
                                 group, top, ops[0], tuple(sorted(ahead)))
    op = ops[0] if len(ops) == 1 else "/".join(ops)
    missing = [*behind, *silent]
    text = (f"{op} #{top} on {group_name(group)}: {ranks_text(sorted(ahead))} entered, "
            f"{ranks_text([r.rank for r in missing])} never did")
    hosts = sorted({r.host for r in missing})
    text += f" ({', '.join(hosts)})"
    details = []
    for r in behind:
        mine = last[r.rank]
        before = f"; its last was {mine.op} #{mine.seq}" if mine is not None and mine.seq < top - 1 else ""
        where = f" is in {r.where}" if r.where else " gave no stack"
        details.append(f"rank {r.rank}{where}{before}")
    details += [f"rank {r.rank} did not answer: {r.why}" for r in silent]
    if details:
        text += " — " + "; ".join(details)
    return CollectiveVerdict(text, group, top, op, tuple(sorted(ahead)), tuple(r.rank for r in missing))


def _silent_text(silent: list[RankRecords]) -> str:
    return "; ".join(f"rank {r.rank} on {r.host} did not answer: {r.why}" for r in silent)
