"""How the launch core reports progress: an observer the caller passes in, never prints."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from orchestrator.hostops.runrecord import follow_up
from orchestrator.launch.labels import RankLines
from orchestrator.launch.plan import LaunchPlan
from orchestrator.launch.progress import Status
from orchestrator.launch.result import HostRun, RunState
from orchestrator.sync.core import HostSync, SyncEvent
from orchestrator.sync.text import sync_line


class Observer(Protocol):
    def on_plan(self, plan: LaunchPlan, run_dir: Path) -> None:
        """The plan is settled (nproc and port resolved, stale port freed); the job starts now."""

    def on_lines(self, host: str, lines: RankLines) -> None:
        """A batch of one host's output lines, in order: (rank, text) each; rank None: torchrun's own
        (`lines.render` gives them prefixed as one string, fast)."""

    def on_state(self, run: HostRun) -> None:
        """A host changed state (connecting, running, stopping, exited, failed, lost)."""

    def on_notice(self, text: str) -> None:
        """Something the user should know (a port freed, a failure, a stop)."""

    def on_sync(self, event: SyncEvent) -> None:
        """[sync] progress, before the plan: a host's changes planned, bytes sent, a host done."""

    def on_progress(self, status: Status) -> None:
        """The job's progress now (step, steps/s, step time, ETA, slowest rank), twice a second
        once a rank has stepped: a status line on a terminal, a pulse line now and then elsewhere."""


@dataclass
class Collected:
    """An observer that keeps everything instead of printing it (collective jobs, tests)."""

    lines: list[tuple[str, str | None, str]] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    states: list[tuple[str, str]] = field(default_factory=list)
    plan: LaunchPlan | None = None
    synced: list[HostSync] = field(default_factory=list)
    progress: Status | None = None

    def on_plan(self, plan: LaunchPlan, run_dir: Path) -> None:
        self.plan = plan

    def on_lines(self, host: str, lines: RankLines) -> None:
        self.lines.extend((host, rank, text) for rank, text in lines)

    def on_state(self, run: HostRun) -> None:
        self.states.append((run.host, run.state.value))

    def on_notice(self, text: str) -> None:
        self.notices.append(text)

    def on_sync(self, event: SyncEvent) -> None:
        if isinstance(event, HostSync):
            self.synced.append(event)

    def on_progress(self, status: Status) -> None:
        self.progress = status


class Plain:
    """An observer that prints `[host:rank] line` and notices to stdout (the Python API's default),
    and the job's progress every PULSE_EVERY seconds."""

    def __init__(self, pulse: float = 30.0) -> None:
        self.pulse = Pulse(pulse)

    def on_plan(self, plan: LaunchPlan, run_dir: Path) -> None:
        print(f"ddpctl: {plan_summary(plan, run_dir)}", flush=True)

    def on_lines(self, host: str, lines: RankLines) -> None:
        sys.stdout.write(lines.render(lambda rank: f"[{host}:{rank}] " if rank is not None else f"[{host}] "))
        sys.stdout.flush()

    def on_state(self, run: HostRun) -> None:
        if run.state in (RunState.FAILED, RunState.LOST):
            print(f"ddpctl: {run.host} {run.state.value}" + (f": {run.error}" if run.error else ""), flush=True)

    def on_notice(self, text: str) -> None:
        print(f"ddpctl: {text}", flush=True)

    def on_sync(self, event: SyncEvent) -> None:
        line = sync_line(event)
        if line is not None:
            print(f"ddpctl: {line}", flush=True)

    def on_progress(self, status: Status) -> None:
        line = self.pulse.due(status)
        if line is not None:
            print(f"ddpctl: {line}", flush=True)


class Pulse:
    """A progress line every `every` seconds where there is no status line (a log, a pipe), and
    none while nothing moves but the first that says so."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.last = time.monotonic()
        self.said_step: int | None = None

    def due(self, status: Status) -> str | None:
        now = time.monotonic()
        still = status.step == self.said_step  # nothing moved since the last line
        if now - self.last < self.every or (still and status.quiet_s >= self.every * 2):
            return None
        self.last, self.said_step = now, status.step
        return f"progress: {status.text(quiet_from=0 if still else 10)}"


def plan_summary(plan: LaunchPlan, run_dir: Path) -> str:
    """The plan in one line; at a run's first launch, the commands that follow it, on a second."""
    nprocs = sorted({hl.nproc for hl in plan.hosts})
    first = plan.run_id is None or plan.job_id == f"{plan.run_id}.0"
    then = f"\n  follow: {follow_up(plan.run_id or plan.job_id, plan.job.inventory.source)}" if first else ""
    if plan.job.slurm is not None:
        return (f"job {plan.job_id}: Slurm, {len(plan.hosts)} node(s) × nproc {nprocs[0]}, world size "
                f"{plan.world_size}, rendezvous on the allocation's first node; logs in {run_dir}{then}")
    return (f"job {plan.job_id}: {len(plan.hosts)} host(s) × nproc {nprocs}, world size {plan.world_size}, "
            f"master {plan.master_addr}:{plan.master_port}; logs in {run_dir}{then}")
