"""Restarts: one outer supervisor and one budget for the whole job ([restart] max_restarts, or
--max-restarts) around the launch core (torchrun itself keeps --max-restarts 0). Each failed
attempt is classified before the budget is spent (`classify`: host fault, consequence,
deterministic, stopped, other; docs/restarts.md has the table), and each attempt is a whole launch
of its own, in `runs/<run id>/attempt-<n>/`."""

from __future__ import annotations

import enum
import json
import re
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from inventory import ConfigError, Job
from orchestrator.account import events as ev
from orchestrator.account.compute import Account
from orchestrator.account.events import EventLog
from orchestrator.checks.model import CheckStatus
from orchestrator.errors import HostError, HostsFailed, LaunchBlocked
from orchestrator.launch import core
from orchestrator.launch.backends.base import Backend
from orchestrator.launch.faults import limits_for
from orchestrator.launch.monitor_api import MonitorFactory, no_monitors
from orchestrator.launch.observer import Observer
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.plan import ATTEMPT_ENV, PREV_FAILURE_ENV, RUN_ID_ENV, new_job_id
from orchestrator.launch.preflight import ChecksFailed
from orchestrator.launch.result import RunResult, RunState, clock
from orchestrator.launch.signals import StopSignal, stop_signals_raise
from orchestrator.restarts import hostledger
from orchestrator.restarts.fence import Suspect, fence
from orchestrator.restarts.places import NoHosts, fill, rendezvous_without
from orchestrator.watch.run_account import account_json, add_to_files, close_run, open_run

EXIT_DETERMINISTIC = 70  # not restarted: it would fail the same way again (BSD's EX_SOFTWARE)
BACKOFF_TICK = 0.2  # a backoff wakes this often to honour Ctrl-C at once

EventsTo = Callable[[EventLog, str], None]  # handed the run's events log and its id (up's metrics)

# In a host's output: the hardware (or its driver) failed, not the program.
HARDWARE = re.compile(r"\bXid\b|\bECC error|uncorrectable ECC|fallen off the bus", re.IGNORECASE)
# NCCL's word for a failed system call on that host: a host fault unless a rank's own error elsewhere
# came first (NCCL also says it on the survivors of a peer's death).
NCCL_SYSTEM = re.compile(r"unhandled system error", re.IGNORECASE)
# torchrun's report of a worker ended by a signal ("exitcode  : -9", "Signal 9 (SIGKILL) received").
KILLED = re.compile(r"exitcode\s*:\s*-9\b|Signal 9 \(SIGKILL\)")
KILLED_CODES = (-9, 128 + 9, 256 - 9)  # a host's torchrun itself SIGKILLed: as Python, a shell, an exit status
EXITCODE = re.compile(r"exitcode\s*:\s*(\d+)\b")
FRAME = re.compile(r'File "([^"]+)", line (\d+)')


class Failure(str, enum.Enum):
    HOST_FAULT = "host fault"  # retried without the host
    ERROR = "error"  # retried on the same hosts
    DETERMINISTIC = "deterministic"  # not retried
    STOPPED = "stopped"  # stopped by the user, a signal or the scheduler: not retried


@dataclass(frozen=True)
class Verdict:
    kind: Failure
    reason: str  # one line, for the notice, DDPCTL_PREV_FAILURE and the summary
    hosts: tuple[str, ...] = ()  # the faulty hosts (HOST_FAULT)
    why: tuple[str, ...] = ()  # each faulty host's own reason, as `hosts`
    signature: tuple[str, ...] | None = None  # a rank's error: type, message, where it was raised
    step: int | None = None  # the failed rank's optimizer steps, where known

    @property
    def faults(self) -> dict[str, str]:
        """Each faulty host and its own reason."""
        return dict(zip(self.hosts, self.why or (self.reason,) * len(self.hosts), strict=True))


