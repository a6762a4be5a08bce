"""Supervises a started job from its backend's events: output per host and rank, fail fast, hosts
that go silent (re-attached) or are lost (orchestrator/launch/faults.py), hangs, Ctrl-C and the
signals that end `up`; keeps the logs and writes summary.json. Knows nothing of SSH or Slurm."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from orchestrator.hostops.stacks import StacksReport, report_json, report_text
from orchestrator.launch.backends.base import Backend
from orchestrator.launch.events import (
    Alive,
    BackendEvent,
    Ended,
    Exited,
    Lost,
    Milestone,
    Notice,
    Output,
    Problem,
    Reattached,
    Reported,
    Sampled,
    Started,
)
from orchestrator.launch.faults import Link, LinkState, judge, limits_for
from orchestrator.launch.labels import RankLines, labels_for
from orchestrator.launch.lanes import Lanes
from orchestrator.launch.observer import Observer
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.plan import LaunchPlan
from orchestrator.launch.result import (
    HostLoss,
    HostRun,
    HostState,
    RankFailure,
    RunResult,
    clock,
    root_cause,
    write_summary,
)
from orchestrator.launch.signals import STOP_SIGNALS, StopSignal, interrupts_ignored, stop_signals_raise
from orchestrator.launch.watchdog import RendezvousWatch
from orchestrator.remote.wire import RankError
from orchestrator.watch.monitor import Finding, Watch
from orchestrator.watch.report import build_report, write_report

CHECK_EVERY = 0.5  # how often silent hosts and hangs are looked for
NODE_GAVE_UP = ("no heartbeat from the control plane", "control connection lost")


class Supervision:
    """The state of one running job; `run()` returns its RunResult."""

    def __init__(self, plan: LaunchPlan, backend: Backend, observer: Observer, run_dir: Path,
                 options: LaunchOptions) -> None:
        self.plan = plan
        self.backend = backend
        self.cb = observer
        self.run_dir = run_dir
        self.options = options
        self.limits = limits_for(plan.job.lost_after, options.lost_after)
        self.lanes = Lanes()
        self.runs = {hl.host.name: HostRun(hl.host.name, hl.node_rank, hl.display()) for hl in plan.hosts}
        self.links = {name: Link(name) for name in self.runs}
        self.heard: dict[str, float] = {}  # host -> time.monotonic() it was last heard from
        self.waiting: dict[str, int] = {}  # host -> its readers held up by our own backlog
        self.counting = threading.Lock()  # a re-attached host's old and new reader may both wait
        self.deaf: dict[str, float] = {}  # host -> seconds it says it has not heard us
        self.last_output = time.monotonic()
        self.logs: dict[str, IO[str]] = {}
        self.first_failure: HostRun | None = None
        self.losses: list[HostLoss] = []
        self.stop_sent = False
        self.stopped_by_consequence = False  # the stop came from a rank that lost a peer: a loss
        # found after it may still be its cause
        self.hang_dumped = False
        self.hung = False
        self.c10d = plan.job.rendezvous.backend == "c10d" or plan.job.slurm is not None
        self.failures: list[RankFailure] = []  # every rank error, as it is reported
        timeout = options.join_timeout if options.join_timeout is not None else plan.job.rendezvous.join_timeout
        self.rendezvous = RendezvousWatch(plan, timeout) if timeout and all(hl.wrapped for hl in plan.hosts) else None
        self.cause: str | None = None  # what the watchdog diagnosed
        self.ended_by: str | None = None  # the scheduler's own reason for ending the job (Slurm's words)
        self.global_ranks: dict[tuple[str, int], int] = {}  # (host, local rank) -> rank, as the ranks said
        self.addresses = {hl.host.name: hl.host.address for hl in plan.hosts}
        self.steps: dict[tuple[str, int | None], int] = {}  # (host, local rank) -> optimizer steps
        self.checkpointed = False  # a host saw a newer file in [restart] checkpoint_dir
        self.watch = Watch(plan.job.watch)  # progress, stragglers, stalls: orchestrator/watch/

    # -- from the backend's threads ---------------------------------------------------------
    def emit(self, event: BackendEvent) -> None:
        """A backend event, from any thread: contact is recorded as it arrives (not when it is
        handled), and a reader waiting for room in the output lane is not a silent host."""
        host = event.host
        self.heard[host] = time.monotonic()
        if isinstance(event, Alive) and event.heard_s is not None:
            self.deaf[host] = float(event.heard_s)
        if isinstance(event, Output):
            with self.counting:
                self.waiting[host] = self.waiting.get(host, 0) + 1
            try:
                self.lanes.put(event)
            finally:
                with self.counting:
                    self.waiting[host] -= 1
                self.heard[host] = time.monotonic()
        else:
            self.lanes.put(event)

    # -- control ----------------------------------------------------------------------------
    def stop_all(self, force: bool, reason: str, failed: bool = False) -> None:
        """`failed`: the job has failed (a host, the rendezvous, a hang), not stopped by the user."""
        self.stop_sent = True
        self.cb.on_notice(reason)
        running = [name for name, run in self.runs.items() if not run.done]
        for name in running:
            self.runs[name].state = HostState.STOPPING
            self.cb.on_state(self.runs[name])
        self.backend.stop(running, force, failed)

    def _fail(self, run: HostRun, why: str, what: str = "failed", consequence: bool = False) -> None:
        if self.ended_by is not None:
            return  # the scheduler ended the job: what fails now died of it
        if self.first_failure is None:
            self.first_failure = run
            if not self.stop_sent:
                self.stopped_by_consequence = consequence
                self.stop_all(False, f"{run.host} {what} ({why}); stopping the job on every host", failed=True)

    # -- events -----------------------------------------------------------------------------
    def handle(self, event: BackendEvent) -> None:
        run = self.runs[event.host]
        if isinstance(event, Output):
            self._output(run, event.lines)
        elif isinstance(event, Started):
            run.state, run.started_at, run.remote_log = HostState.RUNNING, time.time(), event.log
            run.hostname = event.hostname or run.hostname
            self.cb.on_state(run)
            if self.rendezvous is not None:
                self.rendezvous.started(event.host)
        elif isinstance(event, Notice):
            self.cb.on_notice(event.text)
        elif isinstance(event, Milestone):
            self._milestone(run, event)
        elif isinstance(event, Reported):
            self._reported(run, event)
        elif isinstance(event, Problem):
            run.error = event.message
        elif isinstance(event, Lost):
            self._mark_lost(run, event.reason)
        elif isinstance(event, Ended):
            self._ended(run, event)
        elif isinstance(event, Exited):
            self._exited(run, event.exit_code)
        elif isinstance(event, Reattached):
            self._reattached(run)
        elif isinstance(event, Sampled):
            for finding in self.watch.on_sample(event.host, event.sample):
                self.cb.on_notice(finding.text)
        elif not isinstance(event, Alive):
            raise TypeError(f"unknown backend event {event!r}")

    def _output(self, run: HostRun, lines: Sequence[str]) -> None:
        self.last_output = time.monotonic()
        log = self.logs[run.host]
        log.write("\n".join(lines) + "\n")
        log.flush()  # a batch at a time: the file is current even if `up` is killed
        run.tail = [*run.tail, *lines[-30:]][-30:]
        labels = labels_for(self.plan.hosts[run.node_rank], self.c10d, self.global_ranks)
        self.cb.on_lines(run.host, RankLines(lines, labels))

    def _milestone(self, run: HostRun, event: Milestone) -> None:
        if event.phase.local_rank is not None and event.phase.rank is not None:
            self.global_ranks[(event.host, event.phase.local_rank)] = event.phase.rank
        if event.phase.step is not None:
            key = (event.host, event.phase.local_rank)
            self.steps[key] = max(self.steps.get(key, 0), event.phase.step)
            self.watch.on_step(event.host, event.phase)
        if self.rendezvous is not None:
            self.rendezvous.saw(event.host, event.phase)
        if event.phase.error is not None:
            failure = self._rank_failed(run, event.phase.error)
            consequence = failure is not None and failure.consequence
            if consequence and failure is not None:
                self._blame_silent(failure)
            # fail fast: the other hosts are told now, not when this one's torchrun has exited
            rank = event.phase.rank if event.phase.rank is not None else f"local {event.phase.local_rank}"
            self._fail(run, f"rank {rank} raised {event.phase.error.kind or 'an error'}", consequence=consequence)

    def _reported(self, run: HostRun, event: Reported) -> None:
        result = event.result
        run.stop_reason, run.first_error, run.nccl = result.stop_reason, result.first_error, result.nccl
        run.error = result.error or run.error
        if result.steps is not None:
            self.steps[(run.host, None)] = max(self.steps.get((run.host, None), 0), result.steps)
        self.checkpointed = self.checkpointed or result.checkpointed
        for error in result.rank_errors:
            self._rank_failed(run, error)
        reason = result.stop_reason or ""
        if reason.startswith(NODE_GAVE_UP) and not self.stop_sent:  # it stopped for lack of us
            self._lose(run, f"{run.host} stopped its job on its own: {reason}")

    def _rank_failed(self, run: HostRun, error: RankError) -> RankFailure | None:
        """Keep each rank's error once (live from its milestone, again in the closing report)."""
        key = (run.host, error.local_rank, error.timestamp)
        if any((f.host, f.error.local_rank, f.error.timestamp) == key for f in self.failures):
            return None
        failure = RankFailure(run.host, run.node_rank, error)
        self.failures.append(failure)
        return failure

    def _blame_silent(self, failure: RankFailure) -> None:
        """A rank lost its connection to a peer while a host is silent: that host is gone. Lost
        at once (the one the error names, or the only silent one), before the victim is blamed."""
        silent = [name for name, link in self.links.items()
                  if link.state is LinkState.SILENT and not self.runs[name].done]
        text = f"{failure.error.message} {failure.error.traceback[-2000:]}"
        named = [name for name in silent if self.addresses.get(name) and self.addresses[name] in text]
        for name in named or (silent if len(silent) == 1 else []):
            since = clock(self.links[name].since)
            self._mark_lost(self.runs[name], f"no contact with {name} since {since}, and the ranks on "
                            f"{failure.host} lost their connections to it: host down or network cut")

    def _lose(self, run: HostRun, why: str) -> None:
        """A loss is the cause unless the job was stopped already for another reason (a failure
        that is not a lost peer, Ctrl-C, a signal, a hang): hosts lost while it stops are news,
        not the cause."""
        if self.stop_sent and not self.stopped_by_consequence:
            return
        self.losses.append(HostLoss(run.host, why, time.time()))
        self._fail(run, why, "lost")

    def _mark_lost(self, run: HostRun, why: str) -> None:
        if run.done:
            return
        run.state, run.error, run.ended_at = HostState.LOST, why, time.time()
        self.links[run.host].enter(LinkState.LOST)
        self.watch.host_lost(run.host, why)
        self.cb.on_state(run)
        self.backend.drop(run.host)  # its node ends the job when it stops hearing from us
        self._lose(run, why)

    def _ended(self, run: HostRun, event: Ended) -> None:
        """The scheduler ends the job for a reason of its own: its words are the cause, no rank is
        blamed (the ranks die of it), and there is nothing for us to stop. A node it names as
        failed is lost."""
        if self.ended_by is None:
            self.ended_by = event.cause
            if not event.lost:  # a lost node's state line says it
                self.cb.on_notice(event.cause)
        self.stop_sent = True
        self.stopped_by_consequence = False
        if event.lost and not run.done:
            run.state, run.error, run.ended_at = HostState.LOST, event.cause, time.time()
            self.links[run.host].enter(LinkState.LOST)
            self.watch.host_lost(run.host, event.cause)
            self.losses.append(HostLoss(run.host, event.cause, time.time()))
            self.cb.on_state(run)

    def _exited(self, run: HostRun, code: int | None) -> None:
        if run.done:
            return
        if code is None:
            self._mark_lost(run, f"connection to {run.host} lost: host or sshd died (it closed without an "
                                 "exit status)")
            return
        run.exit_code, run.ended_at = code, time.time()
        if code == 0:
            run.state = HostState.EXITED
        elif self.stop_sent and run is not self.first_failure:
            run.state = HostState.STOPPED
        else:
            run.state = HostState.FAILED
        self.cb.on_state(run)
        if code != 0 and not self.stop_sent:
            self._fail(run, f"exit code {code}" + (f": {run.stop_reason}" if run.stop_reason else ""))

    def _reattached(self, run: HostRun) -> None:
        if run.done:
            return  # lost (or over) already: a late re-attach changes nothing
        link = self.links[run.host]
        if link.state is LinkState.SILENT:
            self.cb.on_notice(f"{run.host} back after {time.time() - link.since:.0f}s: re-attached on a fresh "
                              "connection; its output resumes where it stopped")
        link.enter(LinkState.REATTACHED)
        self.deaf.pop(run.host, None)

    # -- timers -----------------------------------------------------------------------------
    def _check_links(self) -> None:
        """The fault model (orchestrator/launch/faults.py), applied to every running host."""
        now = time.monotonic()
        for name, run in self.runs.items():
            if run.state not in (HostState.RUNNING, HostState.STOPPING):
                continue
            quiet = 0.0 if self.waiting.get(name) else now - self.heard.get(name, now)
            quiet = max(quiet, self.deaf.get(name, 0.0))
            link = self.links[name]
            state = judge(link, quiet, self.limits)
            if state is LinkState.SILENT:
                link.enter(LinkState.SILENT, at=time.time() - quiet)
                self.cb.on_notice(f"lost contact with {name} at {clock(link.since)} ({quiet:.0f}s without a "
                                  f"word): the job runs on; reaching {name} on a fresh connection (it is lost "
                                  f"after {self.limits.lost_after:.0f}s)")
                self.backend.reattach(name)
            elif state is LinkState.CONNECTED:
                self.cb.on_notice(f"{name} back after {time.time() - link.since:.0f}s")
                link.enter(LinkState.CONNECTED)
            elif state is LinkState.LOST:
                self._mark_lost(run, f"no contact with {name} for {self.limits.lost_after:.0f}s (since "
                                     f"{clock(time.time() - quiet)}): host down or network cut")

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
            self.stop_all(False, "stopping the hung job on every host (--on-hang=stop)", failed=True)

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
                             "is in the summary)", failed=True)

    def _check_progress(self) -> None:
        """orchestrator/watch/ on the timer: its findings said once, the progress shown, and a stall
        (no rank stepped for max([watch] hang_after, 5 x the p95 step time)) looked into: every
        rank's flight records and stack name the collective the job waits in, and the rank that
        never entered it. Reported; the job runs on unless --on-hang=stop."""
        for finding in self.watch.check():
            self.cb.on_notice(finding.text)
        status = self.watch.status()
        if status is not None:
            self.cb.on_progress(status)
        if self.stop_sent or any(link.state is LinkState.SILENT for link in self.links.values()):
            return  # a host we cannot hear from sends no steps: not the job's stall
        quiet = self.watch.stalled()
        if quiet is None:
            return
        self.cb.on_notice(f"no rank has taken an optimizer step for {quiet:.0f}s (limit "
                          f"{self.watch.stall_limit():.0f}s): asking every rank where it is")
        report = self.dump_stacks("hang")
        verdict = report.verdict
        if verdict is not None and (verdict.missing or verdict.seq is not None):
            finding = Finding("hang", f"hang: the job waits in {verdict.text}", time.time(),
                              verdict.missing[0] if verdict.missing else None)
        else:
            where = report.groups[0].summary() if report.groups else "no stack"
            finding = Finding("no progress", f"no progress: no optimizer step for {quiet:.0f}s and no collective "
                              f"is pending (the ranks are busy elsewhere: {where})", time.time())
        self.watch.add(finding)
        self.cb.on_notice(finding.text)
        if self.options.on_hang == "stop":
            self.hang_dumped = self.hung = True
            self.stop_all(False, "stopping the hung job on every host (--on-hang=stop)", failed=True)

    def dump_stacks(self, why: str) -> StacksReport:
        """Every rank's stack into the run directory, and the collapsed summary to the user."""
        report = self.backend.stacks(self.plan)
        stamp = time.strftime("%H%M%S")
        (self.run_dir / f"stacks-{why}-{stamp}.json").write_text(json.dumps(report_json(report), indent=2))
        text = report_text(report)
        (self.run_dir / f"stacks-{why}-{stamp}.txt").write_text("\n".join(text) + "\n")
        self.cb.on_notice(f"stacks of every rank ({why}), saved in {self.run_dir}:\n  " + "\n  ".join(text))
        return report

    # -- main loop --------------------------------------------------------------------------
    def run(self) -> RunResult:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logs = {name: (self.run_dir / f"{name}.log").open("a") for name in self.runs}
        for run in self.runs.values():
            self.cb.on_state(run)
        stops: list[int] = []
        try:
            with stop_signals_raise():
                try:
                    self.backend.start(self.plan, self.options, self.emit)
                except KeyboardInterrupt as exc:  # a signal while the hosts start: stop what started
                    self._interrupted(exc, stops)
                self._loop(stops)
        finally:
            with interrupts_ignored():  # the job is over: a late Ctrl-C must not lose its summary
                self.backend.close()
                for f in self.logs.values():
                    f.close()
        with interrupts_ignored():
            return self._result(stops[0] if stops else None)

    def _loop(self, stops: list[int]) -> None:
        next_check = time.monotonic() + CHECK_EVERY
        while True:
            try:  # the whole iteration: a Ctrl-C may land anywhere in it
                if all(r.done for r in self.runs.values()) and self.lanes.empty():
                    return
                event = self.lanes.get(CHECK_EVERY)
                if event is not None:
                    self.handle(event)
                if time.monotonic() >= next_check:  # on a timer: busy hosts must not starve it
                    next_check = time.monotonic() + CHECK_EVERY
                    self._check_links()
                    self._check_rendezvous()
                    self._check_hang()
                    self._check_progress()
            except KeyboardInterrupt as exc:
                self._interrupted(exc, stops)

    def _interrupted(self, exc: KeyboardInterrupt, stops: list[int]) -> None:
        signum = exc.signum if isinstance(exc, StopSignal) else int(signal.SIGINT)
        stops.append(signum)
        if len(stops) > 1:
            self.stop_all(True, "interrupted again: killing the job on every host")
            return
        if signum == signal.SIGINT and self.options.dump_on_interrupt:
            self.dump_stacks("interrupt")
        if signum == signal.SIGINT:
            self.stop_all(False, "interrupted: stopping the job on every host (Ctrl-C again to force)")
        else:
            self.stop_all(False, f"got {STOP_SIGNALS[signal.Signals(signum)]}: stopping the job on every "
                                 f"host, as Ctrl-C does; `up` exits {128 + signum}")

    def _result(self, signum: int | None) -> RunResult:
        runs = list(self.runs.values())
        interrupted = signum is not None
        ok = all(r.exit_code == 0 for r in runs) and not interrupted and not self.hung and not self.cause \
            and not self.ended_by
        code = 0 if ok else (128 + signum if signum is not None else 1)
        if len(runs) == 1 and runs[0].exit_code not in (None, 0) and not interrupted and not self.cause \
                and not self.ended_by:
            code = runs[0].exit_code or 1  # a single host: torchrun's own exit code
        root = root_cause(self.failures) if not ok and not self.ended_by else None  # the ranks are victims
        loss = self.losses[0] if self.losses and not ok else None
        if loss is not None and root is not None and not root.consequence and \
                (root.error.timestamp is None or root.error.timestamp < loss.at):
            loss = None  # a rank's own error came first (or may have): the loss followed from it
        first = self.runs[loss.host] if loss is not None else \
            self.runs[root.host] if root is not None else self.first_failure
        result = RunResult(self.plan.job_id, self.run_dir, runs, code, first, interrupted,
                           {hl.host.name: hl.nproc for hl in self.plan.hosts}, self.hung,
                           root, self.cause, loss, signum, self.ended_by,
                           max(self.steps.values()) if self.steps else None, self.checkpointed,
                           [f.to_json(self.watch.started) for f in self.watch.findings])
        write_summary(self.plan, result)
        try:
            write_report(self.run_dir, build_report(self.plan, result, self.watch))
        except (OSError, ValueError, TypeError) as exc:  # the run's outcome stands without its page
            self.cb.on_notice(f"the run's report was not written: {exc}")
        return result
