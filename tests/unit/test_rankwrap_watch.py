"""The rank wrapper's watch side (node_agent/rank/rankwrap.py), on a real single-process gloo DDP job run
through it as torchrun would: its `step` record's window (step times and DDP's own timings) and
the total the job states, and the dump its side thread writes on request (the main thread's stack
and the flight recorder's collectives)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import node_agent.rank.rankwrap as rankwrap
from orchestrator.hostops.collectives import RankRecords, parse_entries, verdict

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

WRAPPER = Path(rankwrap.__file__)
DEADLINE = 60.0  # seconds any wait below may take on a loaded machine (each normally takes a few)

# a one-process DDP job: every step sleeps SLEEP seconds before its forward pass (the input side)
DDP_JOB = textwrap.dedent("""\
    import os, sys, time
    import torch
    import torch.distributed as dist
    from torch import nn

    def load_batch(seconds):
        time.sleep(seconds)
        return torch.randn(8, 4)

    def block_here():
        time.sleep(600)

    steps, sleep, then = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo")
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        batch = load_batch(sleep)
        opt.zero_grad()
        model(batch).sum().backward()
        opt.step()
    if then == "block":
        with open(sys.argv[4], "w") as f:
            f.write("stepped")
        block_here()
    dist.destroy_process_group()
    """)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(ranks: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DDPCTL_TOTAL_STEPS", "TORCH_FR_BUFFER_SIZE")}
    env.update({"DDPCTL_RANK_DIR": str(ranks), "LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1",
                "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                "OMP_NUM_THREADS": "1"})
    env.update(extra)
    return env


@pytest.fixture
def job(tmp_path: Path) -> Path:
    script = tmp_path / "ddp_job.py"
    script.write_text(DDP_JOB)
    (tmp_path / "node" / "ranks").mkdir(parents=True)
    return script


def run_steps(job: Path, steps: int, sleep: float, **env: str) -> dict[str, Any]:
    ranks = job.parent / "node" / "ranks"
    out = subprocess.run([sys.executable, str(WRAPPER), str(job), str(steps), str(sleep), "end"],
                         env=rank_env(ranks, **env), cwd=job.parent, capture_output=True, text=True,
                         timeout=DEADLINE)
    assert out.returncode == 0, out.stderr
    record: dict[str, Any] = json.loads((ranks / "0.step").read_text())
    return record


def test_a_ddp_jobs_step_record_has_its_window_and_ddp_timings(job: Path) -> None:
    record = run_steps(job, 30, 0.03)
    assert record["phase"] == "step" and record["step"] == 30 and record["rank"] == 0
    assert "total" not in record
    window = record["window"]
    assert set(window) >= {"steps", "seconds", "p50_ms", "p95_ms", "ddp"}
    assert 1 <= window["steps"] < 30  # the steps since the record before, not all of them
    assert window["seconds"] >= window["steps"] * 0.03
    assert 30 <= window["p50_ms"] <= window["p95_ms"]
    ddp = window["ddp"]
    assert set(ddp) == {"n", "wait_ms", "data_ms", "compute_ms"}
    assert ddp["n"] >= 1
    assert ddp["data_ms"] >= 25  # the sleep before each forward pass is the input side
    assert ddp["compute_ms"] >= 0 and ddp["wait_ms"] >= 0
    assert ddp["compute_ms"] < ddp["data_ms"]  # a tiny model: the sleep is not compute


def test_the_total_the_job_states_is_in_the_step_record(job: Path) -> None:
    record = run_steps(job, 3, 0.0, DDPCTL_TOTAL_STEPS="1200")
    assert (record["step"], record["total"]) == (3, 1200)


def wait_for(what: str, check: Any, proc: subprocess.Popen[str]) -> Any:
    """Poll `check()` until it gives something (bounded); fail early if the job ended."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"the job ended ({proc.returncode}) before {what}: {err[-2000:]}")
        time.sleep(0.05)
    pytest.fail(f"no {what} in {DEADLINE:.0f} s")


@pytest.fixture
def blocked(job: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """The DDP job, after 5 steps, blocked in block_here(); killed at the end."""
    ranks = job.parent / "node" / "ranks"
    marker = job.parent / "stepped"
    proc = subprocess.Popen([sys.executable, str(WRAPPER), str(job), "5", "0.0", "block", str(marker)],
                            env=rank_env(ranks), cwd=job.parent, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for("the marker", marker.exists, proc)
        yield proc, ranks
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=DEADLINE)


def read_dump(path: Path, token: str) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if data.get("token") == token else None


def test_a_dump_request_is_answered_with_the_stack_and_the_collectives(
        blocked: tuple[subprocess.Popen[str], Path]) -> None:
    proc, ranks = blocked
    dump_file = ranks.parent / "dumps" / "0.json"
    (ranks / "dump.request").write_text("token-1\n")
    dump = wait_for("the dump", lambda: read_dump(dump_file, "token-1"), proc)
    assert (dump["rank"], dump["local_rank"], dump["pid"], dump["step"]) == (0, 0, proc.pid, 5)
    names = [f["name"] for f in dump["stack"]]
    assert names[0] == "block_here", names  # innermost first: the blocking function
    assert "<module>" in names
    assert all("rankwrap" not in f["file"] and "runpy" not in f["file"] for f in dump["stack"])
    assert "error" not in dump, dump.get("error")
    reduces = [e for e in dump["entries"] if "all_reduce" in str(e.get("profiling_name"))]
    assert len(reduces) >= 5, dump["entries"]  # the gradient all-reduce of each of the 5 backward passes
    assert all(e["retired"] for e in reduces)  # the job is not in a collective: it sleeps
    assert [e["collective_seq_id"] for e in reduces] == sorted(e["collective_seq_id"] for e in reduces)
    parsed = parse_entries(dump["entries"])  # what the hang verdict reads of them
    assert "all_reduce" in {c.op for c in parsed} and {c.group for c in parsed} == {"0"}
    assert verdict([RankRecords("node0", 0, parsed)]) is None  # every collective returned: no hang there
    # a second request with a new token is answered again
    (ranks / "dump.request").write_text("token-2\n")
    again = wait_for("the second dump", lambda: read_dump(dump_file, "token-2"), proc)
    assert again["stack"][0]["name"] == "block_here"
