"""`ps`, `down` and `logs` on every host: jobs found through each host's run state."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from inventory import Host, Inventory
from orchestrator.remote.agent import AgentResult, call_agent, start_agent
from orchestrator.remote.pool import FanOut, HostPool
from orchestrator.remote.transport import OutputLine, Transport
from orchestrator.remote.wire import LogsFound, RunningJob, StoppedJob, parse_down, parse_logs, parse_ps

LineSink = Callable[[str, str], None]  # (host, line)
T = TypeVar("T")
SHOWN_HOSTS = 5


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
    """Stop `job` on every host: SIGTERM, then SIGKILL after `grace`; what each host ended."""
    return pool.map(hosts, lambda t: parse_down(call_agent(t, "down", {"job": job, "grace": grace},
                                                           timeout=grace + 60).result))


def job_logs(pool: HostPool, hosts: Sequence[Host], job: str, follow: bool, sink: LineSink) -> FanOut[LogsFound]:
    """Replay (or follow until the job ends) every host's output of `job` into `sink`."""

    def stream(transport: Transport) -> LogsFound:
        agent = start_agent(transport, "logs", {"job": job, "follow": follow})
        agent.close_stdin()
        found = LogsFound(False, None, None, False)
        for message in agent.messages():
            if isinstance(message, OutputLine):
                sink(transport.host.name, message.text)
            elif isinstance(message, AgentResult):
                found = parse_logs(message.data)
        agent.wait()
        return found

    return pool.map(hosts, stream)
