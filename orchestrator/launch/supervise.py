"""The supervision core: turns a started job's backend events into host states through the fault
model (orchestrator/launch/faults.py), keeps the logs, fails fast, stops the job when asked (a
failure, a monitor, a signal) and writes summary.json. Monitors (orchestrator/launch/monitor_api.py)
plug into it; it imports none, and knows nothing of SSH or Slurm."""

from __future__ import annotations

import getpass
import json
import signal
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from node_agent.wire.layout import STOPPED_BY_DOWN, STOPPED_BY_SIGNAL
from orchestrator.account import events as ev
from orchestrator.account.events import EventLog
from orchestrator.hostops.stacks import StacksReport, report_json, report_text
from orchestrator.launch.backends.base import Backend
from orchestrator.launch.events import (
    Alive,
    BackendEvent,
    Checkpointed,
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
    Scheduled,
    Started,
)
from orchestrator.launch.faults import Link, LinkState, limits_for
from orchestrator.launch.hosts import Hosts, LinkMove
from orchestrator.launch.labels import RankLines, labels_for
from orchestrator.launch.lanes import Lanes
from orchestrator.launch.monitor_api import HostLost, Monitor
from orchestrator.launch.monitor_runner import CoreHands, Monitors
from orchestrator.launch.observer import Observer
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.outcome import outcome
from orchestrator.launch.plan import LaunchPlan
from orchestrator.launch.record import Record
from orchestrator.launch.result import HostLoss, HostRun, RankFailure, RunResult, RunState, clock, write_summary
from orchestrator.launch.signals import STOP_SIGNALS, StopSignal, interrupts_ignored, stop_signals_raise
from orchestrator.launch.timeline import AttemptTimeline, outcome_of

CHECK_EVERY = 0.5  # the timer: silent hosts judged, monitors ticked
NODE_GAVE_UP = ("no heartbeat from the control plane", "control connection lost")


