"""The launch core through the backend seam: a scripted backend stands in for SSH or Slurm, so the
supervision rules (ranks, fail fast, lost hosts, exit codes, summary.json) are tested on their own."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from inventory import Host, Inventory, Job, Rendezvous
from orchestrator.checks.model import ProbeOutcome, ProbeResults
from orchestrator.hostops.stacks import StacksReport
from orchestrator.launch import core
from orchestrator.launch.backends.base import DetachReport, Emit, Notice, Resolved
from orchestrator.launch.events import Alive, BackendEvent, Exited, Lost, Milestone, Output, Reported, Started
from orchestrator.launch.inline import InlineProgram
from orchestrator.launch.observer import Collected
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.plan import LaunchPlan, build_plan
from orchestrator.launch.result import HostRun, RunResult
from orchestrator.remote.wire import RankError, RankPhase, SuperviseResult
from orchestrator.watch.factory import standard_monitors
from orchestrator.watch.rendezvous import RendezvousWatch

A = Host(name="a", address="198.18.0.1", python="/opt/py/bin/python")
B = Host(name="b", address="198.18.0.2")
C = Host(name="c", address="198.18.0.3")

Script = Callable[["ScriptedBackend", Emit], None]


def make_job(hosts: tuple[Host, ...] = (A, B)) -> Job:
    return Job(name="t", inventory=Inventory(hosts=(A, B, C)), hosts=hosts, script="train.py",
               nproc_per_node=2, rendezvous=Rendezvous(master_port=29500), base_dir=Path("/jobs"))


@dataclass
class ScriptedBackend:
    """Runs `script` in a thread when started; records what the core asked of it."""

    script: Script
    name: str = "scripted"
    stops: list[tuple[tuple[str, ...], bool]] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    closed: bool = False
    plan: LaunchPlan | None = None
    stopped: threading.Event = field(default_factory=threading.Event)
    probes: ProbeResults = field(default_factory=ProbeResults)
    reprobed: int = 0

    def resolve(self, job: Job, options: LaunchOptions, notice: Notice, settle: bool) -> Resolved:
        notice(f"resolved (settle={settle})")
        return Resolved({h.name: 2 for h in job.hosts}, 29555)

    def start(self, plan: LaunchPlan, options: LaunchOptions, emit: Emit) -> None:
        self.plan = plan
        threading.Thread(target=self.script, args=(self, emit), daemon=True).start()

    def stop(self, hosts: Sequence[str], force: bool, failed: bool = False) -> None:
        self.stops.append((tuple(hosts), force))
        self.stopped.set()

    def drop(self, host: str) -> None:
        self.dropped.append(host)

    def reattach(self, host: str) -> None:
        return None

    def close(self) -> None:
        self.closed = True

    def detach(self, plan: LaunchPlan, options: LaunchOptions) -> DetachReport:
        return DetachReport(started={hl.host.name: 100 + hl.node_rank for hl in plan.hosts})

    def stacks(self, plan: LaunchPlan) -> StacksReport:
        return StacksReport(plan.job_id)

    def reprobe(self, plan: LaunchPlan) -> ProbeResults:
        self.reprobed += 1
        return self.probes


def emit_all(emit: Emit, events: Sequence[BackendEvent]) -> None:
    for event in events:
        emit(event)


def launch(script: Script, tmp_path: Path, job: Job | None = None, join_timeout: float | None = None,
           backend: ScriptedBackend | None = None) -> tuple[core.RunResult, Collected, ScriptedBackend]:
    backend = backend or ScriptedBackend(script)
    out = Collected()
    result = core.launch(job or make_job(), backend, out,
                         LaunchOptions(grace=1.0, runs_dir=tmp_path, join_timeout=join_timeout),
                         monitors=standard_monitors)  # the watchdog, as `up` has it
    return result, out, backend


def phase(host: str, local: int, rank: int, name: str, at: float = 0.0, error: RankError | None = None) -> Milestone:
    return Milestone(host, RankPhase(local, rank, name, at, error))


def until_stopped(b: ScriptedBackend, emit: Emit, code: int = 143) -> None:
    b.stopped.wait(20)
    emit_all(emit, [Exited("a", code), Exited("b", code)])


def test_a_clean_run_maps_torchrun_prefixes_to_global_ranks_and_keeps_logs(tmp_path: Path) -> None:
    def script(_b: ScriptedBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b"), Output("b", ["[default1]:loss=1.0"]), Alive("a"),
                        Output("a", ["torchrun says hi"]), Exited("a", 0), Exited("b", 0)])

    result, out, backend = launch(script, tmp_path)
    assert result.exit_code == 0 and result.ok and result.first_failure is None
    assert ("b", "3", "loss=1.0") in out.lines  # node_rank 1 x nproc 2 + local rank 1
    assert ("a", None, "torchrun says hi") in out.lines
    assert backend.stops == [] and backend.closed
    assert out.plan is not None and out.plan.master_port == 29555  # the backend's resolution
    assert (result.run_dir / "b.log").read_text() == "[default1]:loss=1.0\n"
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["exit_code"] == 0 and [h["state"] for h in summary["hosts"]] == ["exited", "exited"]
    assert result.run_dir == tmp_path / result.job_id


def test_without_fail_fast_a_failing_host_stops_no_other_and_is_still_the_first_failure(tmp_path: Path) -> None:
    """A per-host program (doctor --deep): each host runs on its own, a monitor decides the stop."""
    def script(b: ScriptedBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b"), Exited("b", 1)])
        assert not b.stopped.wait(1.5), "the core stopped the other host"
        emit_all(emit, [Exited("a", 0)])

    backend = ScriptedBackend(script)
    result = core.launch(make_job(), backend, Collected(), LaunchOptions(grace=1.0, runs_dir=tmp_path, fail_fast=False))
    assert backend.stops == [] and result.first_failure is not None and result.first_failure.host == "b"
    assert result.exit_code == 1 and [h.state.value for h in result.hosts] == ["exited", "failed"]


def test_the_first_failing_host_stops_every_other_host_and_is_the_first_failure(tmp_path: Path) -> None:
    error = RankError(1, "RuntimeError: boom", "Traceback ...\nRuntimeError: boom", 1.0, None)

    def script(b: ScriptedBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b"),
                        Reported("b", SuperviseResult(1, None, error, None, None, None)), Exited("b", 1)])
        assert b.stopped.wait(10), "the core never asked to stop the other host"
        emit_all(emit, [Exited("a", 143)])

    result, out, backend = launch(script, tmp_path)
    assert backend.stops == [(("a",), False)]  # graceful, only the host still running
    assert result.first_failure is not None and result.first_failure.host == "b"
    assert result.first_failure.first_error == error
    assert result.global_rank(result.first_failure, 1) == 3
    assert result.exit_code == 1
    assert any("b failed (exit code 1)" in n for n in out.notices)


def test_a_rank_error_stops_every_host_before_any_host_exits(tmp_path: Path) -> None:
    """Fail fast: the rank's error milestone alone makes the core stop every host; it does not
    wait for the failing host's torchrun to exit."""
    error = RankError(1, "boom", "Traceback ...\nRuntimeError: boom", 1.0, None, rank=3, kind="RuntimeError")

    def script(b: ScriptedBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b"), phase("b", 1, 3, "error", 1.0, error)])
        stopped = b.stopped.wait(10)
        emit_all(emit, [Exited("a", 143), Exited("b", 1)])
        assert stopped, "the core waited for an exit before stopping the job"

    result, out, backend = launch(script, tmp_path)
    assert backend.stops == [(("a", "b"), False)]  # every host still running, gracefully
    assert result.first_failure is not None and result.first_failure.host == "b"
    assert any("b failed (rank 3 raised RuntimeError)" in n for n in out.notices)
    assert result.exit_code == 1


def test_a_lost_host_is_dropped_and_fails_the_job(tmp_path: Path) -> None:
    def script(b: ScriptedBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Lost("b", "connection refused")])
        assert b.stopped.wait(10)
        emit_all(emit, [Exited("a", 0)])

    result, _out, backend = launch(script, tmp_path)
    assert backend.dropped == ["b"]
    by_host = {r.host: r for r in result.hosts}
    assert by_host["b"].state.value == "lost" and by_host["b"].error == "connection refused"
    assert result.first_failure is not None and result.first_failure.host == "b"
    assert result.exit_code == 1


