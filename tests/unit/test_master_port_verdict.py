"""The one verdict on a master-port holder, shared by doctor's port check and `up`'s pre-flight."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.checks.master_port import Holder, port_verdict
from orchestrator.remote.wire import parse_master_port

FOREIGN = {"pid": 77, "user": "bob", "cmdline": ["nc", "-l", "29500"]}
STALE = {"pid": 78, "user": "root", "cmdline": ["python", "train.py"], "ddpctl_job_id": "toy-1", "job_live": False}
LIVE = {"pid": 79, "user": "root", "cmdline": ["python", "train.py"], "ddpctl_job_id": "toy-2", "job_live": True}


@pytest.mark.parametrize(("fact", "holder", "text", "fix"), [
    ({"port": 29500, "bindable": True, "owners": []}, Holder.FREE, "is free on node0", ""),
    ({"port": 29500, "bindable": False, "owners": [FOREIGN]}, Holder.FOREIGN,
     "held by pid 77 (user bob): nc -l 29500", "ddpctl kill-port 29500 --host node0"),
    ({"port": 29500, "bindable": False, "owners": [STALE]}, Holder.STALE, "stale ddpctl job (toy-1)",
     "`ddpctl up` frees it"),
    ({"port": 29500, "bindable": False, "owners": [STALE, LIVE]}, Holder.LIVE_JOB, "running ddpctl job toy-2",
     "ddpctl down toy-2"),
    ({"port": 29500, "bindable": False, "owners": [STALE, FOREIGN]}, Holder.FOREIGN, "pid 77", "--free-port"),
    ({"port": 29500, "bindable": False, "owners": None}, Holder.UNKNOWN, "cannot list port owners",
     'master_port = "auto"'),
    ({"port": 29500, "bindable": False, "owners": []}, Holder.UNKNOWN, "owner not visible",
     'sudo ss -ltnp "sport = :29500"'),  # kill-port and --free-port see no more than this user does
])
def test_the_verdict_names_the_holder_and_the_fix(fact: dict[str, Any], holder: Holder, text: str, fix: str) -> None:
    verdict = port_verdict("node0", 29500, parse_master_port(fact))
    assert verdict.holder == holder
    assert text in verdict.message
    assert fix in verdict.fix
    assert verdict.blocks_launch == (holder in (Holder.FOREIGN, Holder.LIVE_JOB, Holder.UNKNOWN))


def test_no_fact_at_all_is_a_free_port() -> None:
    assert port_verdict("node0", 29500, None).holder == Holder.FREE
