"""Runs a launch plan: one supervised torchrun per host, streamed, failing fast, leaving no orphan."""

from __future__ import annotations

import contextlib
import enum
import json
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from node_agent.protocol import parse_line
from orchestrator.agent import call_agent, start_agent
from orchestrator.errors import HostError
from orchestrator.hosts import HostPool
from orchestrator.plan import HostLaunch, LaunchPlan, mask_env
from orchestrator.transport import RunningCommand

HEARTBEAT_EVERY = 2.0
CHECK_EVERY = 0.5  # how often silent hosts and hangs are looked for
LOST_AFTER = 15.0  # no line or heartbeat event from a host for this long: the host is lost
TORCHRUN_PREFIX = re.compile(r"^\[(?P<role>[A-Za-z_]*?)(?P<local>\d+)\]:(?P<text>.*)$")


class HostState(str, enum.Enum):
    CONNECTING = "connecting"
    RUNNING = "running"
    STOPPING = "stopping"
    EXITED = "exited"
    FAILED = "failed"  # exited non-zero
    LOST = "lost"  # connection failed or went silent


@dataclass
class HostRun:
    host: str
    node_rank: int
    command: str
    state: HostState = HostState.CONNECTING
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    error: str | None = None
    stop_reason: str | None = None
    first_error: dict[str, Any] | None = None  # the earliest rank error file on this host
    remote_log: str | None = None
    nccl: dict[str, Any] | None = None  # what NCCL chose, with --nccl-debug
    tail: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.state in (HostState.EXITED, HostState.FAILED, HostState.LOST)


@dataclass
class RunResult:
    job_id: str
    run_dir: Path
    hosts: list[HostRun]
    exit_code: int
    first_failure: HostRun | None
    interrupted: bool = False
    nprocs: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class LaunchOptions:
    grace: float = 10.0  # seconds between SIGTERM and SIGKILL
    hang_timeout: float | None = None  # no output from any rank for this long: a hang
    on_hang: str = "report"  # "report": dump stacks and go on; "stop": dump, then stop the job
    dump_on_interrupt: bool = False  # Ctrl-C dumps every rank's stack before stopping
    nccl_debug: bool = False  # NCCL_DEBUG=INFO with a per-host NCCL_DEBUG_FILE, parsed after
    dump_stacks_on_hang: bool = True


class Callbacks(Protocol):
    def on_line(self, host: str, rank: str | None, text: str) -> None: ...
    def on_state(self, run: HostRun) -> None: ...
    def on_notice(self, text: str) -> None: ...


def split_rank(launch: HostLaunch, text: str, c10d: bool) -> tuple[str | None, str]:
    """torchrun --tee prefixes worker lines with [role<local rank>]:; map that to a global rank."""
    m = TORCHRUN_PREFIX.match(text)
    if not m:
        return None, text
    local = int(m.group("local"))
    return (f"local{local}" if c10d else str(launch.rank_of(local))), m.group("text")


def supervise_request(plan: LaunchPlan, launch: HostLaunch, options: LaunchOptions,
                      detach: bool) -> dict[str, Any]:
    return {"job_id": plan.job_id, "job_name": plan.job.name, "node_rank": launch.node_rank,
            "launcher": list(launch.launcher), "program": list(launch.program),
            "env": dict(launch.env), "cwd": launch.cwd, "grace": options.grace,
            "heartbeat_timeout": 0 if detach else LOST_AFTER, "detach": detach,
            "nccl_debug": options.nccl_debug}


