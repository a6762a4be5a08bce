"""A host's textfile for node_exporter (node_agent/runtime/metrics_file.py): what it says of a job and
its ranks, that the supervisor keeps it current (the straggler word included), says when the job
ended and removes it a grace later, and that a file left behind by a job that is over is swept."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inventory import LOCALHOST
from node_agent.runtime.metrics_file import JobLabels, MetricsFile, file_name, job_text, sweep
from node_agent.wire.replies_top import GpuStat
from orchestrator.remote.agent import start_agent
from orchestrator.remote.transport import LocalTransport
from tests.prometheus import promtool_check_metrics
from tests.unit.test_supervisor import wait_until

LABELS = JobLabels("gpu-07", 'train "big"', "run-1", "job-1", 1, 2)
WINDOW = {"steps": 4, "seconds": 0.8, "p50_ms": 200.0, "p95_ms": 260.0,
          "ddp": {"n": 4, "wait_ms": 30.0, "data_ms": 5.0, "compute_ms": 150.0}}
RECORDS: dict[str, dict[str, Any]] = {
    "0.started": {"phase": "started", "local_rank": 0, "rank": 4, "time": 100.0},
    "0.step": {"phase": "step", "local_rank": 0, "rank": 4, "time": 130.5, "step": 42, "window": WINDOW},
    "1.started": {"phase": "started", "local_rank": 1, "rank": 5, "time": 100.0},
}


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """(sample name, labels) -> value, as Prometheus' own parser reads the text."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(parsed: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    found = [v for (n, ls), v in parsed.items() if n == name and set(labels.items()) <= ls]
    assert len(found) == 1, f"{name} {labels}: {found}"
    return found[0]


def promtool_ok(text: str) -> None:
    complaints = promtool_check_metrics(text)
    assert complaints == "", complaints


def test_a_running_job_its_ranks_and_gpus() -> None:
    gpus = (GpuStat(0, "GPU-aaaa", "NVIDIA H100", 87.0, 1024.0, 81559.0, 500.0),
            GpuStat(1, "GPU-bbbb", "NVIDIA H100", 3.0, 10.0, 81559.0, 70.0))
    text = job_text(LABELS, 100.0, RECORDS, {0}, gpus, ("1",))
    parsed = samples(text)
    me = {"Hostname": "gpu-07", "job_name": 'train "big"', "run": "run-1"}
    assert value(parsed, "ddpctl_job_info", job_id="job-1", node_rank="1", attempt="2", **me) == 1
    assert value(parsed, "ddpctl_job_running", **me) == 1
    assert value(parsed, "ddpctl_job_start_timestamp_seconds", **me) == 100.0
    assert value(parsed, "ddpctl_rank_steps_total", rank="4", local_rank="0") == 42
    assert value(parsed, "ddpctl_rank_steps_total", rank="5", local_rank="1") == 0  # started, not stepped
    assert value(parsed, "ddpctl_rank_last_step_timestamp_seconds", rank="4") == 130.5
    assert not [k for k in parsed if k[0] == "ddpctl_rank_last_step_timestamp_seconds" and ("rank", "5") in k[1]]
    assert value(parsed, "ddpctl_rank_step_median_seconds", rank="4") == pytest.approx(0.2)
    assert value(parsed, "ddpctl_rank_step_part_seconds", rank="4", part="compute") == pytest.approx(0.15)
    assert value(parsed, "ddpctl_rank_step_part_seconds", rank="4", part="wait") == pytest.approx(0.03)
    assert value(parsed, "ddpctl_rank_step_part_seconds", rank="4", part="input") == pytest.approx(0.005)
    assert value(parsed, "ddpctl_rank_straggler", rank="4") == 1
    assert value(parsed, "ddpctl_rank_straggler", rank="5") == 0
    # only the job's GPU (CUDA_VISIBLE_DEVICES=1), labelled as DCGM labels it
    assert value(parsed, "ddpctl_gpu_info", gpu="1", UUID="GPU-bbbb", model_name="NVIDIA H100") == 1
    assert value(parsed, "ddpctl_gpu_utilization_ratio", gpu="1") == pytest.approx(0.03)
    assert value(parsed, "ddpctl_gpu_memory_used_bytes", gpu="1") == 10 * 1024 * 1024
    assert not [k for k in parsed if ("gpu", "0") in k[1]]
    promtool_ok(text)


def test_an_ended_job_says_so() -> None:
    text = job_text(LABELS, 100.0, RECORDS, set(), (GpuStat(0, "GPU-a", "X", 50.0, 1.0, 2.0, 3.0),), None,
                    ended=200.0, exit_code=1)
    parsed = samples(text)
    assert value(parsed, "ddpctl_job_running") == 0
    assert value(parsed, "ddpctl_job_end_timestamp_seconds") == 200.0
    assert value(parsed, "ddpctl_job_exit_code") == 1
    assert value(parsed, "ddpctl_rank_steps_total", rank="4") == 42  # the last count stays readable
    assert not [k for k in parsed if k[0].startswith("ddpctl_gpu_")]  # the GPUs are no longer the job's
    promtool_ok(text)


