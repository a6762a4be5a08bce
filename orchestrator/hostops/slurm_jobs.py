"""`ps`, `down` and `logs` for Slurm jobs: squeue, scancel and the job's files on the cluster
(no sacct). A job is named by its Slurm id, its ddpctl id, or its job name (the newest)."""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from inventory.specs import SlurmSpec
from node_agent.wire.layout import (
    SLURM_DOWN_MARK,
    SLURM_FOLLOW_PATTERN,
    SLURM_JOB_COMMENT,
    SLURM_NODE_FILE,
    slurm_runs_dir,
    slurm_state_dir,
)
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.hostops.stacks import StacksReport, assemble
from orchestrator.remote.agent import AgentEvent, AgentResult, decode, start_agent
from orchestrator.remote.slurm_client import QueuedJob, SlurmClient, on_every_node
from orchestrator.remote.transport import OutputLine
from orchestrator.remote.wire import parse_supervise

SLURM_STACKS_TIMEOUT_S = 120.0  # py-spy on every node of the job, together

LineSink = Callable[[str, str], None]  # (node, line)
GONE_TIMEOUT_S = 120.0


DEFAULT_CONF = Path("/etc/slurm/slurm.conf")


def configured_here() -> bool:
    """Slurm's client is on this machine and finds its configuration (SLURM_CONF, else the
    default path): a plain `ddpctl ps` then asks Slurm too."""
    if shutil.which("squeue") is None:
        return False
    conf = os.environ.get("SLURM_CONF")
    return Path(conf).is_file() if conf else DEFAULT_CONF.is_file()


def ddpctl_jobs(client: SlurmClient) -> list[QueuedJob]:
    """This user's ddpctl jobs in Slurm's queue (pending, running, completing)."""
    return [j for j in client.jobs(SLURM_JOB_COMMENT) if j.active]


@dataclass(frozen=True)
class SlurmTarget:
    job_id: str  # ddpctl's
    slurm_id: str | None  # None: no longer known to Slurm
    state: str | None


def find(client: SlurmClient, target: str) -> SlurmTarget | None:
    """The job the user means: a Slurm id, a ddpctl job id, a job name (its newest run), or a
    restarted run's id (its newest attempt, `<run id>.<n>`)."""
    if target.isdigit():
        job = client.job(target)
        if job is None or job.comment != SLURM_JOB_COMMENT:
            return None
        return SlurmTarget(job.name, job.job_id, job.state)
    named = (f"{target}-", f"{target}.")  # a job name's runs; a run id's attempts
    queued = [j for j in client.jobs(SLURM_JOB_COMMENT) if j.name == target or j.name.startswith(named)]
    if queued:
        job = max(queued, key=lambda j: int(j.job_id))
        return SlurmTarget(job.name, job.job_id, job.state)
    runs = slurm_runs_dir(client.home())
    listing = client.run(["ls", "-1t", "--", runs], check=False).stdout.split()
    for name in listing:  # newest first: a finished job's files are still there
        ours = re.fullmatch(r".*-\d{8}-\d{6}-[0-9a-f]{4}(\.\d+)?", name) is not None  # a job id (an attempt's)
        if (name == target or (name.startswith(named) and ours)) \
                and client.read(f"{runs}/{name}/job.sbatch") is not None:
            return SlurmTarget(name, None, None)
    return None


def not_found(client: SlurmClient, target: str) -> HostError:
    return HostError(client.transport.host.name, HostErrorKind.SLURM,
                     f"no ddpctl Slurm job {target} on {client.where} (in squeue or under ~/.ddpctl/runs)",
                     "`ddpctl ps --backend slurm` lists them; give the Slurm job id, the ddpctl job id or "
                     "the job.toml")


def cancel(client: SlurmClient, target: SlurmTarget, timeout: float = GONE_TIMEOUT_S) -> str:
    """scancel the job and wait until Slurm has ended every process of it; its final state."""
    if target.slurm_id is None:
        return "ended"
    who = f"`ddpctl down` by {getpass.getuser()} on {socket.gethostname()}"
    with contextlib.suppress(HostError):  # the mark lets an attached `up` say who; the cancel goes on without
        client.write(f"{slurm_state_dir(client.home(), target.job_id)}/{SLURM_DOWN_MARK}", who.encode())
    client.cancel(target.slurm_id)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.job(target.slurm_id)
        if job is None or not job.active:
            return job.state if job is not None else "ended"
        time.sleep(0.5)
    raise HostError(client.transport.host.name, HostErrorKind.TIMEOUT,
                    f"Slurm job {target.slurm_id} still {job.state if job else '?'} {timeout:.0f}s after scancel",
                    f"check `squeue -j {target.slurm_id}` and the nodes' slurmd logs")


def show_line(name: str, text: str, sink: LineSink) -> None:
    """One line of the job's files as `logs` shows it: program output per node; the node
    supervisor's own events only where they say something (its error, its exit)."""
    m = SLURM_NODE_FILE.match(name)
    node = f"node{m.group('node')}" if m else "batch"
    message = decode(OutputLine("stdout", text))
    if isinstance(message, OutputLine):
        sink(node, message.text)
    elif isinstance(message, AgentResult):
        sink(node, f"(node exited {parse_supervise(message.data).exit_code})")
    elif isinstance(message, AgentEvent) and message.name == "error":
        sink(node, f"error: {message.get('message')}")


def logs(client: SlurmClient, target: SlurmTarget, follow: bool, sink: LineSink) -> None:
    """Replay every node's output (every run of a requeued job); with follow, until it ends."""
    state = slurm_state_dir(client.home(), target.job_id)
    stream = start_agent(client.transport, "follow", {"dir": state, "pattern": SLURM_FOLLOW_PATTERN, "poll": 0.2})
    if not follow:
        stream.send(b"STOP\n")  # one pass over what is there
    stopped = not follow
    last_poll = time.monotonic()
    for message in stream.messages():
        if isinstance(message, AgentEvent) and message.name == "line":
            show_line(str(message.get("name")), str(message.get("text")), sink)
        if not stopped and time.monotonic() - last_poll > 1.0:
            last_poll = time.monotonic()
            job = client.job(target.slurm_id) if target.slurm_id else None
            if job is None or not job.active:
                stream.send(b"STOP\n")
                stopped = True
    stream.wait(10)


def stacks(client: SlurmClient, target: SlurmTarget, spec: SlurmSpec) -> StacksReport:
    """Every rank's stack of a running job, py-spy on each node through `srun --overlap`."""
    if target.slurm_id is None or target.state != "RUNNING":
        raise HostError(client.transport.host.name, HostErrorKind.SLURM,
                        f"Slurm job {target.slurm_id or target.job_id} is not running ({target.state or 'ended'})",
                        "`ddpctl ps --backend slurm` lists the running ones")
    count = client.show_job(target.slurm_id).get("NumNodes", "1").split("-")[0]
    names = [f"node{i}" for i in range(int(count) if count.isdigit() else 1)]
    replies, errors = on_every_node(client, spec, target.slurm_id, names, "stacks",
                                    {"job": target.job_id, "python": spec.python},
                                    f"{slurm_state_dir(client.home(), target.job_id)}/stacks", SLURM_STACKS_TIMEOUT_S)
    return assemble(target.job_id, replies, {name: err.message for name, err in errors.items()})