class Supervision:
    """One running job; `run()` returns its RunResult. Monitors see it as their JobView."""

    def __init__(self, plan: LaunchPlan, backend: Backend, observer: Observer, run_dir: Path,
                 options: LaunchOptions, monitors: Sequence[Monitor] = (), events: EventLog | None = None) -> None:
        self.plan = plan
        self.backend = backend
        self.observer = observer
        self.run_dir = run_dir
        self.options = options
        self.started = time.time()
        self.lanes = Lanes()
        self.hosts = Hosts(plan, limits_for(plan.job.lost_after, options.lost_after))
        self.record = Record()
        self.logs: dict[str, IO[str]] = {}
        self.stopping = False
        self.stop_was_consequence = False  # the stop came from a rank that lost a peer: a loss found
        # after it may still be its cause
        self.ranks_numbered_at_rendezvous = plan.job.rendezvous.backend == "c10d" or plan.job.slurm is not None
        self.global_ranks: dict[tuple[str, int], int] = {}  # (host, local rank) -> rank, as the ranks said
        self.timeline = AttemptTimeline(plan, events or EventLog(options.runs_dir / (plan.run_id or plan.job_id)))
        self.monitors = Monitors(monitors, self, CoreHands(observer, self.record, self._stop_failed,
                                                           self.dump_stacks, lambda: backend.reprobe(plan),
                                                           lambda host, rank, on: backend.flag(host, rank, on)))

    @property
    def runs(self) -> Mapping[str, HostRun]:
        return self.hosts.runs

    @property
    def links(self) -> Mapping[str, Link]:
        return self.hosts.links

    # -- from the backend's threads ---------------------------------------------------------
    def emit(self, event: BackendEvent) -> None:
        """A backend event, from any thread: contact is recorded as it arrives (not when it is
        handled), and a reader waiting for room in the output lane is not a silent host."""
        self.hosts.contact.heard(event)
        if isinstance(event, Output):
            with self.hosts.contact.reader_blocked(event.host):
                self.lanes.put(event)
        else:
            self.lanes.put(event)

    # -- stopping ---------------------------------------------------------------------------
    def stop_all(self, force: bool, reason: str, failed: bool = False) -> None:
        """`failed`: the job has failed (a host, a monitor's judgement), not stopped by the user."""
        self.stopping = True
        self.hosts.stop_asked(time.monotonic(), self.hosts.limits.stop_bound(0.0 if force else self.options.grace))
        self.observer.on_notice(reason)
        unfinished = self.hosts.unfinished()
        for name in unfinished:
            self.hosts.runs[name].state = RunState.STOPPING
            self.observer.on_state(self.hosts.runs[name])
        self.backend.stop(unfinished, force, failed)

    def _fail(self, run: HostRun, why: str, what: str = "failed", consequence: bool = False) -> None:
        if self.record.ended_by is not None:
            return  # the scheduler ended the job: what fails now died of it
        if self.record.first_failure is None:
            self.record.first_failure = run
            self.timeline.add(ev.FAILED, host=run.host, cause=what, why=why)
            if not self.stopping and self.options.fail_fast:
                self.stop_was_consequence = consequence
                self.stop_all(False, f"{run.host} {what} ({why}); stopping the job on every host", failed=True)

    def _interrupted(self, exc: KeyboardInterrupt) -> None:
        signum = exc.signum if isinstance(exc, StopSignal) else int(signal.SIGINT)
        self.record.signals.append(signum)
        if not self.stopping and self.record.stopped_by is None:  # the stop itself, not a hurry for one under way
            self.record.stopped_at = time.time()
            self.record.stopped_by = signalled(signum, self.record.stopped_at)
            self.timeline.add(ev.STOP, self.record.stopped_at, cause=self.record.stopped_by)
        if len(self.record.signals) > 1:
            self.stop_all(True, "interrupted again: killing the job on every host")
        elif signum != signal.SIGINT:
            self.stop_all(False, f"got {STOP_SIGNALS[signal.Signals(signum)]}: stopping the job on every "
                                 f"host, as Ctrl-C does; `up` exits {128 + signum}")
        else:
            if self.options.dump_on_interrupt:
                self.dump_stacks("interrupt")
            self.stop_all(False, "interrupted: stopping the job on every host (Ctrl-C again to force)")

    # -- events -----------------------------------------------------------------------------
    def handle(self, event: BackendEvent) -> None:
        """One backend event on the core's thread: the host's state first, then the monitors."""
        run = self.hosts.runs[event.host]
        match event:
            case Output():
                self._output(run, event.lines)
            case Started():
                run.state, run.started_at, run.remote_log = RunState.RUNNING, time.time(), event.log
                run.hostname = event.hostname or run.hostname
                self.observer.on_state(run)
            case Notice():
                self.observer.on_notice(event.text)
            case Milestone():
                self._milestone(run, event)
            case Reported():
                self._reported(run, event)
            case Problem():
                run.error = event.message
            case Lost():
                self._mark_lost(run, event.reason)
            case Ended():
                self._ended(run, event)
            case Exited():
                self._exited(run, event.exit_code)
            case Reattached():
                self._reattached(run)
            case Checkpointed():
                self.timeline.checkpoint(event.host, event.seen.mtime, event.seen.steps)
            case Scheduled():
                self._scheduled(event)
            case Alive() | Sampled():
                pass
            case _:
                raise TypeError(f"unknown backend event {event!r}")
        self.monitors.tell(event)

    def _output(self, run: HostRun, lines: Sequence[str]) -> None:
        log = self.logs[run.host]
        log.write("\n".join(lines) + "\n")
        log.flush()  # a batch at a time: the file is current even if `up` is killed
        run.tail = [*run.tail, *lines[-30:]][-30:]
        labels = labels_for(self.plan.hosts[run.node_rank], self.ranks_numbered_at_rendezvous, self.global_ranks)
        self.observer.on_lines(run.host, RankLines(lines, labels))

    def _milestone(self, run: HostRun, event: Milestone) -> None:
        phase = event.phase
        if phase.local_rank is not None and phase.rank is not None:
            self.global_ranks[(event.host, phase.local_rank)] = phase.rank
        if phase.step is not None:
            self.record.stepped(event.host, phase.local_rank, phase.step)
            self.timeline.stepped_to(event.host, phase.local_rank, phase.step, phase.time)
        if phase.error is None:
            return
        failure = self.record.rank_failed(run, phase.error)
        consequence = failure is not None and failure.consequence
        if failure is not None and consequence:
            self._blame_silent(failure)
        # fail fast: the other hosts are told now, not when this one's torchrun has exited
        rank = phase.rank if phase.rank is not None else f"local {phase.local_rank}"
        raised = f"rank {rank} raised {phase.error.kind or 'an error'}" + (", losing a peer" if consequence else "")
        self._fail(run, raised, consequence=consequence)

    def _reported(self, run: HostRun, event: Reported) -> None:
        result = event.result
        run.stop_reason, run.first_error, run.nccl = result.stop_reason, result.first_error, result.nccl
        run.error = result.error or run.error
        if result.steps is not None:
            self.record.stepped(run.host, None, result.steps)
        self.record.checkpointed = self.record.checkpointed or result.checkpointed
        if result.checkpointed and result.newest_checkpoint is not None:  # one written since it last looked
            self.timeline.checkpoint(run.host, result.newest_checkpoint, result.steps)
        for error in result.rank_errors:
            self.record.rank_failed(run, error)
        reason = result.stop_reason or ""
        if reason.startswith(NODE_GAVE_UP) and not self.stopping:  # it stopped for lack of us
            self._lose(run, f"{run.host} stopped its job on its own: {reason}")
        elif reason.startswith((STOPPED_BY_DOWN, STOPPED_BY_SIGNAL)):  # someone else's stop, not a failure
            self._stopped_from_outside(reason, result.stopped_at)

    def _scheduled(self, event: Scheduled) -> None:
        if event.state == "requeued":
            self.timeline.requeued(event.text)
        else:
            self.timeline.add(ev.QUEUED if event.state == "queued" else ev.RUNNING, text=event.text)

    def _stopped_from_outside(self, reason: str, at: float | None) -> None:
        """`ddpctl down` (or a signal to torchrun) reached a host: the stop is the headline, and
        what fails after it began is its consequence (launch/outcome.py)."""
        if self.record.stopped_by is not None:
            return
        headline = reason[:reason.index(")") + 1] if ")" in reason else reason
        self.record.stopped_by, self.record.stopped_at = headline, at if at is not None else time.time()
        self.timeline.add(ev.STOP, self.record.stopped_at, cause=headline)
        if not self.stopping:
            self.stop_all(False, f"{headline}: stopping the job on every host")

    def _blame_silent(self, failure: RankFailure) -> None:
        """A rank lost its connection to a peer while a host is silent: that host is gone. Lost
        at once (the one the error names, or the only silent one), before the victim is blamed."""
        silent = self.hosts.silent()
        text = f"{failure.error.message} {failure.error.traceback[-2000:]}"
        addresses = self.hosts.addresses
        named = [name for name in silent if addresses.get(name) and addresses[name] in text]
        for name in named or (silent if len(silent) == 1 else []):
            since = clock(self.hosts.links[name].since)
            self._mark_lost(self.hosts.runs[name], f"no contact with {name} since {since}, and the ranks on "
                            f"{failure.host} lost their connections to it: host down or network cut")

    def _lose(self, run: HostRun, why: str) -> None:
        """A loss is the cause unless the job was stopped already for another reason (a failure
        that is not a lost peer, Ctrl-C, a signal, a monitor): hosts lost while it stops are news,
        not the cause."""
        if self.stopping and not self.stop_was_consequence:
            return
        self.record.losses.append(HostLoss(run.host, why, time.time()))
        self._fail(run, why, "lost")

    def _mark_lost(self, run: HostRun, why: str) -> None:
        if run.done:
            return
        self._host_lost(run, why)
        self.backend.drop(run.host)  # its node ends the job when it stops hearing from us
        self._lose(run, why)

    def _host_lost(self, run: HostRun, why: str) -> None:
        """The host's run and link say lost from now on; the monitors and the observer are told."""
        self.timeline.add(ev.LOST, host=run.host, cause=why)
        self.hosts.lose(run, why)
        self.monitors.tell(HostLost(run.host, why))
        self.observer.on_state(run)

    def _ended(self, run: HostRun, event: Ended) -> None:
        """The scheduler ends the job for a reason of its own: its words are the cause, no rank is
        blamed (the ranks die of it), and there is nothing for us to stop. A node it names as
        failed is lost."""
        if self.record.ended_by is None:
            self.record.ended_by = event.cause
            if not event.lost:
                self.timeline.add(ev.STOP, cause=event.cause)
            if not event.lost:  # a lost node's state line says it
                self.observer.on_notice(event.cause)
        self.stopping = True
        self.stop_was_consequence = False
        if event.lost and not run.done:
            self.record.losses.append(HostLoss(run.host, event.cause, time.time()))
            self._host_lost(run, event.cause)

    def _exited(self, run: HostRun, code: int | None) -> None:
        if run.done:
            return
        if code is None:
            run.link_closed = True  # closed from its side: its node ends the job at once (the fault model)
            self._mark_lost(run, f"connection to {run.host} lost: host or sshd died (it closed without an "
                                 "exit status)")
            return
        run.exit_code, run.ended_at = code, time.time()
        if code == 0:
            run.state = RunState.EXITED
        elif (self.stopping and run is not self.record.first_failure) or self.record.stopped_by is not None:
            run.state = RunState.STOPPED
        else:
            run.state = RunState.FAILED
        self.observer.on_state(run)
        if code != 0 and not self.stopping:
            self._fail(run, f"exit code {code}" + (f": {run.stop_reason}" if run.stop_reason else ""))

    def _reattached(self, run: HostRun) -> None:
        if run.done:
            return  # lost (or over) already: a late re-attach changes nothing
        link = self.hosts.links[run.host]
        if link.state is LinkState.SILENT:
            self.observer.on_notice(f"{run.host} back after {time.time() - link.since:.0f}s: re-attached on a "
                                    "fresh connection; its output resumes where it stopped")
            self.timeline.add(ev.CONTACT_BACK, host=run.host)
        link.enter(LinkState.REATTACHED)
        self.hosts.contact.reattached(run.host)

    # -- the fault model, on the timer --------------------------------------------------------
    def _check_links(self) -> None:
        for move in self.hosts.moves(time.monotonic()):
            if move.state is LinkState.SILENT:
                self._went_silent(move)
            elif move.state is LinkState.CONNECTED:
                link = self.hosts.links[move.host]
                self.observer.on_notice(f"{move.host} back after {time.time() - link.since:.0f}s")
                self.timeline.add(ev.CONTACT_BACK, host=move.host)
                link.enter(LinkState.CONNECTED)
            elif move.state is LinkState.LOST:
                lost_after = self.hosts.limits.lost_after
                self._mark_lost(self.hosts.runs[move.host], f"no contact with {move.host} for {lost_after:.0f}s "
                                f"(since {clock(time.time() - move.quiet_s)}): host down or network cut")
        for name in self.hosts.unconfirmed(time.monotonic()):
            self._unconfirmed(self.hosts.runs[name])

    def _unconfirmed(self, run: HostRun) -> None:
        """The stop's bound has passed and the host has not confirmed it (its link silent or
        re-attaching, its stop word never delivered): lost, so that `up` ends; its node ends its part
        on its own."""
        link = self.hosts.links[run.host]
        asked = time.monotonic() - (self.hosts.stop_since or time.monotonic())
        state = link.state.value + ("" if link.state is LinkState.CONNECTED else f" since {clock(link.since)}")
        run.stop_unconfirmed = True
        self._mark_lost(run, f"{run.host} did not confirm the stop within {asked:.0f}s (its link {state}): `up` "
                             "ends without its report; its node ends its part on its own")

    def _went_silent(self, move: LinkMove) -> None:
        link = self.hosts.links[move.host]
        link.enter(LinkState.SILENT, at=time.time() - move.quiet_s)
        self.timeline.add(ev.CONTACT_LOST, link.since, host=move.host)
        self.observer.on_notice(f"lost contact with {move.host} at {clock(link.since)} ({move.quiet_s:.0f}s "
                                f"without a word): the job runs on; reaching {move.host} on a fresh connection "
                                f"(it is lost after {self.hosts.limits.lost_after:.0f}s)")
        self.backend.reattach(move.host)

    def host_of(self, rank: int) -> str | None:
        """A global rank's host, as the ranks said their numbers."""
        return next((host for (host, _local), number in self.global_ranks.items() if number == rank), None)

    # -- what monitors ask --------------------------------------------------------------------
    def _stop_failed(self, reason: str) -> None:
        if not self.stopping:  # a job already stopping is not stopped twice
            self.stop_all(False, reason, failed=True)

    def dump_stacks(self, why: str) -> StacksReport:
        """Every rank's stack into the run directory, and the collapsed summary to the user."""
        report = self.backend.stacks(self.plan)
        stamp = time.strftime("%H%M%S")
        (self.run_dir / f"stacks-{why}-{stamp}.json").write_text(json.dumps(report_json(report), indent=2))
        text = report_text(report)
        (self.run_dir / f"stacks-{why}-{stamp}.txt").write_text("\n".join(text) + "\n")
        self.observer.on_notice(f"stacks of every rank ({why}), saved in {self.run_dir}:\n  " + "\n  ".join(text))
        return report

    # -- main loop --------------------------------------------------------------------------
    def run(self) -> RunResult:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logs = {name: (self.run_dir / f"{name}.log").open("a") for name in self.hosts.runs}
        for run in self.hosts.runs.values():
            self.observer.on_state(run)
        self.timeline.launched(list(self.hosts.runs))
        try:
            with stop_signals_raise():
                try:
                    self.backend.start(self.plan, self.options, self.emit)
                except KeyboardInterrupt as exc:  # a signal while the hosts start: stop what started
                    self._interrupted(exc)
                self._loop()
        finally:
            with interrupts_ignored():  # the job is over: a late Ctrl-C must not lose its summary
                self.backend.close()
                for f in self.logs.values():
                    f.close()
        with interrupts_ignored():
            return self._result()

    def _loop(self) -> None:
        next_check = time.monotonic() + CHECK_EVERY
        while True:
            try:  # the whole iteration: a Ctrl-C may land anywhere in it
                if self.hosts.all_done() and self.lanes.empty():
                    return
                event = self.lanes.get(CHECK_EVERY)
                if event is not None:
                    self.handle(event)
                if time.monotonic() >= next_check:  # on a timer: busy hosts must not starve it
                    next_check = time.monotonic() + CHECK_EVERY
                    self._check_links()
                    self.monitors.tick()
                    self.timeline.findings(self.record.findings, self.host_of)
            except KeyboardInterrupt as exc:
                self._interrupted(exc)

    def _root_learned_late(self, root: RankFailure, told: HostRun) -> None:
        """The rank that failed first was learned after another host's failure had stopped the job
        (its records replayed once its host was reached again after a cut): its host is the one that
        failed and the other one was stopped, and the account charges it, as without the cut."""
        self.timeline.failed_first(root)
        for run, state in ((self.hosts.runs[root.host], RunState.FAILED), (told, RunState.STOPPED)):
            if run.state in (RunState.FAILED, RunState.STOPPED):
                run.state = state

    def _result(self) -> RunResult:
        """The outcome of the final state, summary.json, then each monitor's finish."""
        state = self.record.final(list(self.hosts.runs.values()))
        end = outcome(state)
        told, root = self.record.first_failure, end.root_cause
        if told is not None and root is not None and not root.consequence and end.loss is None \
                and root.host != told.host:
            self._root_learned_late(root, told)
        result = RunResult(job_id=self.plan.job_id, run_dir=self.run_dir, hosts=list(state.runs),
                           exit_code=end.exit_code, first_failure=end.first_failure,
                           interrupted=state.signal is not None,
                           nprocs={hl.host.name: hl.nproc for hl in self.plan.hosts}, hung=state.hung,
                           root_cause=end.root_cause, cause=state.cause, loss=end.loss, signal=state.signal,
                           ended_by=state.ended_by, steps=self.record.most_steps,
                           checkpointed=self.record.checkpointed, findings=list(self.record.findings),
                           started=self.started, stopped_by=state.stopped_by)
        self.timeline.ended(result, outcome_of(result))
        write_summary(self.plan, result)
        self.monitors.finish(result)
        return result


def signalled(signum: int, at: float) -> str:
    """The headline of a signal to `up`: Ctrl-C comes from the user at its terminal; another
    signal's sender is unknown (a signal handler is not told it)."""
    if signum == signal.SIGINT:
        return f"stopped by Ctrl-C (by {getpass.getuser()} on {socket.gethostname()} at {clock(at)})"
    return f"stopped by {signal.Signals(signum).name} to `up` (at {clock(at)})"
