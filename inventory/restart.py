"""The job file's `[restart]` table: ddpctl's one budget of restarts for the whole job, how long to
wait between attempts, which exit codes mean a faulty host, how far the job may shrink, and the
checkpoint directory the ranks are told about (orchestrator/restarts/loop.py spends it)."""

from __future__ import annotations

from typing import Any

from inventory.fields import check_keys, describe, expect_bool, expect_int, expect_str, expect_table
from inventory.model import RestartSpec
from inventory.tomlsource import Reporter

RESTART_KEYS = ("max_restarts", "min_nodes", "host_fault_exit_codes", "checkpoint_dir", "backoff", "max_backoff",
                "quarantine")
MAX_RESTARTS = 1000
MAX_BACKOFF_S = 3600


def read_restart(doc: Reporter, value: object, nodes: int) -> RestartSpec:
    """[restart] of a job that runs on `nodes` hosts (min_nodes may not exceed it)."""
    table: dict[str, Any] = expect_table(doc, "restart", value)
    check_keys(doc, "restart", table, RESTART_KEYS)
    default = RestartSpec()
    max_restarts = expect_int(doc, "restart.max_restarts", table["max_restarts"], 0, MAX_RESTARTS) \
        if "max_restarts" in table else default.max_restarts
    min_nodes = None
    if "min_nodes" in table:
        min_nodes = expect_int(doc, "restart.min_nodes", table["min_nodes"], 1)
        if min_nodes > nodes:
            raise doc.error("restart.min_nodes", f"min_nodes = {min_nodes} but the job runs on {nodes} host(s)",
                            f"the job may shrink, never grow: use at most {nodes}", value=min_nodes)
    codes: tuple[int, ...] = ()
    if "host_fault_exit_codes" in table:
        raw = table["host_fault_exit_codes"]
        if not isinstance(raw, list):
            raise doc.error("restart.host_fault_exit_codes", f"expected a list of exit codes, got {describe(raw)}",
                            "e.g. host_fault_exit_codes = [75, 101]", value=raw)
        codes = tuple(expect_int(doc, f"restart.host_fault_exit_codes[{i}]", code, 1, 255)
                      for i, code in enumerate(raw))
    checkpoint_dir = None
    if "checkpoint_dir" in table:
        checkpoint_dir = expect_str(doc, "restart.checkpoint_dir", table["checkpoint_dir"])
    given_max = _seconds(doc, table, "max_backoff", None)
    backoff = _seconds(doc, table, "backoff", default.backoff if given_max is None else min(default.backoff, given_max))
    assert backoff is not None
    max_backoff = given_max if given_max is not None else max(default.max_backoff, backoff)
    if max_backoff < backoff:
        raise doc.error("restart.max_backoff", f"max_backoff = {max_backoff:g} is below backoff = {backoff:g}",
                        "the wait starts at backoff and doubles up to max_backoff", value=max_backoff)
    quarantine = expect_bool(doc, "restart.quarantine", table["quarantine"]) if "quarantine" in table \
        else default.quarantine
    return RestartSpec(max_restarts, min_nodes, codes, checkpoint_dir, backoff, max_backoff, quarantine)


def _seconds(doc: Reporter, table: dict[str, Any], key: str, default: float | None) -> float | None:
    """Seconds, whole or not, 0 to MAX_BACKOFF_S."""
    if key not in table:
        return default
    value = table[key]
    if isinstance(value, float):
        if 0 <= value <= MAX_BACKOFF_S:
            return value
        raise doc.error(f"restart.{key}", f"{value:g} is out of range", f"give 0 to {MAX_BACKOFF_S} seconds",
                        value=value)
    return float(expect_int(doc, f"restart.{key}", value, 0, MAX_BACKOFF_S))