@dataclass(frozen=True)
class Exclusion:
    host: str
    reason: str
    from_attempt: int  # the first attempt it is left out of


@dataclass
class AttemptRecord:
    number: int
    job_id: str
    hosts: list[str]
    run_dir: Path
    started_at: float
    ended_at: float | None = None
    exit_code: int | None = None
    verdict: Verdict | None = None  # None: it succeeded
    steps: int | None = None
    checkpointed: bool = False
    master: str | None = None
    root_cause: str | None = None  # the first rank error in time: "rank 1 on node1: ValueError: ..."
    findings: list[dict[str, object]] = field(default_factory=list)  # the attempt's (orchestrator/watch/)
    fenced: list[dict[str, object]] = field(default_factory=list)  # its lost hosts, settled before the next

    def to_json(self) -> dict[str, object]:
        v = self.verdict
        return {"attempt": self.number, "job_id": self.job_id, "hosts": self.hosts, "master": self.master,
                "run_dir": str(self.run_dir), "started_at": self.started_at, "ended_at": self.ended_at,
                "exit_code": self.exit_code, "steps": self.steps, "checkpointed": self.checkpointed,
                "root_cause": self.root_cause, "findings": self.findings, "fenced": self.fenced,
                "failure": None if v is None else {"class": v.kind.value, "reason": v.reason,
                                                   "hosts": list(v.hosts), "step": v.step}}


@dataclass
class RestartedRun:
    """A job run with restarts: every attempt, the hosts left out, and why it ended."""

    run_id: str
    run_dir: Path
    max_restarts: int
    attempts: list[AttemptRecord] = field(default_factory=list)
    excluded: list[Exclusion] = field(default_factory=list)
    result: RunResult | None = None  # the last attempt's
    exit_code: int = 1
    reason: str | None = None  # why it stopped restarting (None: it succeeded)
    signal: int | None = None
    size: int = 0  # the hosts the job asked for (on Slurm: nodes); 0: not known
    account: Account | None = None  # where its time went (orchestrator/account/), once it is over

    @property
    def restarts(self) -> int:
        return max(len(self.attempts) - 1, 0)

    @property
    def shrunk(self) -> str | None:
        """How the last attempt ran short of the hosts the job asked for ("on 2 of 4 hosts:
        node2, node3"); None when it ran on as many."""
        last = self.attempts[-1].hosts if self.attempts else []
        if not last or not self.size or len(last) >= self.size:
            return None
        return f"on {len(last)} of {self.size} hosts: {', '.join(last)}"

    def write_summary(self) -> Path:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / "summary.json"
        data = {"run_id": self.run_id, "exit_code": self.exit_code, "max_restarts": self.max_restarts,
                "restarts": self.restarts, "stopped_because": self.reason, "signal": self.signal,
                "shrunk": self.shrunk,
                "excluded": [asdict(e) for e in self.excluded],
                "attempts": [a.to_json() for a in self.attempts],
                "account": account_json(self.account) if self.account is not None else None}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, default=str))
        tmp.replace(path)
        return path


