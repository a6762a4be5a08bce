"""Which attempt owns [restart] checkpoint_dir: the newest one to start. Each node's supervisor
claims the directory before its torchrun starts (`claim`), so that a rank of an older attempt, or
of an older run, that still runs somewhere (a host cut off from `up`) can see it is stale and
refuse to write a checkpoint (`owns`: the few lines a script needs, in docs/restarts.md).

The mark is one small JSON file, `<checkpoint_dir>/.ddpctl-attempt`:
{"run_id": ..., "attempt": N, "at": time}. Standard library only, Python >= 3.8."""

import contextlib
import json
import os
import time
from typing import Any, Dict, Optional

from node_agent.wire.layout import ATTEMPT_MARK


def read_mark(directory: str) -> Optional[Dict[str, Any]]:
    try:
        with open(os.path.join(directory, ATTEMPT_MARK)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def owns(directory: str, run_id: Optional[str], attempt: int) -> bool:
    """Whether attempt `attempt` of run `run_id` may write into `directory`: no mark, or the mark
    names this very attempt (or an older one of this run, not yet re-claimed)."""
    mark = read_mark(directory)
    if mark is None:
        return True
    try:
        theirs = int(mark.get("attempt", -1))
    except (TypeError, ValueError):
        return True
    return mark.get("run_id") == run_id and theirs <= attempt


def claim(directory: str, run_id: Optional[str], attempt: int) -> bool:
    """Mark `directory` as owned by this attempt (atomically: tmp + rename), unless a newer
    attempt of the same run owns it already; False when it could not (unwritable: the ranks'
    own writes would fail there too, and doctor's ckpt column says why)."""
    mark = read_mark(directory)
    if mark is not None and mark.get("run_id") == run_id and isinstance(mark.get("attempt"), int) \
            and mark["attempt"] > attempt:
        return True  # a newer attempt of this run claimed it: never moved back
    tmp = os.path.join(directory, "%s.%d.tmp" % (ATTEMPT_MARK, os.getpid()))
    try:
        os.makedirs(directory, exist_ok=True)
        with open(tmp, "w") as f:
            json.dump({"run_id": run_id, "attempt": attempt, "at": time.time()}, f)
        os.replace(tmp, os.path.join(directory, ATTEMPT_MARK))
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
    return True
