"""Short collective jobs (smoke test, bandwidth) through the launch core, shipped with the agent
(orchestrator/launch/inline.py): the hosts need torch but not this repository."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from inventory import Job, Rendezvous
from orchestrator.launch import core
from orchestrator.launch.backends.base import Backend
from orchestrator.launch.inline import InlineProgram, shipped_program
from orchestrator.launch.monitor_api import MonitorFactory
from orchestrator.launch.observer import Collected
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.plan import LaunchPlan
from orchestrator.launch.result import RunResult
from orchestrator.watch.factory import standard_monitors

SMOKE_LINE = re.compile(r"DDPCTL-SMOKE rank=(\d+) world=(\d+) ok=(\w+)")


@dataclass
class CollectiveRun:
    result: RunResult
    output: Collected
    plan: LaunchPlan


def run_collective(job: Job, backend: Backend, name: str, program: InlineProgram, runs_dir: Path,
                   deadline: float, nproc: int = 1, monitors: MonitorFactory = standard_monitors) -> CollectiveRun:
    """`program` with `nproc` ranks per host on the job's hosts (static rendezvous, or each host on
    its own: InlineProgram.per_host), stopped past `deadline` seconds without output."""
    job = replace(job, name=name, nproc_per_node=nproc,
                  rendezvous=Rendezvous(job.rendezvous.master_addr, job.rendezvous.master_port, "static"))
    out = Collected()
    # doctor has just run every check; a per-host program's hosts run each on its own: one that fails
    # does not stop the others (its coordinator names it; doctor/deep_start.py stops a job without one)
    options = LaunchOptions(grace=3.0, hang_timeout=deadline, on_hang="stop", dump_stacks_on_hang=False,
                            runs_dir=runs_dir, checks=False, fail_fast=not program.per_host)
    result = core.launch(job, backend, out, options, inline=program, monitors=monitors)  # the hang timeout
    assert out.plan is not None
    return CollectiveRun(result, out, out.plan)


def smoke_program() -> InlineProgram:
    return shipped_program(("smoke.py",))


def bandwidth_program(max_bytes: str) -> InlineProgram:
    return shipped_program(("common.py", "allreduce_bench/bench.py"),
                           ("--json", "--max-bytes", max_bytes, "--iters", "5", "--warmup", "2"))


def smoke(job: Job, backend: Backend, runs_dir: Path, deadline: float = 60.0) -> CollectiveRun:
    return run_collective(job, backend, "ddpctl-smoke", smoke_program(), runs_dir, deadline)


def bandwidth(job: Job, backend: Backend, runs_dir: Path, max_bytes: str = "64M",
              deadline: float = 300.0) -> tuple[CollectiveRun, dict[str, Any] | None]:
    """The allreduce_bench job across the hosts; returns its BANDWIDTH json (rank 0's)."""
    run = run_collective(job, backend, "ddpctl-bandwidth", bandwidth_program(max_bytes), runs_dir, deadline)
    return run, result_line(run, "BANDWIDTH ")


def result_text(run: CollectiveRun, prefix: str) -> str | None:
    """What a collective job printed after `prefix` (rank 0's result), if it did."""
    for _host, _rank, text in run.output.lines:
        if text.startswith(prefix):
            return text[len(prefix):]
    return None


def result_line(run: CollectiveRun, prefix: str) -> dict[str, Any] | None:
    """The JSON a collective job printed after `prefix` (rank 0's result), if it did."""
    text = result_text(run, prefix)
    if text is None:
        return None
    parsed: dict[str, Any] = json.loads(text)
    return parsed