def classify(result: RunResult, job: Job, number: int, previous: Sequence[AttemptRecord]) -> Verdict:
    """What a failed attempt's result says about the next one (the failure classes: docs/restarts.md)."""
    if result.signal is not None or result.interrupted:
        return Verdict(Failure.STOPPED, "stopped by the user" if result.signal in (None, signal.SIGINT) else
                       f"stopped by {signal.Signals(result.signal).name}")
    if result.stopped_by is not None:  # `ddpctl down`, a signal to torchrun: someone else's action is not ours to undo
        return Verdict(Failure.STOPPED, result.stopped_by)
    if result.loss is not None:  # on Slurm too: a node it marked failed; every host lost is charged
        lost = lost_hosts(result)
        reason = f"{result.loss.host} lost at {result.loss.when()}: {result.loss.reason}"
        others = {host: why for host, why in lost.items() if host != result.loss.host}
        also = f"; also lost: {', '.join(others)}" if others else ""
        return Verdict(Failure.HOST_FAULT, reason + also, (result.loss.host, *others), (reason, *others.values()))
    if result.ended_by is not None:  # a cancel, a time limit: the scheduler's decision, not a fault
        return Verdict(Failure.STOPPED, result.ended_by)
    faulty = _faulty_hosts(result, job)
    if faulty:
        host, why = faulty[0]
        return Verdict(Failure.HOST_FAULT, f"{host}: {why}", tuple(h for h, _ in faulty), tuple(w for _, w in faulty))
    root = result.root_cause
    if root is None or root.consequence:
        what = result.cause.splitlines()[0] if result.cause else "the job hung" if result.hung else \
            _host_failure(result)
        return _repeated(Verdict(Failure.ERROR, what, signature=("job", what)), result, number, previous)
    error = root.error
    signature = (error.kind, error.message, _raised_at(error.traceback))
    verdict = Verdict(Failure.ERROR, _root_cause(result) or error.summary, signature=signature, step=error.step)
    return _repeated(verdict, result, number, previous)


def lost_hosts(result: RunResult) -> dict[str, str]:
    """Every host the attempt lost (the cause or not), first lost first: host -> why."""
    lost = sorted((r for r in result.hosts if r.state is RunState.LOST), key=lambda r: r.ended_at or 0.0)
    return {r.host: f"{r.host} lost at {clock(r.ended_at or time.time())}: {r.error or 'no contact'}" for r in lost}


def _host_failure(result: RunResult) -> str:
    run = result.first_failure
    if run is None:
        return "the job failed"
    return f"{run.host} failed (exit code {run.exit_code})" + (f": {run.error}" if run.error else "")


def _faulty_hosts(result: RunResult, job: Job) -> list[tuple[str, str]]:
    """Hosts whose own output or exit code says the host, not the program, failed."""
    found: list[tuple[str, str]] = []
    root = result.root_cause
    codes = set(job.restart.host_fault_exit_codes)
    for run in sorted(result.hosts, key=lambda r: (r is not result.first_failure, r.node_rank)):
        text = "\n".join(run.tail)
        if root is not None and root.host == run.host:
            text += f"\n{root.error.message}\n{root.error.traceback}"
        own_error_elsewhere = root is not None and root.host != run.host and not root.consequence
        hardware = HARDWARE.search(text) or (None if own_error_elsewhere else NCCL_SYSTEM.search(text))
        own = root.error.exit_code if root is not None and root.host == run.host else None
        exits = {int(m) for m in EXITCODE.findall(text)} | ({own} if own is not None else set())
        listed = sorted(exits & codes)
        if hardware:
            found.append((run.host, f"hardware error in its output: {_line_of(text, hardware)}"))
        elif KILLED.search(text) or run.exit_code in KILLED_CODES or \
                (root is not None and root.host == run.host and root.error.kind == "SIGKILL"):
            found.append((run.host, "a rank was killed (SIGKILL: out of memory, or killed on the host)"))
        elif listed:
            found.append((run.host, f"a rank exited with code {listed[0]}, listed in [restart] host_fault_exit_codes"))
    return found


def _line_of(text: str, match: re.Match[str]) -> str:
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    return text[start:end if end >= 0 else None].strip()[:200]


def _raised_at(traceback: str) -> str:
    """Where the error was raised: the innermost frame of its traceback ('' when none)."""
    frames = FRAME.findall(traceback)
    return f"{frames[-1][0]}:{frames[-1][1]}" if frames else ""


