"""What Slurm or an admin does to a job while `ddpctl up` is attached, on a real Slurm cluster:
an admin's requeue (the job runs again, `up` follows it and exits with the rerun's result), a
cancel from outside ddpctl, a node whose slurmd dies (Slurm's NODE_FAIL), SIGTERM and SIGHUP to
`up` itself. Slurm's words are the headline, never a victim rank's traceback, and ddpctl cancels
nothing that Slurm is requeueing."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.launch.outcome import EXIT_STOPPED
from tests.ddpctl_run import wait_for
from tests.slurm_cluster import SlurmCluster, require_slurm, start_slurm_cluster
from tests.slurm_run import (
    active_jobs,
    ddpctl,
    job_processes,
    release_requeued,
    slurm_job,
    slurm_record,
    start_up,
    summary,
)

# The first run waits; the rerun after a requeue (SLURM_RESTART_COUNT=1) says so and ends cleanly.
RERUN = """\
import os, time
import torch.distributed as dist
dist.init_process_group("gloo")
run = os.environ.get("SLURM_RESTART_COUNT", "0")
print(f"rank={dist.get_rank()} run={run} ready", flush=True)
if run == "0":
    time.sleep(300)
dist.barrier()
print(f"rank={dist.get_rank()} finished run={run}", flush=True)
"""

SLEEP = """\
import time
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank={dist.get_rank()} ready", flush=True)
while True:
    dist.barrier()  # a peer's death is noticed here, as in a training step
    time.sleep(0.5)
