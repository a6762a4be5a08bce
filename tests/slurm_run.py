"""Helpers for the Slurm integration tests: a job file with a [slurm] table, the real `ddpctl` CLI
run against the test cluster, and what is left of a job in Slurm and on the nodes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.ddpctl_run import ddpctl_argv, wait_for
from tests.slurm_cluster import SlurmCluster


def slurm_job(directory: Path, name: str, source: str, args: Sequence[str] = (), *, nodes: int = 2,
              nproc: int = 2, slurm: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> Path:
    """A job.toml with a [slurm] table; the script beside it. Values are JSON-quoted (valid TOML)."""
    script = directory / f"{name}.py"
    script.write_text(source)
    table = {"nodes": nodes, "python": sys.executable, **(slurm or {})}
    lines = ["[job]", f"name = {json.dumps(name)}", f"script = {json.dumps(script.name)}",
             f"args = {json.dumps(list(args))}", f"nproc_per_node = {nproc}", "[slurm]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    lines += ["[env]", 'GLOO_SOCKET_IFNAME = "eth0"'] + [f"{k} = {json.dumps(v)}" for k, v in (env or {}).items()]
    path = directory / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def env_for(cluster: SlurmCluster, login: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SLURM_CONF", None)
    return env if login else {**env, **cluster.client_env}


def ddpctl(cluster: SlurmCluster, *args: str, cwd: Path, timeout: float = 180,
           login: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(ddpctl_argv(*args), capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=env_for(cluster, login), check=False)


def summary(cwd: Path) -> dict[str, Any]:
    (path,) = list((cwd / "runs").glob("*/summary.json"))
    return json.loads(path.read_text())


def slurm_record(cwd: Path) -> dict[str, Any]:
    (path,) = list((cwd / "runs").glob("*/slurm.json"))
    return json.loads(path.read_text())


def rank_lines(stdout: str) -> dict[int, str]:
    """rank -> the `[nodeK:R]  rank=R ...` line, checking the prefix names the rank the rank printed."""
    found = {}
    for m in re.finditer(r"^\[(node\d):(\w+)\]\s+rank=(\d+) (.*)$", stdout, re.MULTILINE):
        assert m.group(2) == m.group(3), f"line labelled rank {m.group(2)} printed rank {m.group(3)}"
        found[int(m.group(3))] = m.group(0)
    return found


def job_processes(cluster: SlurmCluster) -> dict[int, list[str]]:
    """What runs in each compute node besides its slurmd (by command name)."""
    out = {}
    for i in range(len(cluster.nodes)):
        names = []
        for pid in cluster.node_pids(i):
            try:
                names.append(Path(f"/proc/{pid}/comm").read_text().strip())
            except OSError:
                continue
        if names:
            out[i] = names
    return out


def active_jobs(cluster: SlurmCluster) -> list[str]:
    """Jobs still in Slurm's queue (pending, running or completing), as `id name state`."""
    return [line for line in cluster.slurm("squeue", "-h", "-o", "%i %j %T").stdout.splitlines() if line.strip()]


def start_up(cluster: SlurmCluster, job: Path, cwd: Path, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(ddpctl_argv("up", str(job)), cwd=cwd, env=env_for(cluster),
                            stdout=out.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def release_requeued(cluster: SlurmCluster, slurm_id: str) -> None:
    """Wait until a requeued job is back in the queue, then let it start in 2 s. Slurm holds a
    requeued job for about 2 minutes (BeginTime); not in the second its old run was killed in:
    slurmd revokes the job's credential on a one-second clock, and a new run allocated within that
    second is killed ("Job credential revoked") before it starts."""
    wait_for(lambda: "PENDING" in cluster.slurm("squeue", "-h", "-j", slurm_id, "-o", "%T").stdout,
             120, "the job to be requeued")
    assert cluster.slurm("scontrol", "update", f"JobId={slurm_id}", "StartTime=now+2").returncode == 0