def _repeated(verdict: Verdict, result: RunResult, number: int, previous: Sequence[AttemptRecord]) -> Verdict:
    """An error is deterministic before any progress on the first attempt, or when the attempt
    before failed exactly so and no progress was made in between."""
    progressed = bool(result.steps) or result.checkpointed
    at = f" after {verdict.step} optimizer step(s) of its own" if verdict.step is not None else ""
    own = verdict.signature is not None and verdict.signature[0] != "job"  # a rank's own error
    if number == 0 and not progressed and own:
        return replace(verdict, kind=Failure.DETERMINISTIC,
                       reason=f"the first attempt failed before any progress (no optimizer step, no new checkpoint): "
                              f"{verdict.reason}")
    last = previous[-1] if previous else None
    if last is None or last.verdict is None or last.verdict.signature != verdict.signature:
        return verdict
    mine = verdict.step if verdict.step is not None else result.steps
    theirs = last.verdict.step if last.verdict.step is not None else last.steps
    further = (mine or 0) > (theirs or 0) or result.checkpointed
    if further:
        return verdict
    return replace(verdict, kind=Failure.DETERMINISTIC,
                   reason=f"attempt {number} failed exactly as attempt {last.number}{at}, with no new checkpoint: "
                          f"{verdict.reason}")


def restart_env(run_id: str, number: int, previous: str | None) -> dict[str, str]:
    env = {ATTEMPT_ENV: str(number), RUN_ID_ENV: run_id}
    if previous:
        env[PREV_FAILURE_ENV] = " ".join(previous.split())[:1000]
    return env


