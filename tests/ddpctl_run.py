"""Helpers for integration tests: run the real `ddpctl` CLI, write job files for a cluster."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.cluster import Cluster

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "train_jobs" / "toy" / "train.py"


def ddpctl_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator", *args]


def run_ddpctl(*args: str, timeout: float = 180, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(ddpctl_argv(*args), capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          check=False)


def write_job(directory: Path, cluster: Cluster | None, name: str, args: Sequence[str] = (), *,
              script: Path = TOY, nproc: int = 2, backend: str = "static", port: int | str = "auto",
              env: dict[str, str] | None = None, hosts: Sequence[str] | None = None, pin_gloo: bool = True) -> Path:
    """A job.toml for `cluster` (None: this machine only). Values are JSON-quoted, valid TOML.
    `pin_gloo`: GLOO_SOCKET_IFNAME in the job's env (False: ddpctl sets it where it must, from the
    hosts' routes)."""
    lines = [f"inventory = {json.dumps(str(cluster.hosts_toml))}"] if cluster else []
    lines += ["[job]", f"name = {json.dumps(name)}", f"script = {json.dumps(str(script))}",
              f"args = {json.dumps(list(args))}", f"nproc_per_node = {nproc}"]
    if hosts is not None:
        lines.append(f"hosts = {json.dumps(list(hosts))}")
    lines += ["[rendezvous]", f"master_port = {json.dumps(port)}", f"backend = {json.dumps(backend)}", "[env]"]
    base = {"GLOO_SOCKET_IFNAME": "eth0" if cluster else "lo"} if pin_gloo else {}
    lines += [f"{k} = {json.dumps(v)}" for k, v in {**base, **(env or {})}.items()]
    path = directory / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def ssh_args(cluster: Cluster) -> list[str]:
    return ["--ssh-config", str(cluster.ssh_config)]


def only_summary(runs_dir: Path) -> dict[str, Any]:
    (summary,) = list(runs_dir.glob("*/summary.json"))
    return json.loads(summary.read_text())


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.25) -> Any:
    """Poll until predicate() is truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def no_job_processes(cluster: Cluster, job_id: str) -> bool:
    return all(not cluster.job_pids(i, job_id) for i in range(len(cluster.hosts)))