def test_a_single_host_job_exits_with_torchruns_own_code(tmp_path: Path) -> None:
    def script(_b: ScriptedBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Exited("a", 7)])

    result, _out, _backend = launch(script, tmp_path, make_job(hosts=(A,)))
    assert result.exit_code == 7


def test_an_inline_program_runs_with_no_python_and_the_dry_run_plan_is_the_launched_plan(tmp_path: Path) -> None:
    program = InlineProgram(("pkg", "pkg.main"), "pkg.main", ("--x", "a b"))
    backend = ScriptedBackend(lambda _b, emit: emit_all(emit, [Exited("a", 0), Exited("b", 0)]))
    result = core.launch(make_job(), backend, Collected(), LaunchOptions(runs_dir=tmp_path), inline=program)
    assert result.ok and backend.plan is not None
    a = backend.plan.hosts[0]
    assert "--no-python" in a.launcher and "--module" not in a.launcher
    assert a.program[:2] == ("/opt/py/bin/python", "-c") and a.program[-3:] == ("pkg.main", "--x", "a b")
    assert a.modules == ("pkg", "pkg.main")  # the supervise request names them; the command line does not carry them
    dry = core.plan_job(make_job(), ScriptedBackend(lambda _b, _e: None))
    assert dry.hosts[0].program == ("train.py",) and "--no-python" not in dry.hosts[0].launcher
    assert dry.hosts[0].launcher == a.launcher[:-1]  # the same torchrun options, less --no-python
    assert dry.master_port == backend.plan.master_port and dry.job_id != backend.plan.job_id


