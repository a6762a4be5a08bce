"""Slurm's own client commands (sbatch, squeue, scontrol, scancel), run on this machine or on a
login node over ddpctl's SSH transport (same host-key rules). No sacct: many clusters have no
accounting database, so job state comes from squeue and `scontrol show job`."""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inventory import LOCALHOST, Host, Inventory
from inventory.specs import SlurmSpec
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.remote.agent import AgentResult, agent_argv, decode, parse_reply, request_bytes
from orchestrator.remote.pool import HostPool
from orchestrator.remote.transport import CommandResult, OutputLine, Transport

ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                           "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"})
QUEUED_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
SQUEUE_FORMAT = "%i|%T|%r|%N|%j|%M|%k"
# Writes stdin to $1 (mode 0600 whatever the umask), creating its directory.
WRITE_FILE = 'umask 077 && mkdir -p -- "$(dirname -- "$1")" && cat > "$1" && chmod "$2" "$1"'


@dataclass(frozen=True)
class QueuedJob:
    """One line of squeue."""

    job_id: str
    state: str
    reason: str
    nodes: str
    name: str
    elapsed: str
    comment: str

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def queued(self) -> bool:
        return self.state in QUEUED_STATES


def parse_squeue(text: str) -> list[QueuedJob]:
    jobs = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) == 7:
            jobs.append(QueuedJob(*(p.strip() for p in parts)))
    return jobs


def parse_key_values(text: str) -> dict[str, str]:
    """`scontrol show -o` output: Key=Value tokens (a value may hold '=', never a space)."""
    out: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep:
            out[key] = value
    return out


NODE_REASON = re.compile(r"\bReason=(?P<reason>.*?)(?= [A-Za-z/]+=|$)")


def parse_nodes(text: str) -> dict[str, dict[str, str]]:
    """`scontrol -o show node`: NodeName -> its fields (Reason may hold spaces: "Not responding")."""
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        fields = parse_key_values(line)
        if "NodeName" not in fields:
            continue
        m = NODE_REASON.search(line)
        if m is not None:
            fields["Reason"] = m.group("reason").strip()
        out[fields["NodeName"]] = fields
    return out


def parse_config(text: str) -> dict[str, str]:
    """`scontrol show config`: "Key = Value" lines."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" = ")
        if sep:
            out[key.strip()] = value.strip()
    return out


class SlurmClient:
    """Slurm's commands where they run: `transport` is this machine's or the login node's."""

    def __init__(self, transport: Transport, login: str | None = None) -> None:
        self.transport = transport
        self.login = login
        self.where = f"login node {login}" if login else "this machine"
        self._home: str | None = None

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float = 60.0,
            check: bool = True) -> CommandResult:
        result = self.transport.run(list(argv), stdin=stdin, timeout=timeout)
        if check and result.exit_code != 0:
            raise self.failed(argv, result)
        return result

    def failed(self, argv: Sequence[str], result: CommandResult) -> HostError:
        said = (result.stderr.strip() or result.stdout.strip()).splitlines()
        if result.exit_code == 127 or any("not found" in line and argv[0] in line for line in said):
            fix = (f"install the Slurm client on {self.where} or set [slurm] login = \"<login node>\""
                   if not self.login else
                   f"check that {argv[0]} is on the PATH of {self.login}'s non-interactive shell")
            return HostError(self.transport.host.name, HostErrorKind.SLURM,
                             f"{argv[0]} is not available on {self.where}", fix)
        return HostError(self.transport.host.name, HostErrorKind.SLURM,
                         f"{argv[0]} failed on {self.where} (exit {result.exit_code}): " + " / ".join(said[-3:]),
                         f"the command was: {shlex.join(argv)}")

    # -- files on the cluster side ----------------------------------------------------------
    def home(self) -> str:
        if self._home is None:
            self._home = self.run(["sh", "-c", 'printf %s "$HOME"']).stdout.strip()
        return self._home

    def write(self, path: str, data: bytes, mode: int = 0o600) -> None:
        self.run(["sh", "-c", WRITE_FILE, "ddpctl-write", path, f"{mode:o}"], stdin=data)

    def read(self, path: str) -> str | None:
        result = self.run(["cat", "--", path], check=False)
        return result.stdout if result.exit_code == 0 else None

    # -- jobs -------------------------------------------------------------------------------
    def submit(self, argv: Sequence[str]) -> str:
        """`sbatch --parsable ...`: the job id ("123", or "123;cluster")."""
        out = self.run(argv, timeout=120.0).stdout.strip()
        job_id = out.splitlines()[-1].split(";")[0].strip() if out else ""
        if not job_id.isdigit():
            raise HostError(self.transport.host.name, HostErrorKind.SLURM,
                            f"sbatch gave no job id on {self.where}: {out!r}", "")
        return job_id

    def job(self, job_id: str) -> QueuedJob | None:
        """The job as squeue sees it; None once it has left the queue."""
        result = self.run(["squeue", "-h", "-j", job_id, "-t", "all", "-o", SQUEUE_FORMAT], check=False)
        if result.exit_code != 0:
            if "Invalid job id" in result.stderr:
                return None
            raise self.failed(["squeue"], result)
        jobs = [j for j in parse_squeue(result.stdout) if j.job_id == job_id]
        return jobs[0] if jobs else None

    def jobs(self, comment: str | None = None) -> list[QueuedJob]:
        """This user's jobs in the queue (with `comment`: only those carrying it)."""
        out = self.run(["squeue", "-h", "--me", "-o", SQUEUE_FORMAT]).stdout
        return [j for j in parse_squeue(out) if comment is None or j.comment == comment]

    def show_job(self, job_id: str) -> dict[str, str]:
        result = self.run(["scontrol", "-o", "show", "job", job_id], check=False)
        return parse_key_values(result.stdout) if result.exit_code == 0 else {}

    def show_nodes(self, nodelist: str) -> dict[str, dict[str, str]]:
        """`scontrol show node` for a hostlist ("c[1-2]"); {} when Slurm does not answer."""
        if not nodelist or nodelist == "(null)":
            return {}
        result = self.run(["scontrol", "-o", "show", "node", nodelist], check=False)
        return parse_nodes(result.stdout) if result.exit_code == 0 else {}

    def cancel(self, job_id: str, signal: str | None = None, batch_only: bool = False) -> None:
        argv = ["scancel"] + ([f"--signal={signal}"] if signal else []) + (["--batch"] if batch_only else [])
        self.run([*argv, job_id], check=False)

    def config(self) -> dict[str, str]:
        return parse_config(self.run(["scontrol", "show", "config"]).stdout)

    def partition(self, name: str | None) -> dict[str, str] | None:
        """The named partition, or the default one (None: no such partition)."""
        out = self.run(["scontrol", "-o", "show", "partition"] + ([name] if name else []), check=False)
        if out.exit_code != 0:
            return None
        for line in out.stdout.splitlines():
            fields = parse_key_values(line)
            if name is not None or fields.get("Default") == "YES":
                return fields
        return None