def test_an_unwritable_directory_costs_the_series_only(tmp_path: Path) -> None:
    missing = MetricsFile(str(tmp_path / "no" / "such"), "job-1", 0)
    assert missing.write("x 1\n") is False and missing.broken is not None and "no/such" in missing.broken
    assert missing.write("x 1\n") is False  # quiet from then on
    written = MetricsFile(str(tmp_path), "job-1", 0)
    assert written.write("x 1\n") and (tmp_path / "ddpctl-job-1-node0.prom").read_text() == "x 1\n"
    assert oct((tmp_path / "ddpctl-job-1-node0.prom").stat().st_mode & 0o777) == oct(0o644)
    assert [p.name for p in tmp_path.iterdir()] == ["ddpctl-job-1-node0.prom"]  # no temp file left


def test_sweep_removes_only_files_of_jobs_that_are_over_on_this_host(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("DDPCTL_STATE_ROOT", str(state))
    here = socket.gethostname()
    jobs = {"over": {"status": "exited", "hostname": here},
            "killed": {"status": "running", "hostname": here, "supervisor_pid": 2 ** 22 + 7},  # no such pid
            "alive": {"status": "running", "hostname": here, "supervisor_pid": os.getpid()},
            "elsewhere": {"status": "exited", "hostname": "another-host"}}
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    for job, data in jobs.items():
        (state / "runs" / job / "node0").mkdir(parents=True)
        (state / "runs" / job / "node0" / "state.json").write_text(json.dumps(data))
        (textfiles / file_name(job, 0)).write_text("x 1\n")
    (textfiles / file_name("fresh", 0)).write_text("x 1\n")
    (textfiles / "someone-else.prom").write_text("x 1\n")
    old = time.time() - 3600
    for path in textfiles.iterdir():
        if "fresh" not in path.name:
            os.utime(path, (old, old))
    removed = sweep(str(textfiles), 300.0, here)
    assert sorted(Path(p).name for p in removed) == [file_name("killed", 0), file_name("over", 0)]
    assert sorted(p.name for p in textfiles.iterdir()) == sorted(
        [file_name("alive", 0), file_name("elsewhere", 0), file_name("fresh", 0), "someone-else.prom"])


# A stand-in for torchrun under the rank wrapper: it writes rank 0's step record as the wrapper
# does, then runs until stdin (the control plane) goes.
STEPPING = """
import json, os, sys, time
path = os.path.join(os.environ["DDPCTL_RANK_DIR"], "0.step")
with open(path + ".tmp", "w") as f:
    json.dump({"phase": "step", "local_rank": 0, "rank": 0, "pid": os.getpid(), "time": time.time(),
               "step": 7, "window": {"steps": 7, "seconds": 0.7, "p50_ms": 100.0, "p95_ms": 120.0}}, f)
os.replace(path + ".tmp", path)
print("ready", flush=True)
time.sleep(300)
"""


def test_the_supervisor_keeps_the_file_current_then_says_the_job_ended_and_removes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDPCTL_STATE_ROOT", str(tmp_path / "state"))
    script = tmp_path / "stepping.py"
    script.write_text(STEPPING)
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    request = {"job_id": "metrics-1", "job_name": "fake", "run_id": "run-9", "node_rank": 0,
               "launcher": [sys.executable, str(script)], "program": ["train.py"], "env": {}, "cwd": str(tmp_path),
               "grace": 2.0, "heartbeat_timeout": 0, "wrap": True, "metrics_dir": str(textfiles),
               "metrics_every": 0.2, "metrics_keep": 1.5}
    running = start_agent(LocalTransport(LOCALHOST), "supervise", request)
    path = textfiles / "ddpctl-metrics-1-node0.prom"

    def says(name: str, expected: float, **labels: str) -> bool:
        try:
            parsed = samples(path.read_text())
        except (OSError, ValueError):
            return False
        found = [v for (n, ls), v in parsed.items() if n == name and set(labels.items()) <= ls]
        return found == [expected]

    try:
        wait_until(lambda: says("ddpctl_rank_steps_total", 7, rank="0", run="run-9", job_name="fake"), 30,
                   "the textfile to show rank 0's 7 steps")
        assert says("ddpctl_job_running", 1) and says("ddpctl_rank_straggler", 0, rank="0")
        running.send(b"STRAGGLER 0 1\n")
        wait_until(lambda: says("ddpctl_rank_straggler", 1, rank="0"), 10, "the straggler flag")
        running.send(b"STRAGGLER 0 0\n")
        wait_until(lambda: says("ddpctl_rank_straggler", 0, rank="0"), 10, "the flag cleared")
    finally:
        running.close_stdin()
    assert running.wait(30) is not None
    assert says("ddpctl_job_running", 0) and says("ddpctl_rank_steps_total", 7, rank="0")
    promtool_ok(path.read_text())
    wait_until(lambda: not path.exists(), 20, "the ended job's textfile to be removed after its grace")
    assert list(textfiles.iterdir()) == []