class Restarts:
    """Runs `job` until it succeeds, is stopped, fails deterministically or spends its budget."""

    def __init__(self, job: Job, make_backend: Callable[[Job], Backend], observer: Observer,
                 options: LaunchOptions, max_restarts: int, run_id: str | None = None,
                 monitors: MonitorFactory = no_monitors, events_to: EventsTo | None = None) -> None:
        self.job = job
        self.monitors = monitors
        self.make_backend = make_backend
        self.cb = observer
        self.options = options
        self.run_id = run_id or new_job_id(job.name)
        self.run = RestartedRun(self.run_id, options.runs_dir / self.run_id, max_restarts,
                                size=0 if job.slurm is not None else len(job.hosts))
        self.hosts = list(job.hosts)
        self.spares = list(job.spares)
        self.size = len(job.hosts)
        self.nodes_out: list[str] = []  # Slurm nodes left out (sbatch --exclude)
        self.quarantine = job.restart.quarantine and job.inventory.quarantine
        self.named: set[str] = set()  # suspect hosts said already
        self.events = open_run(self.run.run_dir, self.run_id, job, [h.name for h in job.hosts])
        if events_to is not None:
            events_to(self.events, self.run_id)

    def exclude(self, bad: dict[str, str], number: int, said: bool = False) -> None:
        """Leave `bad` (host -> why) out; spares take their places in inventory order, else the
        job shrinks as far as min_nodes allows; NoHosts when it cannot go on (`said`: each host's
        line was said already)."""
        for name, why in bad.items():
            why = why.removeprefix(f"{name}: ")
            self.run.excluded.append(Exclusion(name, why, number))
            if not said:
                self.cb.on_notice(f"leaving {name} out of attempt {number} on: {why}")
        places = fill(self.hosts, self.spares, bad, self.size, self.job.restart.min_nodes)
        self.hosts, self.spares = places.hosts, places.spares
        hostledger.say_places(places, self.size, self.cb.on_notice, "the next attempt" if number else "this run")

    def screen(self, number: int) -> str | None:
        """Before attempt `number`: its quarantined hosts (and spares) left out, as hosts that failed
        the pre-launch checks are; why it cannot go on, where too few are left (attempt 0: raised)."""
        if self.job.slurm is not None or not self.quarantine:
            return None
        out = hostledger.screen(self.job, [*self.hosts, *self.spares], self.cb.on_notice, self.named)
        if not out:
            return None
        try:
            self.exclude(out, number, said=True)
        except NoHosts as no:
            if number == 0:
                raise hostledger.refused(no) from None
            return f"quarantined hosts leave too few: {no}"
        return None

    def remember(self, job: Job, result: RunResult, verdict: Verdict | None) -> None:
        """The attempt in the host ledger: its hosts seen, each lost, each host fault, each straggler."""
        faults = verdict.faults if verdict is not None and verdict.kind is Failure.HOST_FAULT else {}
        for warning in hostledger.record_attempt(job, result, lost_hosts(result), faults):
            self.cb.on_notice(f"warning: {warning}")

    def exclude_nodes(self, bad: dict[str, str], result: RunResult, number: int) -> None:
        """On Slurm: the faulty nodes (by Slurm's names, as each node's supervisor reported its
        hostname) are excluded from every later allocation; Slurm picks the others."""
        names = {run.host: run.hostname or run.host for run in result.hosts}
        for host, why in bad.items():
            node = names.get(host, host)
            self.run.excluded.append(Exclusion(node, why.removeprefix(f"{host}: "), number))
            self.cb.on_notice(f"excluding Slurm node {node} ({host}) from attempt {number} on: "
                              f"{why.removeprefix(f'{host}: ')}")
            if node not in self.nodes_out:
                self.nodes_out.append(node)

    def attempt_job(self, number: int, previous: str | None) -> Job:
        env = {**self.job.env, **restart_env(self.run_id, number, previous)}
        if self.job.slurm is not None:
            return replace(self.job, env=env, slurm=replace(self.job.slurm, exclude=tuple(self.nodes_out)))
        hosts = tuple(self.hosts)
        return replace(self.job, hosts=hosts, env=env, rendezvous=rendezvous_without(self.job, hosts))

    def fence_lost(self, job: Job, result: RunResult, before: int) -> list[dict[str, object]]:
        """No attempt beside a lost one: each host the attempt lost is reached again and its part
        ended, or waited out (restarts/fence.py). Slurm fences its own nodes (docs/restarts.md)."""
        lost = [r for r in result.hosts if r.state is RunState.LOST]
        if job.slurm is not None or not lost:
            return []
        limits = limits_for(job.lost_after, self.options.lost_after)
        hosts = {h.name: h for h in job.hosts}
        suspects = [Suspect(hosts[r.host], result.job_id,
                            (r.ended_at or time.time()) + limits.self_stopped_after(self.options.grace,
                                                                                    closed=r.link_closed))
                    for r in lost if r.host in hosts]
        backend = self.make_backend(job)
        self.events.add(ev.FENCE_START, attempt=before - 1, hosts=[s.host.name for s in suspects])
        try:
            settled = fence(suspects, backend, self.options.grace, self.cb.on_notice, f"attempt {before}")
        finally:
            backend.close()
            self.events.add(ev.FENCE_END, attempt=before - 1)
        return [{"host": s.host, "how": "waited out" if s.fenced is None else "reached",
                 "ended": None if s.fenced is None else s.fenced.ended, "at": s.at} for s in settled]

    def charge_restart(self, number: int, verdict: Verdict, result: RunResult) -> None:
        """What attempt `number` is run again for, in the events: a host fault (lost, or its own)
        is charged to its host; a rank's error to no host."""
        if verdict.kind is Failure.HOST_FAULT:
            cause = "lost" if result.loss is not None and verdict.hosts[:1] == (result.loss.host,) else "host fault"
            self.events.add(ev.RESTART, attempt=number, host=verdict.hosts[0] if verdict.hosts else None,
                            cause=cause, hosts=list(verdict.hosts), reason=verdict.reason)
        else:
            self.events.add(ev.RESTART, attempt=number, cause=verdict.kind.value, reason=verdict.reason)

    def backoff(self, restarts: int, waited: float = 0.0, number: int = 0) -> None:
        """Wait before the next attempt (doubling, capped; less what fencing waited already);
        Ctrl-C or a stop signal ends the run."""
        spec = self.job.restart
        wait = min(spec.backoff * (2 ** restarts), spec.max_backoff) - waited
        if wait <= 0:
            return
        self.cb.on_notice(f"restarting in {wait:.0f}s (restart {restarts + 1} of at most "
                          f"{self.run.max_restarts}; Ctrl-C stops here)")
        self.events.add(ev.BACKOFF_START, attempt=number)
        deadline = time.monotonic() + wait
        try:
            while time.monotonic() < deadline:
                time.sleep(min(BACKOFF_TICK, max(deadline - time.monotonic(), 0)))
        finally:
            self.events.add(ev.BACKOFF_END, attempt=number)

    def stop(self, reason: str | None, code: int) -> RestartedRun:
        """The run is over (`reason`: why it stopped restarting; None: it succeeded)."""
        self.run.reason, self.run.exit_code = reason, code
        outcome = "ok" if code == 0 else "stopped" if self.run.signal is not None or (
            self.run.attempts and self.run.attempts[-1].verdict is not None
            and self.run.attempts[-1].verdict.kind is Failure.STOPPED) else "failed"
        self.run.account = close_run(self.events, code, outcome)
        self.run.write_summary()
        if self.run.account is not None:
            for warning in hostledger.record_account(self.job, self.run.account):
                self.cb.on_notice(f"warning: {warning}")
            if self.run.attempts:  # the last attempt's report tells the whole run's account
                add_to_files(self.run.account, None, self.run.attempts[-1].run_dir)
        return self.run

    def start(self, number: int, job: Job, attempt: core.Attempt) -> RunResult | str | None:
        """Launch one attempt: its result; None when the pre-launch steps left hosts out (the same
        attempt goes again, on the next hosts: the budget is for failures of a run); or why it
        cannot start at all. The first attempt's launch errors are the user's, raised as they are."""
        try:
            return core.launch(job, self.make_backend(job), self.cb, self.options, attempt=attempt,
                               monitors=self.monitors, events=self.events)
        except (ChecksFailed, HostsFailed, HostError, LaunchBlocked, ConfigError) as exc:
            if number == 0:
                raise
            bad = _hosts_failed(exc)
            if not bad or set(bad) - {h.name for h in job.hosts}:
                return f"attempt {number} could not start: {exc}"
            ran = set(self.run.attempts[-1].hosts)
            newcomers = {name: why for name, why in bad.items() if name not in ran}
            try:  # a pair blocked between a host that ran and a spare: the spare is left out
                self.exclude(newcomers or bad, number)
            except NoHosts as no:
                return f"the pre-launch checks left too few hosts: {no}"
            return None

    def __call__(self) -> RestartedRun:
        number, restarts, previous = 0, 0, None
        while True:
            started = time.time()
            attempt = core.Attempt(self.run_id, f"{self.run_id}.{number}", self.run.run_dir / f"attempt-{number}")
            blocked = self.screen(number)
            if blocked is not None:
                return self.stop(f"not restarting: {blocked}", 1)
            job = self.attempt_job(number, previous)
            self.events.add(ev.ATTEMPT_START, started, attempt=number, hosts=[h.name for h in job.hosts])
            if number > 0:
                self.cb.on_notice(f"attempt {number} on {', '.join(h.name for h in job.hosts)} "
                                  f"(run {self.run_id})")
            result = self.start(number, job, attempt)
            if result is None:
                continue
            if isinstance(result, str):
                return self.stop(f"not restarting: {result}", 1)
            record = AttemptRecord(number, attempt.job_id, [h.name for h in job.hosts], attempt.run_dir, started,
                                   time.time(), result.exit_code, steps=result.steps,
                                   checkpointed=result.checkpointed, master=job.master_host.name,
                                   root_cause=_root_cause(result), findings=result.findings_json())
            self.run.attempts.append(record)
            self.run.result = result
            if result.ok:
                self.remember(job, result, None)
                return self.stop(None, 0)
            verdict = classify(result, self.job, number, self.run.attempts[:-1])
            record.verdict = verdict
            self.remember(job, result, verdict)
            self.run.signal = result.signal
            if verdict.kind is Failure.STOPPED:
                return self.stop(f"not restarting: {verdict.reason}", result.exit_code)
            if verdict.kind is Failure.DETERMINISTIC:
                return self.stop(f"not restarting: {verdict.reason}", EXIT_DETERMINISTIC)
            if restarts >= self.run.max_restarts:
                return self.stop(f"restart budget spent: {restarts} of {self.run.max_restarts} restart(s) used; "
                                 f"attempt {number} failed: {verdict.reason}", result.exit_code or 1)
            self.cb.on_notice(f"attempt {number} failed ({verdict.kind.value}): {verdict.reason}")
            bad = dict(verdict.faults) if verdict.kind is Failure.HOST_FAULT else {}
            bad.update({host: why for host, why in lost_hosts(result).items() if host not in bad})  # every one lost
            if bad and self.job.slurm is not None:
                self.exclude_nodes(bad, result, number + 1)
            elif bad:
                try:
                    self.exclude(bad, number + 1)
                except NoHosts as no:
                    return self.stop(f"not restarting: {no}", result.exit_code or 1)
            restarts += 1
            self.charge_restart(number + 1, verdict, result)
            waiting, fencing = time.monotonic(), True
            try:
                with stop_signals_raise():
                    record.fenced = self.fence_lost(job, result, number + 1)
                    fencing = False
                    self.backoff(restarts - 1, time.monotonic() - waiting, number)
            except KeyboardInterrupt as exc:
                signum = exc.signum if isinstance(exc, StopSignal) else int(signal.SIGINT)
                self.run.signal = signum
                when = "while fencing" if fencing else "during the backoff"
                self.cb.on_notice(f"stopped {when}, before attempt {number + 1}: nothing was running"
                                  + (" but what a lost host runs on its own until its own limit" if fencing else ""))
                return self.stop(f"stopped {when} before attempt {number + 1}", 128 + signum)
            previous = f"attempt {number} at {clock(record.ended_at or time.time())}: {verdict.reason}"
            number += 1