def test_detach_starts_through_the_backend_and_names_the_job(tmp_path: Path) -> None:
    backend = ScriptedBackend(lambda _b, _e: None)
    out = Collected()
    detached = core.detach(make_job(), backend, out, LaunchOptions(runs_dir=tmp_path))
    assert detached.report.started == {"a": 100, "b": 101}
    assert out.plan is detached.plan and "resolved (settle=True)" in out.notices


@pytest.mark.parametrize("settle", [False, True])
def test_plan_job_passes_settle_to_the_backend(settle: bool) -> None:
    out = Collected()
    core.plan_job(make_job(), ScriptedBackend(lambda _b, _e: None), settle=settle, observer=out)
    assert out.notices == [f"resolved (settle={settle})"]


def test_ranks_that_never_start_trip_the_watchdog_which_names_the_blocked_port(tmp_path: Path) -> None:
    def script(b: ScriptedBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b"), phase("a", 0, -1, "started"), Output("b", ["connecting..."])])
        until_stopped(b, emit)

    dropped = ProbeOutcome("b", "a", "198.18.0.1", 29555, "master_port", False, "timeout", "timed out")
    backend = ScriptedBackend(script, probes=ProbeResults([dropped]))
    result, _out, _ = launch(script, tmp_path, join_timeout=0.5, backend=backend)
    assert result.exit_code == 1 and backend.reprobed == 1
    assert result.cause is not None
    assert "torchrun's rendezvous at 198.18.0.1:29555 never completed" in result.cause
    assert "a: 1 of 2 rank(s) started" in result.cause and "b: 0 of 2 rank(s) started" in result.cause
    assert "TCP on the master port 29555 is blocked between a and b" in result.cause
    assert "b last printed:\n    connecting..." in result.cause
    assert backend.stops[0] == (("a", "b"), False)
    assert json.loads((result.run_dir / "summary.json").read_text())["cause"] == result.cause


def test_a_rank_still_busy_before_its_init_is_not_a_hang() -> None:
    rdzv = RendezvousWatch(build_plan(make_job(), "t-1", {"a": 2, "b": 2}, 29555), timeout=0.5)
    rdzv.started("a")
    rdzv.started("b")
    for host, local, rank in (("a", 0, 0), ("a", 1, 1), ("b", 0, 2), ("b", 1, 3)):
        rdzv.saw(host, RankPhase(local, rank, "started", 0.0, None))
        if rank != 3:
            rdzv.saw(host, RankPhase(local, rank, "init", 0.0, None))
    much_later = time.monotonic() + 1000  # rank 3 loads its data for far longer than the bound
    assert not rdzv.overdue(much_later)
    rdzv.saw("b", RankPhase(1, 3, "init", 0.0, None))  # every rank waits in init_process_group now
    assert not rdzv.overdue(time.monotonic()) and rdzv.overdue(much_later)
    for host, local, rank in (("a", 0, 0), ("a", 1, 1), ("b", 0, 2), ("b", 1, 3)):
        rdzv.saw(host, RankPhase(local, rank, "joined", 0.0, None))
    assert not rdzv.overdue(much_later) and rdzv.done


def test_a_node_whose_torchrun_never_starts_trips_the_watchdog_and_is_named(tmp_path: Path) -> None:
    """A batch task that never ran (b): the started node waits in torchrun's rendezvous forever."""
    def script(b: ScriptedBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), phase("a", 0, 0, "started")])
        b.stopped.wait(20)
        emit_all(emit, [Exited("a", 143), Exited("b", 143)])

    result, _out, _ = launch(script, tmp_path, join_timeout=0.5)
    assert result.exit_code == 1 and result.cause is not None
    assert "torchrun's rendezvous" in result.cause and "b: its torchrun never started" in result.cause
    rdzv = RendezvousWatch(build_plan(make_job(), "t-1", {"a": 2, "b": 2}, 29555), timeout=0.5)
    assert not rdzv.overdue(time.monotonic() + 1000)  # nothing started yet: not the watchdog's to judge


