"""`ps`, `down` and `logs` on every host: jobs found through each host's run state."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from inventory import Host
from orchestrator.remote.agent import AgentResult, call_agent, start_agent
from orchestrator.remote.pool import FanOut, HostPool
from orchestrator.remote.transport import OutputLine, Transport
from orchestrator.remote.wire import LogsFound, RunningJob, StoppedJob, parse_down, parse_logs, parse_ps

LineSink = Callable[[str, str], None]  # (host, line)


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