class Launch:
    """The state of one `ddpctl up` while it runs; `run()` returns its RunResult."""

    def __init__(self, plan: LaunchPlan, pool: HostPool, callbacks: Callbacks, run_dir: Path,
                 options: LaunchOptions | None = None) -> None:
        self.plan = plan
        self.pool = pool
        self.cb = callbacks
        self.run_dir = run_dir
        self.options = options or LaunchOptions()
        self.last_output = time.monotonic()
        self.hang_dumped = False
        self.hung = False
        self.events: queue.Queue[tuple[str, str, Any]] = queue.Queue()
        self.runs = {hl.host.name: HostRun(hl.host.name, hl.node_rank, hl.display()) for hl in plan.hosts}
        self.channels: dict[str, RunningCommand] = {}
        self.last_seen: dict[str, float] = {}
        self.logs: dict[str, Any] = {}
        self.first_failure: HostRun | None = None
        self.stop_sent = False
        self.lock = threading.Lock()
        self.c10d = plan.job.rendezvous.backend == "c10d"

    # -- per-host threads -------------------------------------------------------------------
    def _start_host(self, launch: HostLaunch) -> None:
        name = launch.host.name
        try:
            running = start_agent(self.pool.transport(launch.host), "supervise",
                                  supervise_request(self.plan, launch, self.options, detach=False))
        except HostError as exc:
            self.events.put((name, "lost", f"{exc.message}" + (f" (fix: {exc.fix})" if exc.fix else "")))
            return
        with self.lock:
            self.channels[name] = running
        self.last_seen[name] = time.monotonic()
        for line in running.lines():
            data = None
            if line.stream == "stdout":
                try:
                    data = parse_line(line.text)
                except ValueError:
                    data = None
            if data is None:
                self.events.put((name, "line", line.text))
            else:
                self.events.put((name, "event", data))
        code = running.wait(5.0)
        self.events.put((name, "exit", code))

    def _heartbeats(self, stop: threading.Event) -> None:
        while not stop.wait(HEARTBEAT_EVERY):
            with self.lock:
                channels = list(self.channels.items())
            for name, ch in channels:
                if not self.runs[name].done:
                    with contextlib.suppress(Exception):  # a dead channel shows up as silence: LOST
                        ch.send(b"HEARTBEAT\n")

    # -- control ----------------------------------------------------------------------------
    def stop_all(self, word: bytes, reason: str) -> None:
        self.stop_sent = True
        self.cb.on_notice(reason)
        with self.lock:
            channels = list(self.channels.items())
        for name, ch in channels:
            run = self.runs[name]
            if not run.done:
                run.state = HostState.STOPPING
                self.cb.on_state(run)
                try:
                    ch.send(word)
                except Exception:
                    ch.abort()

    def _fail(self, run: HostRun, why: str) -> None:
        if self.first_failure is None:
            self.first_failure = run
            if not self.stop_sent:
                self.stop_all(b"STOP\n", f"{run.host} failed ({why}); stopping the job on every host")

    def _handle(self, name: str, kind: str, payload: Any) -> None:
        run = self.runs[name]
        self.last_seen[name] = time.monotonic()
        if kind == "line":
            self.last_output = time.monotonic()
            launch = self.plan.hosts[run.node_rank]
            rank, text = split_rank(launch, payload, self.c10d)
            self.logs[name].write(payload + "\n")
            run.tail = ([*run.tail, payload])[-30:]
            self.cb.on_line(name, rank, text)
        elif kind == "event":
            self._handle_event(run, payload)
        elif kind == "lost":
            self._mark_lost(run, payload)
        elif kind == "exit":
            self._handle_exit(run, payload)

    def _handle_event(self, run: HostRun, data: dict[str, Any]) -> None:
        if data["event"] == "started":
            run.state, run.started_at, run.remote_log = HostState.RUNNING, time.time(), data.get("log")
            self.cb.on_state(run)
        elif data["event"] == "result":
            result = data["result"]
            run.stop_reason = result.get("stop_reason")
            run.first_error = result.get("first_error")
            run.nccl = result.get("nccl")
            if "error" in result:
                run.error = str(result["error"].get("message"))
        elif data["event"] == "error":
            run.error = str(data.get("message"))

    def _mark_lost(self, run: HostRun, why: str) -> None:
        if run.done:
            return
        run.state, run.error, run.ended_at = HostState.LOST, why, time.time()
        self.cb.on_state(run)
        ch = self.channels.get(run.host)
        if ch is not None:
            ch.abort()  # its supervisor ends the job when the heartbeats stop
        self._fail(run, why)

    def _handle_exit(self, run: HostRun, code: int | None) -> None:
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

    def _check_silence(self) -> None:
        now = time.monotonic()
        for name, run in self.runs.items():
            silent = now - self.last_seen.get(name, now)
            if run.state in (HostState.RUNNING, HostState.STOPPING) and silent > LOST_AFTER:
                self._mark_lost(run, f"no word from {name} for {LOST_AFTER:.0f}s (host down or link lost)")

    # -- main loop --------------------------------------------------------------------------
    def run(self) -> RunResult:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logs = {name: (self.run_dir / f"{name}.log").open("a", buffering=1) for name in self.runs}
        stop_beats = threading.Event()
        threading.Thread(target=self._heartbeats, args=(stop_beats,), daemon=True).start()
        for launch in self.plan.hosts:
            self.cb.on_state(self.runs[launch.host.name])
            threading.Thread(target=self._start_host, args=(launch,), daemon=True).start()
        interrupts = 0
        try:
            next_check = time.monotonic() + CHECK_EVERY
            while True:
                try:  # the whole iteration: a Ctrl-C may land anywhere in it
                    if all(r.done for r in self.runs.values()):
                        break
                    with contextlib.suppress(queue.Empty):
                        name, kind, payload = self.events.get(timeout=CHECK_EVERY)
                        self._handle(name, kind, payload)
                    if time.monotonic() >= next_check:  # on a timer: busy hosts must not starve it
                        next_check = time.monotonic() + CHECK_EVERY
                        self._check_silence()
                        self._check_hang()
                except KeyboardInterrupt:
                    interrupts += 1
                    if interrupts == 1 and self.options.dump_on_interrupt:
                        self.dump_stacks("interrupt")
                    if interrupts == 1:
                        self.stop_all(b"STOP\n", "interrupted: stopping the job on every host "
                                                 "(Ctrl-C again to force)")
                    else:
                        self.stop_all(b"KILL\n", "interrupted again: killing the job on every host")
        finally:
            stop_beats.set()
            for f in self.logs.values():
                f.close()
        return self._result(interrupted=interrupts > 0)

    def dump_stacks(self, why: str) -> None:
        """Every rank's stack into the run directory, and the collapsed summary to the user."""
        from orchestrator.stacks import collect, report_json, report_text

        report = collect(self.pool, [hl.host for hl in self.plan.hosts], self.plan.job_id)
        stamp = time.strftime("%H%M%S")
        (self.run_dir / f"stacks-{why}-{stamp}.json").write_text(json.dumps(report_json(report), indent=2))
        text = report_text(report)
        (self.run_dir / f"stacks-{why}-{stamp}.txt").write_text("\n".join(text) + "\n")
        self.cb.on_notice(f"stacks of every rank ({why}), saved in {self.run_dir}:\n  " + "\n  ".join(text))

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
            self.stop_all(b"STOP\n", "stopping the hung job on every host (--on-hang=stop)")

    def _result(self, interrupted: bool) -> RunResult:
        runs = list(self.runs.values())
        ok = all(r.exit_code == 0 for r in runs) and not interrupted and not self.hung
        code = 0 if ok else (130 if interrupted else 1)
        if len(runs) == 1 and runs[0].exit_code not in (None, 0) and not interrupted:
            code = runs[0].exit_code  # a single host: torchrun's own exit code
        result = RunResult(self.plan.job_id, self.run_dir, runs, code, self.first_failure, interrupted,
                           {hl.host.name: hl.nproc for hl in self.plan.hosts})
        write_summary(self.plan, result)
        return result


