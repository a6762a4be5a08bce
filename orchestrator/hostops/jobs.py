"""`ps`, `down` and `logs` on every host: jobs found through each host's run state; `logs` merges
the hosts' output by the time each line was written."""

from __future__ import annotations

import contextlib
import functools
import getpass
import heapq
import queue
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TypeVar

from inventory import Host, Inventory
from orchestrator.remote.agent import AgentEvent, AgentResult, agent_failed, call_agent, no_result, start_agent
from orchestrator.remote.pool import FanOut, HostPool
from orchestrator.remote.transport import OutputLine, Transport
from orchestrator.remote.wire import (
    LogLine,
    LogsFound,
    RunningJob,
    StoppedJob,
    decode_log_event,
    parse_down,
    parse_logs,
    parse_ps,
)

LineSink = Callable[[str, str], None]  # (host, line)
T = TypeVar("T")
SHOWN_HOSTS = 5
PRINT_BATCH = 4096  # merged lines handed to the sink at once
QUEUED_BATCHES = 8  # a host's batches (log events) waiting for the merge, where every host has a thread
LOOP_STOP_S = 90.0  # a restart loop ends its job on every host (node_agent/runtime/loops.py STOP_WAIT_S) within this


LogSink = Callable[[Sequence[LogLine]], None]  # a batch of lines, in the order to show them


@dataclass(frozen=True)
class JobAbsent:
    """No host that answered has the job (`down`: running; `logs`: its log): a user error, exit 1."""

    job: str
    has: str  # what no host has, e.g. "it running"
    answered: tuple[str, ...]  # hosts that answered (the others failed and report themselves)
    asked: int
    inventory_source: Path | None  # None: the built-in localhost inventory

    @property
    def message(self) -> str:
        shown = ", ".join(self.answered[:SHOWN_HOSTS]) + (", ..." if len(self.answered) > SHOWN_HOSTS else "")
        hosts = "host" if self.asked == 1 else "hosts"
        if len(self.answered) < self.asked:
            checked = f"{len(self.answered)} of {self.asked} {hosts}: {shown}; the others failed"
        else:
            checked = f"{self.asked} {hosts}: {shown}"
        return f"job {self.job}: no host has {self.has} (checked {checked})"

    @property
    def fix(self) -> str:
        source = self.inventory_source
        ps = f"ddpctl ps -i {source}" if source is not None else "ddpctl ps"
        elsewhere = "" if source is not None else "; for a job on other hosts add -i hosts.toml, or give its job.toml"
        return f"check the job id: `{ps}` lists running jobs and their ids{elsewhere}"


def _absent(job: str, has: str, inventory: Inventory, fan: FanOut[T], present: Callable[[T], bool]) -> JobAbsent | None:
    """A JobAbsent when at least one host answered and none of the answers has the job."""
    if not fan.succeeded or any(present(answer) for answer in fan.succeeded.values()):
        return None
    answered = tuple(h.name for h in inventory.hosts if h.name in fan.succeeded)
    return JobAbsent(job, has, answered, len(inventory.hosts), inventory.source)


def down_absent(job: str, inventory: Inventory, fan: FanOut[list[StoppedJob]]) -> JobAbsent | None:
    """`down` stopped nothing anywhere: the job is unknown (or already over) on every host."""
    return _absent(job, "it running", inventory, fan, lambda stopped: bool(stopped))


def logs_absent(job: str, inventory: Inventory, fan: FanOut[LogsFound]) -> JobAbsent | None:
    """`logs` found no log of the job on any host."""
    return _absent(job, "a log of it", inventory, fan, lambda found: found.found)


def running_jobs(pool: HostPool, hosts: Sequence[Host], job: str | None = None) -> FanOut[list[RunningJob]]:
    """Every ddpctl job (or only `job`, an id or name) running on each host."""
    return pool.map(hosts, lambda t: parse_ps(t.host.name, call_agent(t, "ps", {"job": job}).result))


def stop_job(pool: HostPool, hosts: Sequence[Host], job: str, grace: float) -> FanOut[list[StoppedJob]]:
    """Stop `job` on every host: SIGTERM, then SIGKILL after `grace`; what each host ended. A
    detached restart loop of it goes first, everywhere (node_agent/runtime/loops.py): it stops the job
    itself and restarts nothing; only then are the supervisors stopped."""
    loops = pool.map(hosts, lambda t: parse_down(call_agent(t, "down", {"job": job, "loops_only": True},
                                                            timeout=LOOP_STOP_S).result))
    by = f"by {getpass.getuser()} on {socket.gethostname()}"
    fan = pool.map(hosts, lambda t: parse_down(call_agent(t, "down", {"job": job, "grace": grace, "by": by},
                                                          timeout=grace + 60).result))
    for host, stopped in loops.succeeded.items():
        if stopped and host in fan.succeeded:
            fan.succeeded[host] = [*stopped, *fan.succeeded[host]]
    return fan


