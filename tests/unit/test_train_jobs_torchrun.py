"""End-to-end tests of the train jobs: real torchrun --standalone, 2 CPU processes, gloo."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")

pytestmark = pytest.mark.torch

JOBS = Path(__file__).resolve().parents[2] / "train_jobs"
TIMEOUT_S = 180.0
RANK_LINE = re.compile(
    r"^rank=(\d+) local_rank=(\d+) world_size=(\d+) node_rank=(\d+) "
    r"params_identical=(True|False) checksum=(\S+)",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str  # stdout and stderr together


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # prove the path fallback
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    return env


def _torchrun_argv(script: Path, args: list[str]) -> list[str]:
    base = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    return [*base, "2", script.name, *args]


def start_torchrun(script: Path, args: list[str]) -> subprocess.Popen[str]:
    """Start a job script under torchrun from the script's own directory."""
    return subprocess.Popen(
        _torchrun_argv(script, args),
        cwd=script.parent,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def stop_torchrun(proc: subprocess.Popen[str]) -> str:
    """SIGTERM torchrun (it stops its workers), then SIGKILL whatever is left, by pid.

    torchrun starts each worker in a session of its own, so killing torchrun's process group
    would orphan the workers: they are collected by pid first.
    """
    workers = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        for p in [psutil.Process(proc.pid), *workers]:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        out, _ = proc.communicate()
    psutil.wait_procs(workers, timeout=10)
    return out


def torchrun(script: Path, *args: str) -> Run:
    """Run a job script to completion; stop it and fail the test past TIMEOUT_S."""
    proc = start_torchrun(script, list(args))
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        out = stop_torchrun(proc)
        pytest.fail(f"torchrun {script.name} timed out after {TIMEOUT_S}s:\n{out[-3000:]}")
    return Run(proc.returncode, out)


def rank_lines(output: str) -> dict[int, tuple[str, ...]]:
    return {int(m.group(1)): m.groups() for m in RANK_LINE.finditer(output)}


def field(output: str, prefix: str, key: str) -> list[str]:
    """Values of key=... on every line starting with prefix."""
    pat = re.compile(rf"^{re.escape(prefix)}.*?\b{key}=(\S+)", re.MULTILINE)
    return pat.findall(output)


def test_toy_ranks_report_identity_and_identical_params() -> None:
    run = torchrun(JOBS / "toy" / "train.py", "--epochs", "2", "--steps", "3")
    assert run.returncode == 0, run.output[-3000:]
    ranks = rank_lines(run.output)
    assert sorted(ranks) == [0, 1]
    for rank, (_, local, world, node, identical, _) in ranks.items():
        assert (int(local), int(world), int(node), identical) == (rank, 2, 0, "True")
    assert ranks[0][5] == ranks[1][5]  # same checksum
    assert len(field(run.output, "epoch=", "loss")) == 2


def test_toy_echo_args_arrive_verbatim_without_shell(tmp_path: Path) -> None:
    marker = tmp_path / "x"
    nasty = f"a b \"c\" $(touch {marker}) ; echo pwned 'q' `id` \\n"
    run = torchrun(JOBS / "toy" / "train.py", "--epochs", "1", "--steps", "1", "--echo-args", nasty)
    assert run.returncode == 0, run.output[-3000:]
    echoed = [json.loads(line[5:]) for line in run.output.splitlines() if line.startswith("ARGS ")]
    assert len(echoed) == 2
    assert all(argv[-1] == nasty for argv in echoed)
    assert not marker.exists()
    assert not re.search(r"^pwned", run.output, re.MULTILINE)


def test_toy_fail_rank_exits_nonzero_naming_the_failure() -> None:
    run = torchrun(JOBS / "toy" / "train.py", "--fail-rank", "1", "--fail-at-step", "1")
    assert run.returncode != 0
    assert "injected failure: rank 1 at step 1" in run.output
    assert not rank_lines(run.output)  # nobody reached the end


def test_toy_sleep_rank_hangs_while_other_rank_waits_in_collective() -> None:
    proc = start_torchrun(JOBS / "toy" / "train.py", ["--sleep-rank", "1"])
    workers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + TIMEOUT_S
        seen = ""
        assert proc.stdout is not None
        while "sleeping forever" not in seen and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen += line
        assert "rank=1 sleeping forever before all_reduce" in seen, seen[-3000:]
        workers = psutil.Process(proc.pid).children(recursive=True)
        assert proc.poll() is None  # still running: rank 0 is blocked in all_reduce
        assert len([w for w in workers if w.is_running()]) == 2
    finally:
        stop_torchrun(proc)
    assert not [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]


CLASSIFIER_SMALL = ("--width", "8", "--train-size", "512", "--test-size", "256")


def test_classifier_learns_well_above_chance_with_accumulation_and_clipping() -> None:
    run = torchrun(
        JOBS / "image_classifier" / "train.py",
        *CLASSIFIER_SMALL,
        *("--epochs", "4", "--batch-size", "16", "--accum-steps", "2", "--clip-grad", "5.0"),
    )
    assert run.returncode == 0, run.output[-3000:]
    accs = [float(a) for a in field(run.output, "epoch=", "acc")]
    assert len(accs) == 4
    assert accs[-1] > 0.3, run.output[-3000:]
    assert all(float(s) > 0 for s in field(run.output, "epoch=", "samples_per_s"))
    ranks = rank_lines(run.output)
    assert [ranks[r][4] for r in (0, 1)] == ["True", "True"]
    assert field(run.output, "final ", "acc") == [f"{accs[-1]:.4f}"]


def test_classifier_bf16_autocast_runs_and_sync_bn_degrades_on_cpu() -> None:
    run = torchrun(
        JOBS / "image_classifier" / "train.py",
        *("--width", "4", "--train-size", "128", "--test-size", "64", "--epochs", "1"),
        *("--sync-bn", "--amp", "bf16"),
    )
    assert run.returncode == 0, run.output[-3000:]
    assert [v[4] for v in rank_lines(run.output).values()] == ["True", "True"]
    assert "sync-bn: unsupported on cpu; per-rank BatchNorm kept" in run.output


def test_classifier_resume_reproduces_uninterrupted_run(tmp_path: Path) -> None:
    script = JOBS / "image_classifier" / "train.py"
    small = (*CLASSIFIER_SMALL, "--train-size", "256", "--batch-size", "32")
    ckpt = ("--checkpoint-dir", str(tmp_path / "ck"))
    first = torchrun(script, *small, "--epochs", "2", *ckpt)
    resumed = torchrun(script, *small, "--epochs", "3", *ckpt, "--resume")
    straight = torchrun(script, *small, "--epochs", "3")
    for run in (first, resumed, straight):
        assert run.returncode == 0, run.output[-3000:]
    assert "resume: from epoch=1" in resumed.output
    assert len(field(resumed.output, "epoch=", "loss")) == 1  # only epoch 2 ran
    assert field(resumed.output, "final ", "loss") == field(straight.output, "final ", "loss")
    assert field(resumed.output, "final ", "checksum") == field(straight.output, "final ", "checksum")
    assert not list((tmp_path / "ck").glob(".*tmp*"))


def test_allreduce_bench_reports_sane_figures_for_two_ranks() -> None:
    run = torchrun(
        JOBS / "allreduce_bench" / "bench.py",
        *("--min-bytes", "1K", "--max-bytes", "64K", "--iters", "3", "--warmup", "1", "--json"),
    )
    assert run.returncode == 0, run.output[-3000:]
    lines = [ln for ln in run.output.splitlines() if ln.startswith("BANDWIDTH ")]
    assert len(lines) == 1  # rank 0 only
    info = json.loads(lines[0].removeprefix("BANDWIDTH "))
    assert (info["schema"], info["world_size"], info["backend"]) == (1, 2, "gloo")
    sizes = [r["size_bytes"] for r in info["results"]]
    assert sizes == [1024 << i for i in range(7)]
    for r in info["results"]:
        assert r["time_us"] > 0 and r["algbw_gbps"] > 0
        assert r["busbw_gbps"] == r["algbw_gbps"]  # 2(n-1)/n == 1 for n=2
        assert r["count"] == r["size_bytes"] // 4
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+float32\s", run.output, re.MULTILINE)
    assert [int(s) for s, _ in rows] == sizes