def test_every_rank_stuck_in_init_trips_the_watchdog_and_a_clear_port_points_elsewhere(tmp_path: Path) -> None:
    def script(b: ScriptedBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b")] + [phase(h, i, 0, p) for h in "ab" for i in (0, 1)
                                                       for p in ("started", "init")] + [phase("a", 0, 0, "joined")])
        until_stopped(b, emit)

    clear = ProbeResults([ProbeOutcome("b", "a", "198.18.0.1", 29555, "master_port", True, "ok"),
                          ProbeOutcome("a", "b", "198.18.0.2", 40001, "ephemeral", True, "ok")])
    backend = ScriptedBackend(script, probes=clear)
    result, _out, _ = launch(script, tmp_path, join_timeout=0.5, backend=backend)
    assert result.exit_code == 1 and result.cause is not None
    assert "init_process_group" in result.cause and "a: 1 of 2 rank(s) returned" in result.cause
    assert "answer from every host, so the block is elsewhere" in result.cause


def test_the_watchdog_names_ports_between_the_hosts_that_a_firewall_drops(tmp_path: Path) -> None:
    def script(b: ScriptedBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b")] + [phase(h, i, 0, p) for h in "ab" for i in (0, 1)
                                                       for p in ("started", "init")])
        until_stopped(b, emit)

    mesh = ProbeResults([ProbeOutcome("b", "a", "198.18.0.1", 29555, "master_port", True, "ok"),
                         ProbeOutcome("a", "b", "198.18.0.2", 40001, "ephemeral", False, "timeout", "timed out")],
                        errors={"c": "no answer"})
    result, _out, _ = launch(script, tmp_path, join_timeout=0.5, backend=ScriptedBackend(script, probes=mesh))
    assert result.cause is not None
    assert "TCP on ephemeral ports (NCCL/Gloo) 40001 is blocked between b and a" in result.cause
    assert "a -> b 198.18.0.2:40001: timeout" in result.cause
    assert "c: could not re-probe: no answer" in result.cause


def test_the_root_cause_is_the_first_rank_error_in_time_not_the_first_host_to_exit(tmp_path: Path) -> None:
    crash = RankError(1, "boom", "Traceback ...\nValueError: boom", 100.0, None, rank=3, kind="ValueError")
    echo = RankError(0, "Connection closed by peer [198.18.0.2]:1234", "tb", 100.05, None, rank=0, kind="RuntimeError")
    early_echo = RankError(1, "Connection reset by peer", "tb", 99.99, None, rank=1, kind="RuntimeError")

    def script(b: ScriptedBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b"), phase("a", 0, 0, "error", 100.05, echo), Exited("a", 1)])
        b.stopped.wait(20)
        emit_all(emit, [Reported("b", SuperviseResult(1, None, crash, None, None, None, (crash,))),
                        Reported("a", SuperviseResult(1, None, echo, None, None, None, (early_echo, echo))),
                        Exited("b", 1)])

    result, _out, _ = launch(script, tmp_path)
    assert result.root_cause is not None
    assert (result.root_cause.host, result.root_cause.error.rank) == ("b", 3)
    assert result.first_failure is not None and result.first_failure.host == "b"
    assert json.loads((result.run_dir / "summary.json").read_text())["root_cause"]["error"]["kind"] == "ValueError"


def test_a_global_rank_counts_the_processes_of_the_nodes_before_even_when_they_differ(tmp_path: Path) -> None:
    runs = [HostRun("a", 0, "a"), HostRun("b", 1, "b"), HostRun("c", 2, "c")]
    result = RunResult(job_id="t-1", run_dir=tmp_path, hosts=runs, exit_code=1, first_failure=None,
                       nprocs={"a": 2, "b": 1, "c": 4})
    assert [result.global_rank(r, 0) for r in runs] == [0, 2, 3]
    assert result.global_rank(runs[2], 3) == 6 and result.global_rank(runs[1], "x") is None
