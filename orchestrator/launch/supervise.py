"""Supervises a started job from its backend's events: output per host and rank, fail fast, lost
hosts, hangs, Ctrl-C; keeps the logs and writes summary.json. Knows nothing of SSH or Slurm."""

from __future__ import annotations

import contextlib
import json
import queue
import re
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO

from orchestrator.launch.backends.base import LOST_AFTER, Backend
from orchestrator.launch.events import (
    Alive,
    BackendEvent,
    Exited,
    Lost,
    Milestone,
    Notice,
    Output,
    Problem,
    Reported,
    Started,
)
from orchestrator.launch.observer import Observer
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.plan import HostLaunch, LaunchPlan
from orchestrator.launch.result import HostRun, HostState, RankFailure, RunResult, root_cause, write_summary
from orchestrator.launch.watchdog import RendezvousWatch
from orchestrator.remote.wire import RankError

CHECK_EVERY = 0.5  # how often silent hosts and hangs are looked for
TORCHRUN_PREFIX = re.compile(r"^\[(?P<role>[A-Za-z_]*?)(?P<local>\d+)\]:(?P<text>.*)$")


def split_rank(launch: HostLaunch, text: str, c10d: bool,
               known: Mapping[tuple[str, int], int] | None = None) -> tuple[str | None, str]:
    """torchrun --tee prefixes worker lines with [role<local rank>]:; map that to a global rank:
    from the node rank (static), or as the rank reported it (c10d assigns node ranks itself)."""
    m = TORCHRUN_PREFIX.match(text)
    if not m:
        return None, text
    local = int(m.group("local"))
    if not c10d:
        return str(launch.rank_of(local)), m.group("text")
    rank = (known or {}).get((launch.host.name, local))
    return (f"local{local}" if rank is None else str(rank)), m.group("text")


