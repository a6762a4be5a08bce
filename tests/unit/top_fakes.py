"""A job on this machine as `top` finds one, without torch: a launcher and a rank process carrying
its id, a node state (state.json), output.log and the ranks' step records; and nvidia-smi's
recorded outputs (tests/fixtures/nvidia_smi/)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node_agent.host.runstate import proc_start_ticks

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia_smi"
EXIT_CODES: dict[str, int] = json.loads((FIXTURES / "exit_codes.json").read_text())
FAKE_NVIDIA_SMI = FIXTURES / "nvidia-smi"
SLEEP = "import time; time.sleep(120)"
# The rank: starts argv[2] workers (its environment, as a DataLoader's), is busy for argv[1] seconds, sleeps.
BUSY = ("import subprocess, sys, time\n"
        "workers = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])"
        " for _ in range(int(sys.argv[2]))]\n"
        "end = time.time() + float(sys.argv[1])\nwhile time.time() < end: pass\ntime.sleep(120)")


def recorded(name: str) -> tuple[int, str]:
    """(exit code, output) of one recorded nvidia-smi run."""
    return EXIT_CODES[name], (FIXTURES / name).read_text()


def install_fake_nvidia_smi(directory: Path, recording: str) -> Path:
    """A directory holding the fake nvidia-smi, replaying `recording`: put it first on PATH."""
    directory.mkdir(parents=True, exist_ok=True)
    fake = directory / "nvidia-smi"
    fake.write_bytes(FAKE_NVIDIA_SMI.read_bytes())
    fake.chmod(0o755)
    code, output = recorded(recording)
    (directory / "output").write_text(output)
    (directory / "exit_code").write_text(f"{code}\n")
    return directory


@dataclass
class FakeJob:
    job_id: str
    state_dir: Path
    launcher: subprocess.Popen[bytes]
    ranks: list[subprocess.Popen[bytes]]

    @property
    def rank(self) -> subprocess.Popen[bytes]:
        return self.ranks[0]

    def write_step(self, local_rank: int, rank: int, step: int, age_s: float = 0.0,
                   window: dict[str, Any] | None = None, total: int | None = None) -> None:
        """ranks/<local rank>.step as the rank wrapper writes it, `age_s` seconds old."""
        record: dict[str, Any] = {"phase": "step", "time": time.time() - age_s, "local_rank": local_rank,
                                  "rank": rank, "pid": self.ranks[local_rank].pid, "host": socket.gethostname(),
                                  "step": step}
        if total is not None:
            record["total"] = total
        if window is not None:
            record["window"] = window
        path = self.state_dir / "ranks" / f"{local_rank}.step"
        path.with_suffix(".tmp").write_text(json.dumps(record))
        os.replace(path.with_suffix(".tmp"), path)


@contextmanager
def fake_job(state_root: Path, job_id: str, env: dict[str, str] | None = None, busy_s: float = 0.0,
             nproc: int = 1, node_rank: int = 0, workers: int = 0) -> Iterator[FakeJob]:
    """A running node `node_rank` of `job_id` on this machine (DDPCTL_STATE_ROOT=state_root), with
    `nproc` rank processes, each with `workers` children of its own (killed with it: SIGKILL to
    its process group)."""
    job_env = {**os.environ, "DDPCTL_JOB_ID": job_id, "DDPCTL_NODE_RANK": str(node_rank), **(env or {})}
    launcher = subprocess.Popen([sys.executable, "-c", SLEEP], env=job_env)
    ranks = [subprocess.Popen([sys.executable, "-c", BUSY, str(busy_s), str(workers)], start_new_session=True,
                              env={**job_env, "RANK": str(node_rank * nproc + i), "LOCAL_RANK": str(i),
                                   "MASTER_ADDR": "127.0.0.1"}) for i in range(nproc)]
    try:
        state = state_root / "runs" / job_id / f"node{node_rank}"
        (state / "ranks").mkdir(parents=True)
        (state / "output.log").write_text("[default0]:step 1\n")
        (state / "state.json").write_text(json.dumps({
            "job_id": job_id, "job_name": job_id.rsplit("-", 1)[0], "run_id": None, "node_rank": node_rank,
            "hostname": socket.gethostname(), "pid": launcher.pid, "pgid": launcher.pid,
            "start_ticks": proc_start_ticks(launcher.pid), "started_at": time.time(), "detached": True,
            "log": str(state / "output.log"), "status": "running",
            "argv": [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
                     str(nproc), "--node-rank", str(node_rank), "--master-addr", "127.0.0.1"]}))
        yield FakeJob(job_id, state, launcher, ranks)
    finally:
        for proc in ranks:
            with suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in (*ranks, launcher):
            with suppress(OSError):
                proc.kill()
            proc.wait()