def merge_logs(streams: Sequence[Iterable[LogLine]]) -> Iterator[LogLine]:
    """The hosts' lines in one stream by time. Stable: equal times keep the streams' order, and each
    stream's own order is always kept (a host whose clock stepped back is not reordered)."""
    return heapq.merge(*streams, key=lambda line: line.time)


def _batched(lines: Iterator[LogLine], size: int) -> Iterator[list[LogLine]]:
    while batch := list(islice(lines, size)):
        yield batch


def _host_logs(transport: Transport, job: str, follow: bool, put: Callable[[list[LogLine]], None]) -> LogsFound:
    """One host's logs op: every batch of its lines to `put`, in its order; what it found."""
    host = transport.host.name
    agent = start_agent(transport, "logs", {"job": job, "follow": follow})
    agent.close_stdin()
    found: LogsFound | None = None
    last = 0.0  # the time of this host's last line: where a stray line (agent stderr) goes
    try:
        for message in agent.messages():
            if isinstance(message, AgentEvent) and message.name == "log":
                batch = decode_log_event(host, message.fields)
                last = batch[-1].time
                put(batch)
            elif isinstance(message, OutputLine):
                put([LogLine(last, host, None, message.text)])
            elif isinstance(message, AgentResult):
                if message.error is not None:
                    raise agent_failed(host, message.error)
                found = parse_logs(message.data)
    except BaseException:
        agent.abort()
        raise
    code = agent.wait()
    if found is None:
        raise no_result(host, f"(exit {code}) {' | '.join(agent.other[-5:])}")
    return found


class _Abandoned(Exception):
    """The merge stopped reading (it failed, or Ctrl-C): the hosts' threads stop sending."""


class _Streams:
    """Each host's batches of lines on their way from its thread to the merge, in its order."""

    def __init__(self, hosts: Sequence[Host], size: int) -> None:
        self.end_mark: list[LogLine] = []  # a host's end of stream (this very list)
        self.queues: dict[str, queue.Queue[list[LogLine]]] = {h.name: queue.Queue(size) for h in hosts}
        self.abandoned = threading.Event()

    def put(self, host: str, batch: list[LogLine]) -> None:
        while not self.abandoned.is_set():
            with contextlib.suppress(queue.Full):
                self.queues[host].put(batch, timeout=0.2)
                return
        raise _Abandoned

    def end(self, host: str) -> None:
        with contextlib.suppress(_Abandoned):
            self.put(host, self.end_mark)

    def lines(self, host: str) -> Iterator[LogLine]:
        while (batch := self.queues[host].get()) is not self.end_mark:
            yield from batch


def job_logs(pool: HostPool, hosts: Sequence[Host], job: str, follow: bool, sink: LogSink) -> FanOut[LogsFound]:
    """Replay every host's output of `job` into `sink`, merged by time (see merge_logs); with
    follow, until the job ends, each host's lines as they arrive."""
    if follow:
        lock = threading.Lock()

        def show(batch: list[LogLine]) -> None:
            with lock:
                sink(batch)

        return pool.map(hosts, lambda t: _host_logs(t, job, True, show))
    # Bounded while every host streams at once (the merge waits only on a host that sends), so a
    # host ahead of the others waits with its log on its node; else the merge could wait for a
    # host that waits for a thread held by one whose queue is full.
    streams = _Streams(hosts, QUEUED_BATCHES if len(hosts) <= pool.max_parallel else 0)
    outcome: list[FanOut[LogsFound] | BaseException] = []

    def one(transport: Transport) -> LogsFound:
        try:
            return _host_logs(transport, job, False, functools.partial(streams.put, transport.host.name))
        finally:
            streams.end(transport.host.name)

    def fan_out() -> None:
        try:
            outcome.append(pool.map(hosts, one))
        except BaseException as exc:  # raised again in the caller's thread
            outcome.append(exc)
        finally:
            for host in hosts:  # a host that failed before its op started ends here
                streams.end(host.name)

    worker = threading.Thread(target=fan_out, name="ddpctl-logs", daemon=True)
    worker.start()
    try:
        for batch in _batched(merge_logs([streams.lines(h.name) for h in hosts]), PRINT_BATCH):
            sink(batch)
    finally:
        streams.abandoned.set()  # all read already, or no one reads any more
    worker.join()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]