def write_summary(plan: LaunchPlan, result: RunResult) -> Path:
    path = result.run_dir / "summary.json"
    data = {
        "job_id": plan.job_id, "job": plan.job.name, "exit_code": result.exit_code,
        "interrupted": result.interrupted, "master": f"{plan.master_addr}:{plan.master_port}",
        "world_size": plan.world_size,
        "first_failure": result.first_failure.host if result.first_failure else None,
        "hosts": [dict(asdict(r), state=r.state.value,
                       duration_s=(r.ended_at - r.started_at) if r.ended_at and r.started_at else None,
                       env=mask_env(plan.hosts[r.node_rank].env), tail=r.tail[-10:])
                  for r in result.hosts],
    }
    path.write_text(json.dumps(data, indent=2, default=str))
    return path


def launch_detached(plan: LaunchPlan, pool: HostPool, run_dir: Path, options: LaunchOptions,
                    notice: Callable[[str], None]) -> dict[str, Any]:
    """Start every host's supervisor as a daemon and return; `ddpctl logs/ps/down` take over."""
    by_name = {hl.host.name: hl for hl in plan.hosts}

    def one(transport: Any) -> dict[str, Any]:
        hl = by_name[transport.host.name]
        return call_agent(transport, "supervise", supervise_request(plan, hl, options, detach=True)).result

    fan = pool.map([h.host for h in plan.hosts], one)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "detached.json").write_text(json.dumps(
        {"job_id": plan.job_id, "started": fan.succeeded,
         "failed": {k: v.to_json() for k, v in fan.failed.items()}}, indent=2, default=str))
    for name, err in fan.failed.items():
        notice(f"{name}: {err.message}")
    return {"started": fan.succeeded, "failed": fan.failed}
