"""The job file's `[watch]` table: what `ddpctl up` watches a running job for, and when it speaks
(orchestrator/watch/ applies it). Every key has a default that suits a real job; tests shorten them."""

from __future__ import annotations

from typing import Any

from inventory.fields import check_keys, expect_int, expect_table
from inventory.model import WatchSpec
from inventory.tomlsource import Reporter

WATCH_KEYS = ("total_steps", "hang_after", "pulse", "straggler_threshold", "straggler_warmup", "straggler_recovery",
              "sample_every", "gpu_idle_after")
MAX_SECONDS = 7 * 24 * 3600


def read_watch(doc: Reporter, value: object) -> WatchSpec:
    table: dict[str, Any] = expect_table(doc, "watch", value)
    check_keys(doc, "watch", table, WATCH_KEYS)
    default = WatchSpec()
    total = expect_int(doc, "watch.total_steps", table["total_steps"], 1) if "total_steps" in table else None
    return WatchSpec(
        total_steps=total,
        hang_after=_number(doc, table, "hang_after", default.hang_after, 1, MAX_SECONDS),
        pulse=_number(doc, table, "pulse", default.pulse, 1, MAX_SECONDS),
        straggler_threshold=_number(doc, table, "straggler_threshold", default.straggler_threshold, 0.01, 10.0),
        straggler_warmup=_number(doc, table, "straggler_warmup", default.straggler_warmup, 0, MAX_SECONDS),
        straggler_recovery=_number(doc, table, "straggler_recovery", default.straggler_recovery, 0, MAX_SECONDS),
        sample_every=_number(doc, table, "sample_every", default.sample_every, 0, 3600),
        gpu_idle_after=_number(doc, table, "gpu_idle_after", default.gpu_idle_after, 1, MAX_SECONDS),
    )


def _number(doc: Reporter, table: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    if key not in table:
        return default
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise doc.error(f"watch.{key}", f"expected a number, got {type(value).__name__}",
                        f"give a number from {low:g} to {high:g}", value=value)
    if not low <= value <= high:
        raise doc.error(f"watch.{key}", f"{value:g} is out of range", f"give a number from {low:g} to {high:g}",
                        value=value)
    return float(value)
