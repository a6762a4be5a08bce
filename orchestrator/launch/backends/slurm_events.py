"""What Slurm itself did to a job, told in Slurm's words: a requeue (by an admin, a preemption or
ddpctl's own signal), a cancel from outside ddpctl, a failed node, a time limit. Read from
`scontrol show job` (JobState, Reason, Restarts, the times) and from the lines slurmstepd and srun
write into the job's output (`*** JOB 34 ON c1 CANCELLED AT … DUE TO JOB REQUEUE ***`,
`srun: error: Node failure on c2`). None of these is ever a rank's failure: the ranks that die of
them are victims. Pure: the Slurm backend asks, this module judges.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

# slurmstepd's own line when the job (or a step) is signalled by slurmctld (Slurm's req.c)
STAR_LINE = re.compile(r"\*\*\* (?P<what>JOB|STEP) (?P<id>\S+) ON (?P<node>\S+) CANCELLED AT (?P<at>\S+)"
                       r"(?: DUE TO (?P<why>.+?))?(?:, SEE SLURMCTLD LOG FOR DETAILS)? \*\*\*")
NODE_FAILURE_LINE = re.compile(r"srun: error: Node failure on (?P<node>\S+)")
# States in which Slurm, not the job, ended it (JOB_STATE in slurm.h)
SLURM_ENDED = frozenset({"CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "DEADLINE", "BOOT_FAIL"})
NODE_DOWN = re.compile(r"DOWN|FAIL|NOT_RESPONDING|POWER|\*")  # "*": not responding
# slurmstepd's "DUE TO ..." -> the state Slurm gives the job (while scontrol still says COMPLETING)
DUE_TO = {"TIME LIMIT": "TIMEOUT", "PREEMPTION": "PREEMPTED", "NODE FAILURE": "NODE_FAIL"}


class Kind(str, enum.Enum):
    REQUEUED = "requeued"  # the job goes back to the queue: `up` follows its next run
    CANCELLED = "cancelled"  # scancel from outside ddpctl
    NODE_FAIL = "node_fail"  # Slurm marked a node of the job failed
    TIMEOUT = "timeout"  # the job's time limit
    ENDED = "ended"  # another of Slurm's ends: PREEMPTED without requeue, DEADLINE, BOOT_FAIL
    ENDING = "ending"  # Slurm is ending the job (COMPLETING) and has not said why yet: wait for it


@dataclass(frozen=True)
class SlurmEvent:
    """One thing Slurm did to the job, with the words to tell it."""

    kind: Kind
    text: str  # one line: what Slurm did, when, and why where it says
    nodes: tuple[str, ...] = ()  # the Slurm nodes it names (a node failure)
    run: int = 0  # the run (SLURM_RESTART_COUNT) it ended

    @property
    def ends_job(self) -> bool:
        return self.kind not in (Kind.REQUEUED, Kind.ENDING)


@dataclass(frozen=True)
class SlurmSaid:
    """slurmstepd's or srun's line about the job, as it appeared in an output file."""

    text: str
    node: str | None = None
    job: bool = False  # about the whole job (the batch step's line), not one step
    at: str | None = None  # Slurm's timestamp, 2026-11-25T21:46:08
    why: str | None = None  # "JOB REQUEUE", "TIME LIMIT", "PREEMPTION", "NODE FAILURE"
    failed_node: str | None = None  # srun: Node failure on <node>


def slurm_said(line: str) -> SlurmSaid | None:
    """Slurm's own line in a job's output, or None for any other line."""
    m = STAR_LINE.search(line)
    if m is not None:
        return SlurmSaid(f"{m.group('what')} {m.group('id')} ON {m.group('node')} CANCELLED AT {m.group('at')}"
                         + (f" DUE TO {m.group('why')}" if m.group("why") else ""),
                         m.group("node"), m.group("what") == "JOB", m.group("at"), m.group("why"))
    m = NODE_FAILURE_LINE.search(line)
    if m is not None:
        return SlurmSaid(f"Node failure on {m.group('node')}", failed_node=m.group("node"))
    return None


def restarts(show: Mapping[str, str]) -> int:
    value = show.get("Restarts", "0")
    return int(value) if value.isdigit() else 0


def queue_seconds(show: Mapping[str, str]) -> float | None:
    """How long the current run waited in the queue, by Slurm's clock: from its SubmitTime (reset
    when the job is requeued) to its StartTime."""
    try:
        return (datetime.fromisoformat(show["StartTime"]) - datetime.fromisoformat(show["SubmitTime"])).total_seconds()
    except (KeyError, ValueError):
        return None


def _clock(stamp: str | None) -> str:
    """Slurm's 2026-11-25T21:46:08 as 21:46:08 (the day is today's, nearly always)."""
    return stamp.rpartition("T")[2] if stamp and "T" in stamp else (stamp or "?")


def _quote(said: Sequence[SlurmSaid]) -> str:
    star = next((s for s in said if s.node is not None), None)
    return f" (Slurm: {star.text})" if star is not None else ""


def down_nodes(nodes: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """`scontrol show node` per node -> the ones Slurm holds down or failed, with its reason."""
    out = {}
    for name, fields in nodes.items():
        state = fields.get("State", "")
        if NODE_DOWN.search(state):
            reason = fields.get("Reason", "")
            out[name] = f"{state}" + (f": {reason}" if reason and reason != "(null)" else "")
    return out


def slurm_event_of(slurm_id: str, show: Mapping[str, str], run: int, said: Sequence[SlurmSaid],
          down: Mapping[str, str] | None = None, cancelled_by: str | None = None) -> SlurmEvent | None:
    """What Slurm did to run `run` of the job, from `scontrol show job` (`show`), the Slurm lines
    seen in its output (`said`), the job's nodes that Slurm holds down (`down`) and who cancelled
    it where ddpctl knows (`cancelled_by`: `ddpctl down` left its mark); None: Slurm did nothing
    of its own (the job is running, or ended by itself, or by this `up`)."""
    if not show:
        return None
    state = show.get("JobState", "")
    reason = show.get("Reason", "")
    why = next((s.why for s in said if s.why), None)
    if restarts(show) > run:  # requeued: by an admin, a preemption, a node failure or our own signal
        cause = why.lower() if why else "requeue"
        return SlurmEvent(Kind.REQUEUED, f"Slurm requeued job {slurm_id} ({cause}): run {run} ended"
                          + _quote(said) + f"; `up` stays attached and follows run {restarts(show)}",
                          run=run)
    at = _clock(show.get("EndTime"))
    if state == "COMPLETING":  # scontrol hides why until the job has ended: slurmstepd's line says it
        star = next((s for s in said if s.job), None)
        if star is None:
            return SlurmEvent(Kind.ENDING, f"Slurm is ending job {slurm_id}", run=run)
        state, at = DUE_TO.get(star.why or "", "CANCELLED"), _clock(star.at)
    if state not in SLURM_ENDED:
        return None
    if state == "CANCELLED" and cancelled_by:
        return SlurmEvent(Kind.CANCELLED, f"Slurm job {slurm_id} was cancelled at {at} by {cancelled_by}", run=run)
    if state == "CANCELLED":
        owner = show.get("UserId", "?").partition("(")[0]
        return SlurmEvent(Kind.CANCELLED, f"Slurm job {slurm_id} was cancelled at {at}, not by ddpctl (scancel by "
                          f"{owner}, its owner, or an admin: Slurm keeps no name)" + _quote(said), run=run)
    if state == "TIMEOUT":
        limit = show.get("TimeLimit", "?")
        return SlurmEvent(Kind.TIMEOUT, f"Slurm job {slurm_id} hit its time limit at {at}: TIMEOUT after {limit} "
                          "([slurm] time; with requeue = true the ranks checkpoint and the job requeues before it)",
                          run=run)
    if state == "NODE_FAIL":
        failed = sorted({s.failed_node for s in said if s.failed_node} | set(down or {}))
        detail = "; ".join(f"{n}: {(down or {})[n]}" for n in failed if n in (down or {}))
        named = ", ".join(failed) if failed else "a node of the job"
        return SlurmEvent(Kind.NODE_FAIL, f"Slurm marked node {named} NODE_FAIL at {at} and ended job {slurm_id}"
                          + (f" ({detail})" if detail else "") + _quote(said), tuple(failed), run)
    words = f"{state}" + (f" ({reason})" if reason and reason != "None" else "")
    return SlurmEvent(Kind.ENDED, f"Slurm ended job {slurm_id}: {words} at {at}" + _quote(said), run=run)