"""


def show(cluster: SlurmCluster, slurm_id: str) -> dict[str, str]:
    out = cluster.slurm("scontrol", "-o", "show", "job", slurm_id).stdout
    return dict(tok.split("=", 1) for tok in out.split() if "=" in tok)


@contextlib.contextmanager
def attached(cluster: SlurmCluster, tmp_path: Path, name: str, source: str, ready: int,
             **slurm: object) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """`up` attached to a job whose ranks are all ready; killed at the end of the block if it is
    still running (a failed assertion must not leave it behind)."""
    job = slurm_job(tmp_path, name, source, nproc=1, slurm=dict(slurm) or None)
    out = tmp_path / "up.out"
    proc = start_up(cluster, job, tmp_path, out)
    try:
        wait_for(lambda: out.read_text().count(" ready") >= ready or proc.poll() is not None, 120,
                 "every rank ready")
        assert proc.poll() is None, out.read_text()[-3000:]
        yield out, proc
    finally:
        if proc.poll() is None:
            proc.kill()


def test_an_admins_requeue_is_followed_to_the_rerun_whose_result_is_the_jobs(slurm_cluster: SlurmCluster,
                                                                             tmp_path: Path) -> None:
    c = slurm_cluster
    with attached(c, tmp_path, "requeued", RERUN, 2, requeue=True) as (out, proc):
        slurm_id = slurm_record(tmp_path)["slurm_job_id"]
        assert c.slurm("scontrol", "requeue", slurm_id).returncode == 0  # the admin, not ddpctl
        release_requeued(c, slurm_id)  # as the admin may, instead of Slurm's 2-minute hold
        assert proc.wait(180) == 0, out.read_text()[-4000:]
    text = out.read_text()
    assert re.search(rf"Slurm requeued job {slurm_id} \(job requeue\): run 0 ended", text), text[-4000:]
    assert "DUE TO JOB REQUEUE" in text  # Slurm's own words, quoted
    assert re.search(r"queued \(BeginTime", text), text[-4000:]
    assert re.search(r"running on \S+ after [\d.]+s in the queue", text.split("requeued job", 1)[1])
    assert text.count("finished run=1") == 2 and "first failure" not in text
    assert "scancel" not in text
    state = show(c, slurm_id)
    assert state["JobState"] == "COMPLETED" and state["Restarts"] == "1"  # it ran again, nobody cancelled it
    assert summary(tmp_path)["exit_code"] == 0
    assert active_jobs(c) == []
    account = summary(tmp_path)["account"]  # Slurm's own waits are parts of their own
    waits = {p["kind"]: p["seconds"] for p in account["parts"]}
    assert waits.get("requeue", 0) > 0 and "pending" in waits, account
    assert re.search(r"\d+ s requeue", account["line"]), account["line"]


def test_a_cancel_from_outside_ddpctl_is_named_and_no_rank_is_blamed(slurm_cluster: SlurmCluster,
                                                                     tmp_path: Path) -> None:
    c = slurm_cluster
    with attached(c, tmp_path, "cancelled", SLEEP, 2) as (out, proc):
        slurm_id = slurm_record(tmp_path)["slurm_job_id"]
        assert c.slurm("scancel", slurm_id).returncode == 0
        assert proc.wait(120) == EXIT_STOPPED, out.read_text()[-4000:]  # stopped, not failed
    text = out.read_text()
    headline = re.search(r"^stopped: (.*)", text, re.MULTILINE)
    assert headline is not None, text[-4000:]
    assert re.match(rf"Slurm job {slurm_id} was cancelled at \d\d:\d\d:\d\d, not by ddpctl", headline.group(1))
    assert "no rank failed" in text and "first failure: rank" not in text
    data = summary(tmp_path)
    assert data["exit_code"] == EXIT_STOPPED and data["root_cause"] is None and data["ended_by"] == headline.group(1)
    assert "first failure" not in text
    assert {h["state"] for h in data["hosts"]} == {"stopped"}  # no node failed: Slurm ended them
    assert active_jobs(c) == []
    wait_for(lambda: job_processes(c) == {}, 30, "the job's processes to go")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_to_up_cancel_the_job(slurm_cluster: SlurmCluster, tmp_path: Path,
                                                 signum: signal.Signals) -> None:
    c = slurm_cluster
    with attached(c, tmp_path, "signalled", SLEEP, 2) as (out, proc):
        proc.send_signal(signum)
        assert proc.wait(120) == 128 + signum, out.read_text()[-4000:]
    text = out.read_text()
    assert re.search(rf"got {signum.name}\b.*: stopping the job on every host", text), text[-3000:]
    assert active_jobs(c) == []  # `up` returned once Slurm had ended the job
    assert show(c, slurm_record(tmp_path)["slurm_job_id"])["JobState"] == "CANCELLED"


def test_a_node_whose_slurmd_dies_is_named_as_slurm_marks_it(tmp_path_factory: pytest.TempPathFactory) -> None:
    """slurmd killed on the second node: its ranks run on, Slurm stops hearing from it and after its
    SlurmdTimeout (shortened here) marks it down and the job NODE_FAIL. The headline is Slurm's
    verdict on that node, not the 'connection closed' of the ranks that died of it."""
    require_slurm()
    tmp_path = tmp_path_factory.mktemp("nodefail")
    with start_slurm_cluster(2, tmp_path_factory.mktemp("slurm-nodefail"),
                             settings={"SlurmdTimeout": "5"}) as c:
        with attached(c, tmp_path, "nodefail", SLEEP, 2) as (out, proc):
            c.kill_slurmd(1)
            assert proc.wait(150) == 1, out.read_text()[-4000:]
        text = out.read_text()
        failed = c.nodes[1]
        assert re.search(rf"first failure: node1 lost at \S+: Slurm marked node {failed} NODE_FAIL", text), \
            text[-4000:]
        assert "first failure: rank" not in text and "as a consequence" not in text
        data = summary(tmp_path)
        assert data["lost"]["host"] == "node1" and data["root_cause"] is None
        assert {h["host"]: h["state"] for h in data["hosts"]} == {"node0": "stopped", "node1": "lost"}
        assert active_jobs(c) == []


def test_extra_sbatch_that_would_change_the_jobs_shape_is_a_located_error(slurm_cluster: SlurmCluster,
                                                                          tmp_path: Path) -> None:
    job = slurm_job(tmp_path, "shape", SLEEP, slurm={"extra_sbatch": ["--exclusive", "--nodes=1"]})
    proc = ddpctl(slurm_cluster, "up", str(job), cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert re.search(r"shape\.toml:\d+:\d+.*slurm\.extra_sbatch\[1\]", proc.stderr), proc.stderr
    assert "[slurm] nodes" in proc.stderr and "Traceback" not in proc.stderr
    assert active_jobs(slurm_cluster) == [] and not (tmp_path / "runs").exists()  # nothing submitted
