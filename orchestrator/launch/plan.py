"""Pure launch planning: job ids, node ranks, the exact torchrun argv per host, masked env.

The dry run prints exactly this plan; backends turn it into running processes."""

from __future__ import annotations

import re
import secrets
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass

from inventory import Host, Job
from inventory.gpus import selection_env
from orchestrator.launch.inline import InlineProgram

SECRET_PATTERN = re.compile(r"TOKEN|KEY|PASSWORD|PASSWD|SECRET|CREDENTIAL", re.IGNORECASE)
MASK = "***"
SLURM_RDZV_ENV = "PET_RDZV_ENDPOINT"  # torchrun's --rdzv-endpoint, from the environment
ATTEMPT_ENV = "DDPCTL_ATTEMPT"  # 0, 1, ...: which attempt of the run this is
RUN_ID_ENV = "DDPCTL_RUN_ID"  # the same for every attempt
PREV_FAILURE_ENV = "DDPCTL_PREV_FAILURE"  # one line: host, rank, reason (attempts after the first)
CHECKPOINT_DIR_ENV = "DDPCTL_CHECKPOINT_DIR"  # [restart] checkpoint_dir
TOTAL_STEPS_ENV = "DDPCTL_TOTAL_STEPS"  # [watch] total_steps; the rank wrapper reports it with the steps
NODE_RANK_ENV = "DDPCTL_NODE_RANK"  # a per-host program's node rank (InlineProgram.per_host)
NNODES_ENV = "DDPCTL_NNODES"  # ... how many hosts run it
COORDINATOR_ENV = "DDPCTL_COORDINATOR"  # ... and the master's host:port, where node 0 coordinates them


def new_job_id(name: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", name)[:40] or "job"
    return f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (MASK if SECRET_PATTERN.search(k) else v) for k, v in env.items()}


class Nproc(int):
    """A host's resolved process count, and what decided it ("hostfile slots", "auto: GPUs", ...):
    what the dry run shows beside it. An int everywhere else."""

    source: str

    def __new__(cls, value: int, source: str) -> Nproc:
        made = super().__new__(cls, value)
        made.source = source
        return made


@dataclass(frozen=True)
class HostLaunch:
    """What runs on one host: the torchrun launcher argv, the program argv, env and workdir."""

    host: Host
    node_rank: int
    nproc: int
    launcher: tuple[str, ...]  # python -m torch.distributed.run + its options
    program: tuple[str, ...]  # script (or -m module) + the job's args
    env: Mapping[str, str]
    cwd: str
    wrapped: bool = False  # each rank starts through the node's rank wrapper (node_agent/rank/rankwrap.py)
    nproc_source: str = ""  # what decided nproc: the job's nproc_per_node, the host's slots, ...
    # the global rank of its local rank 0: the ranks of the hosts before it (they may run more or
    # fewer processes: torchrun numbers the ranks by each node's own count); None: node_rank * nproc
    first_rank: int | None = None
    modules: tuple[str, ...] = ()  # an inline program's modules: its node's supervisor writes them out for it

    def argv(self, log_dir: str | None = None, wrapper: str | None = None) -> list[str]:
        """The command the node runs (its supervisor adds its own log dir and wrapper path)."""
        extra = ["--log-dir", log_dir] if log_dir else []
        extra += [wrapper] if wrapper and self.wrapped else []
        return [*self.launcher, *extra, *self.program]

    def display(self, log_dir: str | None = None, wrapper: str | None = None) -> str:
        """The command as a shell line; log_dir and wrapper are shown as given (they may start
        with ~); the wrapper, where the ranks are wrapped, goes before the program."""
        extra = f" --log-dir {log_dir}" if log_dir else ""
        extra += f" {wrapper}" if wrapper and self.wrapped else ""
        return shlex.join(self.launcher) + extra + " " + shlex.join(self.program)

    def rank_of(self, local_rank: int) -> int:
        first = self.first_rank if self.first_rank is not None else self.node_rank * self.nproc
        return first + local_rank


@dataclass(frozen=True)
class LaunchPlan:
    job: Job
    job_id: str
    master_addr: str
    master_port: int
    hosts: tuple[HostLaunch, ...]
    run_id: str | None = None  # a restarted job's id, the same for every attempt (each has its own job_id)

    @property
    def world_size(self) -> int:
        return sum(h.nproc for h in self.hosts)


def program_argv(job: Job, host: Host, inline: InlineProgram | None = None) -> list[str]:
    """The script (or `-m module`, as the rank wrapper takes it) and the job's own arguments; or
    an inline program's full argv (torchrun runs it with --no-python, unwrapped; its modules travel
    in the supervise request, not here)."""
    if inline is not None:
        return list(inline.argv(host.python))
    return [*(["-m", job.module] if job.module else [job.script or ""]), *job.args]