def login_host(login: str | None, inventory: Inventory) -> Host:
    """Where Slurm's commands run: the login node (an inventory host, or an SSH destination
    `[user@]host` that ssh_config may alias), else this machine."""
    if login is None:
        return LOCALHOST
    known = inventory.get(login)
    if known is not None:
        return known
    user, _, host = login.rpartition("@")
    return Host(name=login, address=host, user=user or None)


def slurm_client(pool: HostPool, login: str | None, inventory: Inventory) -> SlurmClient:
    return SlurmClient(pool.transport(login_host(login, inventory)), login)


# -- the node agent on every node of an allocation ---------------------------------------------

def node_script(spec: SlurmSpec) -> str:
    """Each task: the job's setup lines, then the node agent (its request comes on stdin)."""
    return "\n".join(["#!/bin/bash", "set -e", *spec.setup, f"exec {shlex.join(agent_argv(spec.python))}", ""])


def task_reply(name: str, rank: int, text: str) -> Mapping[str, Any]:
    """The op's result in a task's output file; a task that ended without one is that node's error."""
    lines = text.splitlines()
    if not any(isinstance(decode(OutputLine("stdout", line)), AgentResult) for line in lines):
        tail = " / ".join(line for line in lines[-3:] if line.strip()) or "(no output)"
        raise HostError(name, HostErrorKind.AGENT, f"the task ended without the node agent's result: {tail}",
                        "check [slurm] setup and python: the task runs the setup lines, then python (else python3)")
    return parse_reply(CommandResult(name, ("srun",), 0, text, "", 0.0)).result


def on_every_node(client: SlurmClient, spec: SlurmSpec, slurm_id: str, nodes: Sequence[str], op: str,
                  request: Mapping[str, Any], under: str, timeout_s: float
                  ) -> tuple[dict[str, Mapping[str, Any]], dict[str, HostError]]:
    """Run one node agent op on every node of a running job (`srun --overlap`, one task per node,
    the job's setup lines first): each node's result, or why it gave none. `nodes`: names in task
    order; the files go to a fresh directory `under-<random>` and are removed after."""
    where = f"{under}-{secrets.token_hex(3)}"
    replies: dict[str, Mapping[str, Any]] = {}
    errors: dict[str, HostError] = {}
    try:
        client.write(f"{where}/node.in", request_bytes(op, dict(request, dir=where)))
        client.write(f"{where}/node.sh", node_script(spec).encode(), 0o700)
        ran = client.run(["srun", "--overlap", f"--jobid={slurm_id}", f"--nodes={len(nodes)}", "--ntasks-per-node=1",
                          f"--input={where}/node.in", f"--output={where}/node-%t.out", "bash", f"{where}/node.sh"],
                         timeout=timeout_s, check=False)
        said = (ran.stderr.strip().splitlines() or ["(no output)"])[-1]
        for rank, name in enumerate(nodes):
            text = client.read(f"{where}/node-{rank}.out")
            try:
                if text is None:
                    raise HostError(name, HostErrorKind.SLURM, f"srun ran nothing there: {said}", "")
                replies[name] = task_reply(name, rank, text)
            except HostError as err:
                errors[name] = err
    except HostError as err:
        errors.update({name: err for name in nodes})
    finally:
        client.run(["rm", "-rf", "--", where], check=False)
    return replies, errors