@contextlib.contextmanager
def interrupts_ignored() -> Iterator[None]:
    """SIGINT ignored for the block (main thread only; elsewhere there is no signal to mind)."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class Supervision:
    """The state of one running job; `run()` returns its RunResult."""

    def __init__(self, plan: LaunchPlan, backend: Backend, observer: Observer, run_dir: Path,
                 options: LaunchOptions) -> None:
        self.plan = plan
        self.backend = backend
        self.cb = observer
        self.run_dir = run_dir
        self.options = options
        self.events: queue.Queue[BackendEvent] = queue.Queue()
        self.runs = {hl.host.name: HostRun(hl.host.name, hl.node_rank, hl.display()) for hl in plan.hosts}
        self.last_seen: dict[str, float] = {}
        self.last_output = time.monotonic()
        self.logs: dict[str, IO[str]] = {}
        self.first_failure: HostRun | None = None
        self.stop_sent = False
        self.hang_dumped = False
        self.hung = False
        self.c10d = plan.job.rendezvous.backend == "c10d" or plan.job.slurm is not None
        self.failures: list[RankFailure] = []  # every rank error, as it is reported
        timeout = options.join_timeout if options.join_timeout is not None else plan.job.rendezvous.join_timeout
        self.rendezvous = RendezvousWatch(plan, timeout) if timeout and all(hl.wrapped for hl in plan.hosts) else None
        self.cause: str | None = None  # what the watchdog diagnosed
        self.global_ranks: dict[tuple[str, int], int] = {}  # (host, local rank) -> rank, as the ranks said

    # -- control ----------------------------------------------------------------------------
    def stop_all(self, force: bool, reason: str) -> None:
        self.stop_sent = True
        self.cb.on_notice(reason)
        running = [name for name, run in self.runs.items() if not run.done]
        for name in running:
            self.runs[name].state = HostState.STOPPING
            self.cb.on_state(self.runs[name])
        self.backend.stop(running, force)

    def _fail(self, run: HostRun, why: str) -> None:
        if self.first_failure is None:
            self.first_failure = run
            if not self.stop_sent:
                self.stop_all(False, f"{run.host} failed ({why}); stopping the job on every host")

    # -- events -----------------------------------------------------------------------------
    def handle(self, event: BackendEvent) -> None:
        run = self.runs[event.host]
        self.last_seen[event.host] = time.monotonic()
        if isinstance(event, Output):
            self._output(run, event.text)
        elif isinstance(event, Started):
            run.state, run.started_at, run.remote_log = HostState.RUNNING, time.time(), event.log
            run.hostname = event.hostname or run.hostname
            self.cb.on_state(run)
            if self.rendezvous is not None:
                self.rendezvous.started(event.host)
        elif isinstance(event, Notice):
            self.cb.on_notice(event.text)
        elif isinstance(event, Milestone):
            if event.phase.local_rank is not None and event.phase.rank is not None:
                self.global_ranks[(event.host, event.phase.local_rank)] = event.phase.rank
            if self.rendezvous is not None:
                self.rendezvous.saw(event.host, event.phase)
            if event.phase.error is not None:
                self._rank_failed(run, event.phase.error)
                # fail fast: the other hosts are told now, not when this one's torchrun has exited
                rank = event.phase.rank if event.phase.rank is not None else f"local {event.phase.local_rank}"
                self._fail(run, f"rank {rank} raised {event.phase.error.kind or 'an error'}")
        elif isinstance(event, Reported):
            run.stop_reason, run.first_error, run.nccl = (event.result.stop_reason, event.result.first_error,
                                                          event.result.nccl)
            run.error = event.result.error or run.error
            for error in event.result.rank_errors:
                self._rank_failed(run, error)
        elif isinstance(event, Problem):
            run.error = event.message
        elif isinstance(event, Lost):
            self._mark_lost(run, event.reason)
        elif isinstance(event, Exited):
            self._exited(run, event.exit_code)
        elif not isinstance(event, Alive):
            raise TypeError(f"unknown backend event {event!r}")

    def _output(self, run: HostRun, text: str) -> None:
        self.last_output = time.monotonic()
        rank, shown = split_rank(self.plan.hosts[run.node_rank], text, self.c10d, self.global_ranks)
        self.logs[run.host].write(text + "\n")
        run.tail = [*run.tail[-29:], text]
        self.cb.on_line(run.host, rank, shown)

    def _rank_failed(self, run: HostRun, error: RankError) -> None:
        """Keep each rank's error once (live from its milestone, again in the closing report)."""
        key = (run.host, error.local_rank, error.timestamp)
        if all((f.host, f.error.local_rank, f.error.timestamp) != key for f in self.failures):
            self.failures.append(RankFailure(run.host, run.node_rank, error))

    def _mark_lost(self, run: HostRun, why: str) -> None:
        if run.done:
            return
        run.state, run.error, run.ended_at = HostState.LOST, why, time.time()
        self.cb.on_state(run)
        self.backend.drop(run.host)  # its node ends the job when it stops hearing from us
        self._fail(run, why)

    def _exited(self, run: HostRun, code: int | None) -> None:
        if run.done:
            return
        if code is None:
            self._mark_lost(run, "the connection closed without an exit status")
            return
        run.exit_code, run.ended_at = code, time.time()
        run.state = HostState.EXITED if code == 0 else HostState.FAILED
        self.cb.on_state(run)
        if code != 0 and not self.stop_sent:
            self._fail(run, f"exit code {code}")

    # -- timers -----------------------------------------------------------------------------
    def _check_silence(self) -> None:
        now = time.monotonic()
        for name, run in self.runs.items():
            silent = now - self.last_seen.get(name, now)
            if run.state in (HostState.RUNNING, HostState.STOPPING) and silent > LOST_AFTER:
                self._mark_lost(run, f"no word from {name} for {LOST_AFTER:.0f}s (host down or link lost)")

    def _check_hang(self) -> None:
        timeout = self.options.hang_timeout
        if not timeout or self.hang_dumped or self.stop_sent:
            return
        if time.monotonic() - self.last_output < timeout:
            return
        self.hang_dumped = self.hung = True
        self.cb.on_notice(f"no rank printed anything for {timeout:.0f}s: the job looks hung")
        if self.options.dump_stacks_on_hang:
            self.dump_stacks("hang")
        if self.options.on_hang == "stop":
            self.stop_all(False, "stopping the hung job on every host (--on-hang=stop)")

    def _check_rendezvous(self) -> None:
        """The watchdog: ranks that have not all joined within the bound are a rendezvous that
        will not complete. Re-probe the network as doctor does, say why, stop the job."""
        rdzv = self.rendezvous
        if rdzv is None or self.stop_sent or not rdzv.overdue(time.monotonic()):
            return
        self.cb.on_notice(f"the ranks have not all joined {rdzv.timeout:.0f}s after torchrun started "
                          "on every host: re-probing the master port and the ports between the hosts")
        probes = self.backend.reprobe(self.plan)
        self.cause = rdzv.diagnose(probes, {name: run.tail for name, run in self.runs.items()})
        self.stop_all(False, "the rendezvous will not complete: stopping the job on every host (the cause "
                             "is in the summary)")

    def dump_stacks(self, why: str) -> None:
        """Every rank's stack into the run directory, and the collapsed summary to the user."""
        from orchestrator.hostops.stacks import report_json, report_text

        report = self.backend.stacks(self.plan)
        stamp = time.strftime("%H%M%S")
        (self.run_dir / f"stacks-{why}-{stamp}.json").write_text(json.dumps(report_json(report), indent=2))
        text = report_text(report)
        (self.run_dir / f"stacks-{why}-{stamp}.txt").write_text("\n".join(text) + "\n")
        self.cb.on_notice(f"stacks of every rank ({why}), saved in {self.run_dir}:\n  " + "\n  ".join(text))

    # -- main loop --------------------------------------------------------------------------
    def run(self) -> RunResult:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logs = {name: (self.run_dir / f"{name}.log").open("a", buffering=1) for name in self.runs}
        for run in self.runs.values():
            self.cb.on_state(run)
        interrupts = 0
        try:
            self.backend.start(self.plan, self.options, self.events.put)
            next_check = time.monotonic() + CHECK_EVERY
            while True:
                try:  # the whole iteration: a Ctrl-C may land anywhere in it
                    if all(r.done for r in self.runs.values()):
                        break
                    with contextlib.suppress(queue.Empty):
                        self.handle(self.events.get(timeout=CHECK_EVERY))
                    if time.monotonic() >= next_check:  # on a timer: busy hosts must not starve it
                        next_check = time.monotonic() + CHECK_EVERY
                        self._check_silence()
                        self._check_rendezvous()
                        self._check_hang()
                except KeyboardInterrupt:
                    interrupts += 1
                    if interrupts == 1 and self.options.dump_on_interrupt:
                        self.dump_stacks("interrupt")
                    if interrupts == 1:
                        self.stop_all(False, "interrupted: stopping the job on every host (Ctrl-C again to force)")
                    else:
                        self.stop_all(True, "interrupted again: killing the job on every host")
        finally:
            with interrupts_ignored():  # the job is over: a late Ctrl-C must not lose its summary
                self.backend.close()
                for f in self.logs.values():
                    f.close()
        with interrupts_ignored():
            return self._result(interrupted=interrupts > 0)

    def _result(self, interrupted: bool) -> RunResult:
        runs = list(self.runs.values())
        ok = all(r.exit_code == 0 for r in runs) and not interrupted and not self.hung and not self.cause
        code = 0 if ok else (130 if interrupted else 1)
        if len(runs) == 1 and runs[0].exit_code not in (None, 0) and not interrupted and not self.cause:
            code = runs[0].exit_code or 1  # a single host: torchrun's own exit code
        root = root_cause(self.failures)
        first = self.runs[root.host] if root is not None and not ok else self.first_failure
        result = RunResult(self.plan.job_id, self.run_dir, runs, code, first, interrupted,
                           {hl.host.name: hl.nproc for hl in self.plan.hosts}, self.hung,
                           root if not ok else None, self.cause)
        write_summary(self.plan, result)
        return result
