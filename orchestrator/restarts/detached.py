"""`up --detach` with restarts: the restarting loop cannot run in the `up` that returns at once,
and the machine that launched may be gone by the time a host fails. So `ddpctl up` itself, the
same command line without --detach, runs as a daemon on the job's first host
(node_agent/runtime/loops.py) and restarts the job from there: that host needs ddpctl importable by its
interpreter, the job file at the same path (a shared filesystem), and SSH to the other hosts.
`ddpctl down <run id>` ends the loop first, then the job."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from inventory import Job
from orchestrator.errors import HostError, HostErrorKind, LaunchBlocked
from orchestrator.launch.plan import new_job_id
from orchestrator.remote.agent import call_agent
from orchestrator.remote.pool import HostPool

CHECK_TIMEOUT_S = 60.0
PROBE = "import orchestrator.cli"  # what `python -m orchestrator up` needs there


@dataclass(frozen=True)
class LoopStarted:
    host: str
    run_id: str
    pid: int
    log: str


def loop_argv(python: str, argv: Sequence[str], run_id: str) -> list[str]:
    """`ddpctl up` as typed (`argv`: its arguments after the program), without --detach, naming
    the run."""
    return [python, "-m", "orchestrator", *(a for a in argv if a != "--detach"), "--run-id", run_id]


def start_loop(job: Job, pool: HostPool, argv: Sequence[str], cwd: Path) -> LoopStarted:
    """Check that the first host can run the loop, then start it there; LaunchBlocked with the
    fix when it cannot."""
    host = job.hosts[0]
    transport = pool.transport(host)
    probe = transport.run([host.python, "-c", PROBE], timeout=CHECK_TIMEOUT_S)
    if not probe.ok:
        said = (probe.stderr or probe.stdout).strip().splitlines()
        why = said[-1] if said else f"exit {probe.exit_code}"
        raise LaunchBlocked(
            f"{host.name}: ddpctl is not importable by {host.python} there ({why}); a detached job's restarts "
            "are run from its first host\n"
            f"  fix: install ddpctl into that interpreter on {host.name} (`ddpctl doctor` checks it), or run "
            "`up` attached (in tmux or screen), or without restarts")
    if job.source is not None:
        seen = transport.run(["test", "-f", str(job.source.resolve())], timeout=CHECK_TIMEOUT_S)
        if not seen.ok:
            raise LaunchBlocked(f"{host.name}: the job file {job.source.resolve()} is not there; a detached job's "
                                "restarts are run from its first host, with the same files\n"
                                "  fix: keep the job on a filesystem the hosts share, or run `up` attached")
    run_id = new_job_id(job.name)
    reply = call_agent(transport, "loop", {"argv": loop_argv(host.python, argv, run_id), "run_id": run_id,
                                           "job_name": job.name, "cwd": str(cwd)}, timeout=CHECK_TIMEOUT_S)
    data = reply.result
    if data.get("error") or not data.get("pid"):
        raise HostError(host.name, HostErrorKind.AGENT, f"the restart loop did not start: {data.get('error')}",
                        "see its log in ~/.ddpctl/loops/ on that host")
    return LoopStarted(host.name, run_id, int(data["pid"]), str(data.get("log")))
