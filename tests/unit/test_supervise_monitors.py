"""Monitors plugged into the supervision core (orchestrator/launch/monitor_api.py): one written here,
unknown to the core, stops a job with its own headline; `up`'s own (orchestrator/watch/) time out a
silent job, look into a stall, keep their findings for summary.json and write the report."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from test_launch_core import ScriptedBackend, emit_all, make_job, until_stopped

from inventory.model import WatchSpec
from orchestrator.launch import core
from orchestrator.launch.backends.base import Emit
from orchestrator.launch.events import Exited, Milestone, Output, Started
from orchestrator.launch.monitor_api import (
    Action,
    Fail,
    JobView,
    Monitor,
    MonitorEvent,
    Quiet,
    Say,
    Stop,
)
from orchestrator.launch.observer import Collected
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.plan import LaunchPlan
from orchestrator.launch.result import RunResult
from orchestrator.remote.wire import RankPhase, StepWindow
from orchestrator.watch.factory import standard_monitors
from orchestrator.watch.hang import HangTimeout
from orchestrator.watch.progress import ProgressWatch
from orchestrator.watch.rendezvous import RendezvousWatchdog
from orchestrator.watch.report import ReportWriter


class StopAfter(Quiet):
    """Stops the job after `ticks` ticks with `cause` as the run's headline; counts what it saw."""

    def __init__(self, ticks: int, cause: str) -> None:
        self.ticks = ticks
        self.cause = cause
        self.events: list[MonitorEvent] = []
        self.finished: RunResult | None = None

    def on_event(self, event: MonitorEvent, job: JobView) -> Sequence[Action]:
        self.events.append(event)
        return ()

    def on_tick(self, job: JobView) -> Sequence[Action]:
        self.ticks -= 1
        if self.ticks or job.stopping:
            return ()
        return [Say(f"{self.cause}: stopping"), Fail(cause=self.cause), Stop("the test monitor stops the job")]

    def finish(self, result: RunResult) -> Sequence[Action]:
        self.finished = result
        return [Say("the test monitor saw the end")]


def run(script: object, tmp_path: Path, monitors: Sequence[Monitor] = (),
        options: LaunchOptions | None = None) -> tuple[RunResult, Collected, ScriptedBackend]:
    backend = ScriptedBackend(script)  # type: ignore[arg-type]
    out = Collected()
    options = options or LaunchOptions(grace=1.0, runs_dir=tmp_path)
    result = core.launch(make_job(), backend, out, options, monitors=lambda _plan, _options: monitors)
    return result, out, backend


def running(_b: ScriptedBackend, emit: Emit) -> None:
    emit_all(emit, [Started("a"), Started("b"), Output("a", ["working"])])
    until_stopped(_b, emit)


def test_a_monitor_the_core_does_not_know_stops_the_job_with_its_cause_as_the_headline(tmp_path: Path) -> None:
    monitor = StopAfter(3, "the test's own reason")
    result, out, backend = run(running, tmp_path, [monitor])
    assert backend.stops == [(("a", "b"), False)]
    assert result.exit_code == 1 and result.cause == "the test's own reason"
    assert "the test's own reason: stopping" in out.notices and "the test monitor stops the job" in out.notices
    assert out.notices[-1] == "the test monitor saw the end" and monitor.finished is result
    assert [type(e).__name__ for e in monitor.events[:3]] == ["Started", "Started", "Output"]
    assert json.loads((result.run_dir / "summary.json").read_text())["cause"] == "the test's own reason"


def test_without_monitors_a_silent_job_runs_to_its_end(tmp_path: Path) -> None:
    def script(_b: ScriptedBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b")])
        time.sleep(1.0)  # the job's own silence: longer than the hang timeout, across two of the core's ticks
        emit_all(emit, [Exited("a", 0), Exited("b", 0)])

    options = LaunchOptions(grace=1.0, runs_dir=tmp_path, hang_timeout=0.2, on_hang="stop")
    result, _out, backend = run(script, tmp_path, options=options)
    assert result.exit_code == 0 and backend.stops == [] and not (result.run_dir / "report.json").exists()


def test_the_hang_timeout_dumps_the_stacks_stops_the_job_and_fails_it(tmp_path: Path) -> None:
    options = LaunchOptions(grace=1.0, runs_dir=tmp_path, hang_timeout=0.3, on_hang="stop")

    def script(b: ScriptedBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b")])
        until_stopped(b, emit)

    backend = ScriptedBackend(script)
    out = Collected()
    result = core.launch(make_job(), backend, out, options, monitors=standard_monitors)
    assert result.exit_code == 1 and result.hung and result.cause is None
    assert "no rank printed anything for 0s: the job looks hung" in out.notices
    assert "stopping the hung job on every host (--on-hang=stop)" in out.notices
    assert len(list(result.run_dir.glob("stacks-hang-*.json"))) == 1
    assert (result.run_dir / "report.json").exists() and (result.run_dir / "report.html").exists()


def step(host: str, local: int, n: int) -> Milestone:
    return Milestone(host, RankPhase(local, local, "step", 0.0, None, n, StepWindow(1, 0.01, 10.0, 11.0)))


def test_a_stall_is_looked_into_and_its_finding_kept_for_the_summary_and_the_report(tmp_path: Path) -> None:
    job = replace(make_job(), watch=WatchSpec(hang_after=0.3))
    options = LaunchOptions(grace=1.0, runs_dir=tmp_path, on_hang="stop")

    def script(b: ScriptedBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b"), step("a", 0, 1), step("b", 0, 1)])
        until_stopped(b, emit)

    backend = ScriptedBackend(script)
    out = Collected()
    result = core.launch(job, backend, out, options, monitors=standard_monitors)
    assert result.exit_code == 1 and result.hung and result.steps == 1
    assert any(n.startswith("no rank has taken an optimizer step for") for n in out.notices)
    kinds = [f.kind for f in result.findings]
    assert kinds == ["no progress"]
    assert json.loads((result.run_dir / "summary.json").read_text())["findings"] == result.findings_json()
    assert [f["kind"] for f in json.loads((result.run_dir / "report.json").read_text())["findings"]] == kinds
    assert out.progress is not None and out.progress.step == 1


def test_up_s_monitors_follow_its_options() -> None:
    plan = core.plan_job(make_job(), ScriptedBackend(running))  # type: ignore[arg-type]

    def kinds(plan: LaunchPlan, **options: object) -> list[type]:
        return [type(m) for m in standard_monitors(plan, LaunchOptions(**options))]  # type: ignore[arg-type]

    assert kinds(plan) == [RendezvousWatchdog, ProgressWatch, ReportWriter]
    assert kinds(plan, join_timeout=0, hang_timeout=5.0) == [HangTimeout, ProgressWatch, ReportWriter]
    unwrapped = replace(plan, hosts=[replace(hl, wrapped=False) for hl in plan.hosts])  # doctor's inline jobs
    assert kinds(unwrapped) == [ProgressWatch, ReportWriter]
