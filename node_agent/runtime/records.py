"""What a node tells the control plane about its job, each kind of message built by one function
whatever path it takes: live as the supervisor sees it, again to a session that re-attached while
the supervisor runs, or replayed from the run state on disk once the supervisor has ended
(node_agent/runtime/attach.py). Each is built from its declaration in node_agent/wire/replies_run.py
or replies_top.py, the one the control plane decodes (orchestrator/remote/wire.py): two paths that
built a record's message each their own way drifted apart once (issue 54), and a re-attach after
the job had ended sent what the control plane could not read."""

from __future__ import annotations

import os
from dataclasses import fields

from node_agent.host.runstate import read_json
from node_agent.runtime.uplink import event_line
from node_agent.wire.replies import wire
from node_agent.wire.replies_run import RANK_ENDS, CheckpointWritten, RankError, RankPhase, StepWindow, SuperviseResult

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from pathlib import Path
    from typing import Any, Dict, List, Optional, Tuple

    from node_agent.wire.replies_top import HostSample


# -- the ranks' records (node_agent/rank/rankwrap.py, node_agent/rank/torchrun.py) ----------------

def is_rank_record(name: str) -> bool:
    """`<local rank>.<phase>` in the rank directory: not a dump request, the dumps folder, or a
    record still being written (`.tmp`)."""
    return not name.endswith(".tmp") and name.split(".")[0].isdigit()


def rank_records(rank_dir: Path) -> List[Tuple[str, Dict[str, Any]]]:
    """Every rank record in `rank_dir`, in the order the ranks wrote them (a record being replaced
    just now is left out: it is read again next time)."""
    try:
        names = sorted(n for n in os.listdir(str(rank_dir)) if is_rank_record(n))
    except OSError:
        return []
    found = [(name, read_json(rank_dir / name)) for name in names]
    kept = [(name, record) for name, record in found if record is not None]
    return sorted(kept, key=lambda item: (_float(item[1].get("time")) or 0.0, item[0]))


def rank_message(record: Dict[str, Any]) -> bytes:
    """A rank's record as its `rank` event line, on every path."""
    return event_line("rank", **wire(rank_phase(record)))


def rank_phase(record: Dict[str, Any]) -> RankPhase:
    """A rank's milestone record as the `rank` event it becomes."""
    phase = str(record.get("phase") or "")
    return RankPhase(local_rank=_rank(record.get("local_rank")), rank=_rank(record.get("rank")), phase=phase,
                     time=_float(record.get("time")), error=rank_error(record) if phase in RANK_ENDS else None,
                     step=_int(record.get("step")), window=step_window(record.get("window")),
                     total=_int(record.get("total")))


def rank_error(record: Dict[str, Any], file: Optional[str] = None) -> RankError:
    """A rank's error or end record (rankwrap.py, torchrun.py) as the control plane gets it."""
    local = record.get("local_rank")
    return RankError(local_rank=local if isinstance(local, (int, str)) and not isinstance(local, bool) else None,
                     message=str(record.get("message") or ""), traceback=str(record.get("traceback") or ""),
                     timestamp=_float(record.get("time")), file=file, rank=_rank(record.get("rank")),
                     kind=str(record.get("type") or ""), step=_int(record.get("step")),
                     exit_code=_int(record.get("exit_code")))


def step_window(window: Any) -> Optional[StepWindow]:
    """A step record's window (rankwrap.py _window), None where it says nothing usable."""
    if not isinstance(window, dict):
        return None
    steps, seconds = _int(window.get("steps")), _float(window.get("seconds"))
    p50, p95 = _float(window.get("p50_ms")), _float(window.get("p95_ms"))
    if not steps or seconds is None or p50 is None or p95 is None:
        return None
    ddp = window.get("ddp")
    ddp = ddp if isinstance(ddp, dict) else {}
    return StepWindow(steps, seconds, p50, p95, _float(ddp.get("wait_ms")), _float(ddp.get("data_ms")),
                      _float(ddp.get("compute_ms")), _int(ddp.get("n")) or 0)


# -- the supervisor's own ----------------------------------------------------------------------

def checkpoint_message(mtime: float, steps: Optional[int]) -> bytes:
    """A newer file in [restart] checkpoint_dir, and the node's steps when it was seen."""
    return event_line("checkpoint", **wire(CheckpointWritten(mtime, steps)))


def sample_message(sample: HostSample) -> bytes:
    """The job's CPU, memory and GPUs now (never replayed: a sample of the past is news to no one)."""
    return event_line("sample", **wire(sample))


def recorded_result(state: Dict[str, Any]) -> Dict[str, Any]:
    """The supervise op's result as the supervisor recorded it in state.json when it ended (every
    field SuperviseResult declares), for a session that attaches after that."""
    return {f.name: state[f.name] for f in fields(SuperviseResult) if f.name in state}


def _rank(value: Any) -> Optional[int]:
    """A global or local rank from a record (RANK=-1: the wrapper did not know it)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