def _root_cause(result: RunResult) -> str | None:
    root = result.root_cause
    if root is None:
        return None
    rank = result.rank_of(root)
    return f"rank {rank if rank is not None else '?'} on {root.host}: {root.error.summary}"


def _hosts_failed(exc: Exception) -> dict[str, str]:
    """host -> why, for each host a pre-launch step failed on (empty: not one host's fault)."""
    if isinstance(exc, ChecksFailed):
        bad: dict[str, str] = {}
        for finding in exc.findings:
            if finding.status is CheckStatus.FAIL:
                if finding.host is None:
                    return {}
                bad.setdefault(finding.host, f"failed the pre-launch check [{finding.check}]: {finding.message}")
        return bad
    if isinstance(exc, HostsFailed):
        return {e.host: f"{exc.step} failed: {e.message}" for e in exc.errors}
    if isinstance(exc, HostError):
        return {exc.host: exc.message}
    return {}


def launch(job: Job, make_backend: Callable[[Job], Backend], observer: Observer,
           options: LaunchOptions | None = None, max_restarts: int | None = None,
           run_id: str | None = None, monitors: MonitorFactory = no_monitors,
           events_to: EventsTo | None = None) -> RestartedRun:
    """Run `job` with restarts: `max_restarts` (the flag) over [restart] max_restarts; `run_id`
    names the run (a detached job's loop is told it), else a new one; `events_to` is handed the
    run's events log and id once it is open (`up`'s metrics read it)."""
    options = options or LaunchOptions()
    budget = job.restart.max_restarts if max_restarts is None else max_restarts
    return Restarts(job, make_backend, observer, options, budget, run_id, monitors, events_to)()