def launcher_argv(job: Job, host: Host, node_rank: int, nproc: int, master_addr: str,
                  master_port: int, job_id: str, inline: bool = False, per_host: bool = False,
                  local_addr: str | None = None) -> list[str]:
    """torchrun's argv up to the program. `local_addr`: the host's own address for the c10d
    rendezvous (torchrun --local-addr), which otherwise looks the host's name up and hands it to
    the other hosts: a name that resolves nowhere, or to loopback, hangs the launch. Node 0 holds
    the c10d rendezvous store (the endpoint is the master's address)."""
    argv = [host.python, "-m", "torch.distributed.run", "--nnodes", "1" if per_host else str(len(job.hosts)),
            "--nproc-per-node", str(nproc)]
    if per_host:  # a world of its own on each host: no host waits for another to start; its
        # workers dial their own agent's store on loopback, never by the host's name (which may resolve nowhere)
        argv += ["--standalone", "--local-addr", "127.0.0.1"]
    elif job.slurm is not None:  # the endpoint is the allocation's first node: the batch script sets it
        argv += ["--rdzv-backend", "c10d", "--rdzv-id", job_id]
        if job.slurm.requeue:  # the early warning reaches the ranks as a Python signal
            argv += ["--signals-to-handle", f"SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIG{job.slurm.signal_name}"]
    elif job.rendezvous.backend == "c10d":
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{_bracket(master_addr)}:{master_port}",
                 "--rdzv-id", job_id]
        # which host holds the rendezvous store, said rather than guessed (torch matches the
        # endpoint against the host's own name, looked up: a name that resolves nowhere fails)
        argv += ["--rdzv-conf", f"is_host={int(node_rank == 0)}"]
        argv += ["--local-addr", local_addr] if local_addr else []
    else:
        argv += ["--node-rank", str(node_rank), "--master-addr", master_addr,
                 "--master-port", str(master_port)]
    # each rank's output goes to its own files; the node supervisor reads them (node_agent/runtime/ranklogs.py)
    argv += ["--max-restarts", "0", "--redirects", "3"]
    if inline:
        argv.append("--no-python")
    return argv


def _local_addr(job: Job, host: Host, local_only: bool, given: Mapping[str, str] | None) -> str | None:
    """The address a host's c10d rendezvous gives for it: the one it reported (`given`), or
    loopback where no other host dials it (this machine's hosts only, or one host)."""
    if given and host.name in given:
        return given[host.name]
    return "127.0.0.1" if local_only or len(job.hosts) == 1 else None


def _bracket(addr: str) -> str:
    return f"[{addr}]" if ":" in addr else addr


def host_env(job: Job, host: Host, job_id: str, picked: Mapping[str, str] | None = None) -> dict[str, str]:
    """Host env < job env; a host's `gpus = [0, 2]` then sets CUDA_VISIBLE_DEVICES (an explicit
    one naming other GPUs is refused before: inventory.gpus). `picked`: the interface variables
    ddpctl settled for this host (only ones the job leaves unset)."""
    env = {**(picked or {}), **host.env, **job.env}
    env.update(selection_env(host, env))
    env["DDPCTL_JOB_ID"] = job_id
    # what a script needs to resume: orchestrator/restarts/loop.py sets them per attempt in the
    # job's env; a job that is not restarted runs attempt 0 of a run of its own
    env.setdefault(ATTEMPT_ENV, "0")
    env.setdefault(RUN_ID_ENV, job_id)
    if job.restart.checkpoint_dir is not None:
        env.setdefault(CHECKPOINT_DIR_ENV, job.restart.checkpoint_dir)
    if job.watch.total_steps is not None:  # the ETA's total (a script may also set it itself)
        env.setdefault(TOTAL_STEPS_ENV, str(job.watch.total_steps))
    return env


def per_host_env(node_rank: int, nnodes: int, master_addr: str, master_port: int) -> dict[str, str]:
    """Where a per-host program (InlineProgram.per_host) finds the others: its node rank, how many
    hosts, and the coordinator's host:port (the master's)."""
    return {NODE_RANK_ENV: str(node_rank), NNODES_ENV: str(nnodes),
            COORDINATOR_ENV: f"{_bracket(master_addr)}:{master_port}"}


def build_plan(job: Job, job_id: str, nprocs: Mapping[str, int], master_port: int,
               inline: InlineProgram | None = None, *, master_addr: str | None = None,
               picked_env: Mapping[str, Mapping[str, str]] | None = None,
               local_addrs: Mapping[str, str] | None = None) -> LaunchPlan:
    """One HostLaunch per selected host, in node-rank order. `nprocs` is resolved per host;
    `inline` replaces the job's script with a program ddpctl ships with its agent; `master_addr`,
    `picked_env` and `local_addrs` (per host: the address it reported, checks/addressing.py
    Addressing.own) are what the hosts' routes settled."""
    local_only = all(h.is_local for h in job.hosts)
    if master_addr is None:
        master_addr = "127.0.0.1" if local_only else job.master_address
    if job.slurm is not None:
        master_addr = f"${SLURM_RDZV_ENV}"
    launches = []
    first = 0
    per_host = inline is not None and inline.per_host
    for rank, host in enumerate(job.hosts):
        given = nprocs[host.name]
        source, nproc = given.source if isinstance(given, Nproc) else job.nproc_of(host).source, int(given)
        launches.append(HostLaunch(
            host=host, node_rank=rank, nproc=nproc, nproc_source=source, first_rank=first,
            launcher=tuple(launcher_argv(job, host, rank, nproc, master_addr, master_port, job_id,
                                         inline=inline is not None, per_host=per_host,
                                         local_addr=_local_addr(job, host, local_only, local_addrs))),
            program=tuple(program_argv(job, host, inline)),
            env={**host_env(job, host, job_id, (picked_env or {}).get(host.name)),
                 **(per_host_env(rank, len(job.hosts), master_addr, master_port) if per_host else {})},
            cwd=job.workdir_for(host), wrapped=inline is None, modules=inline.modules if inline is not None else (),
        ))
        first += nproc
    return LaunchPlan(job=job, job_id=job_id, master_addr=master_addr, master_port=master_port,
                      hosts=tuple(launches))
