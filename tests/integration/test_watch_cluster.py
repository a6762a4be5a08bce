"""Watching a running job on the real cluster (2 hosts x 2 ranks, gloo): the straggler named with
its host and side, a transient one named then back to pace (its finding's start, end and
duration), nothing named on a balanced noisy run, a stall's verdict naming the collective and the
rank that never entered it (asleep, SIGSTOPped, or having skipped it), creeping memory and an idle
(fake) GPU from the nodes' samples; and the straggler and a stall on Slurm."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.watch.straggler import WINDOW_SAMPLES
from tests.cluster import Cluster
from tests.ddpctl_run import REPO, no_job_processes, only_summary, run_ddpctl, ssh_args, wait_for, write_job
from tests.fake_gpu import fake_nvidia_smi
from tests.slurm_cluster import SlurmCluster
from tests.slurm_run import active_jobs, ddpctl, slurm_job, summary

pytestmark = pytest.mark.cluster

WATCHED = REPO / "train_jobs" / "watched.py"


def watched_job(tmp_path: Path, cluster: Cluster, name: str, args: list[str], watch: str = "") -> Path:
    job = write_job(tmp_path, cluster, name, ["--step-ms", "60", *args], script=WATCHED)
    job.write_text(job.read_text() + "[watch]\npulse = 2\n" + watch)
    return job


def up(cluster: Cluster, job: Path, runs: Path, *extra: str) -> tuple[Any, dict[str, Any]]:
    out = run_ddpctl("up", str(job), "--runs-dir", str(runs), "--grace", "3", *extra, *ssh_args(cluster), timeout=180)
    summary = only_summary(runs)
    wait_for(lambda: no_job_processes(cluster, summary["job_id"]), 30, "no process of the job left")
    return out, summary


def kinds(summary: dict[str, Any]) -> list[str]:
    return [f["kind"] for f in summary["findings"]]


@pytest.mark.parametrize(("rank", "host", "side", "words"), [
    (3, "node1", "input", "before its forward pass"),
    (1, "node0", "compute", "in its forward/backward pass"),
])
def test_a_slow_rank_is_named_with_its_host_and_side(cluster2: Cluster, tmp_path: Path, rank: int, host: str,
                                                       side: str, words: str) -> None:
    job = watched_job(tmp_path, cluster2, f"slow-{side}", ["--steps", "200", "--slow-rank", str(rank),
                                                             "--slow-ms", "40", "--slow-side", side,
                                                             "--slow-after", "40"], watch="straggler_warmup = 1\n")
    out, summary = up(cluster2, job, tmp_path / "runs")
    assert out.returncode == 0, out.stderr
    assert f"straggler: rank {rank} on {host} is " in out.stderr and words in out.stderr, out.stderr
    (finding,) = [f for f in summary["findings"] if f["kind"] == "straggler"]
    assert (finding["rank"], finding["host"]) == (rank, host)
    assert 40 < finding["step"] <= 40 + 2 * WINDOW_SAMPLES  # named within two windows of the slowdown
    assert finding["end"] is None and finding["duration_s"] > 0  # still slow at the end
    assert "progress: step " in out.stderr  # the pulse, stderr not being a terminal
    run_dir = Path(next((tmp_path / "runs").glob("*/summary.json"))).parent
    report = json.loads((run_dir / "report.json").read_text())
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1, 2, 3]
    slow = next(r for r in report["ranks"] if r["rank"] == rank)
    assert slow["wait_ms"] < min(r["wait_ms"] for r in report["ranks"] if r["rank"] != rank)
    assert report["throughput"] and report["findings"][0]["kind"] == "straggler"
    assert "straggler" in (run_dir / "report.html").read_text()
    account = summary["account"]  # the others' wait for it, while its finding was open, is charged to its host
    (waited,) = [p for p in account["parts"] if p["kind"] == "straggler"]
    assert waited["host"] == host and waited["seconds"] > 0
    assert list(account["hosts"]) == [host], account
    assert re.search(rf"\d+ s to {host} \(\d+ s straggler\)", account["line"]), account["line"]
    assert report["account"]["line"] == account["line"]


def test_a_balanced_run_with_noise_names_no_straggler(cluster2: Cluster, tmp_path: Path) -> None:
    """About 15 s of +-15 % noise per step on a shared 2-core box, watched from 2 s after the first step."""
    job = watched_job(tmp_path, cluster2, "noisy", ["--steps", "250", "--noise", "0.15"],
                      watch="straggler_warmup = 2\n")
    out, summary = up(cluster2, job, tmp_path / "runs")
    assert out.returncode == 0, out.stderr
    assert summary["findings"] == [], out.stderr
    assert summary["steps"] == 250
    assert "straggler" not in out.stderr and "back to pace" not in out.stderr
    account = summary["account"]  # a clean run: over 90 % productive once every rank has stepped
    startup = sum(p["seconds"] for p in account["parts"] if p["kind"] == "start-up")
    assert account["productive_s"] / (account["wall_s"] - startup) > 0.9, account
    assert account["hosts"] == {} and out.stderr.rstrip().splitlines()[-1] == f"ddpctl: {account['line']}"


def test_a_transient_straggler_is_named_then_back_to_pace(cluster2: Cluster, tmp_path: Path) -> None:
    """Rank 3 40 ms slower on its input from step 40 to step 140, then at pace for 140 steps: named
    once, then said back to pace; its finding has a start, an end and a duration in summary.json and
    report.json."""
    job = watched_job(tmp_path, cluster2, "transient", ["--steps", "280", "--slow-rank", "3", "--slow-ms", "40",
                                                         "--slow-after", "40", "--slow-until", "140"],
                      watch="straggler_warmup = 1\nstraggler_recovery = 1\n")
    out, summary = up(cluster2, job, tmp_path / "runs")
    assert out.returncode == 0, out.stderr
    named = out.stderr.index("straggler: rank 3 on node1 is ")
    back = re.search(r"rank 3 on node1 back to pace after (\d+) s", out.stderr)
    assert back is not None and back.start() > named, out.stderr
    assert out.stderr.count("straggler: ") == 1, out.stderr
    (finding,) = [f for f in summary["findings"] if f["kind"] == "straggler"]
    assert (finding["rank"], finding["host"]) == (3, "node1") and 40 < finding["step"] <= 140
    assert finding["start"] <= finding["at"] < finding["end"]
    assert finding["duration_s"] == pytest.approx(finding["end"] - finding["start"], abs=0.01)
    assert int(back.group(1)) == round(finding["duration_s"])
    run_dir = Path(next((tmp_path / "runs").glob("*/summary.json"))).parent
    (reported,) = json.loads((run_dir / "report.json").read_text())["findings"]
    assert {k: reported[k] for k in ("start", "end", "duration_s")} == {
        k: finding[k] for k in ("start", "end", "duration_s")}
    assert "back to pace after" in (run_dir / "report.html").read_text()


@pytest.mark.parametrize(("how", "rank", "host", "where"), [
    ("sleep", 2, "node1", "rank 2 is in `load_batch` at watched.py:"),
    ("skip", 3, "node1", "rank 3 is in `wait_for_peers` at watched.py:"),
    ("stop", 1, "node0", "rank 1 did not answer: the process is stopped"),
])
def test_a_stall_names_the_collective_and_the_rank_that_never_entered_it(
        cluster2: Cluster, tmp_path: Path, how: str, rank: int, host: str, where: str) -> None:
    job = watched_job(tmp_path, cluster2, f"hang-{how}", ["--steps", "1000", "--hang-rank", str(rank),
                                                           "--hang-at", "12", "--hang-how", how],
                      watch="hang_after = 3\n")
    out, summary = up(cluster2, job, tmp_path / "runs", "--on-hang", "stop")
    assert out.returncode == 1, out.stderr
    others = ", ".join(str(r) for r in range(4) if r != rank)
    assert "hang: the job waits in all_reduce #" in out.stderr, out.stderr
    assert f"on the default group: ranks {others} entered, rank {rank} never did ({host})" in out.stderr
    assert where in out.stderr
    (finding,) = [f for f in summary["findings"] if f["kind"] == "hang"]
    assert finding["rank"] == rank
    assert "\nfirst failure: hang: the job waits in all_reduce #" in out.stderr  # the cause, not a victim
    stalled = [p for p in summary["account"]["parts"] if p["kind"] == "no progress"]  # from its last step
    assert [p["host"] for p in stalled] == [host] and stalled[0]["seconds"] >= 3, summary["account"]


def test_memory_that_keeps_rising_is_a_finding_and_every_sample_is_in_the_report(
        cluster2: Cluster, tmp_path: Path) -> None:
    job = watched_job(tmp_path, cluster2, "leaky", ["--steps", "200", "--leak-mb", "1"], watch="sample_every = 0.5\n")
    out, summary = up(cluster2, job, tmp_path / "runs")
    assert out.returncode == 0, out.stderr
    creeping = [f for f in summary["findings"] if f["kind"] == "memory creeping"]
    assert creeping and {f["host"] for f in creeping} <= {"node0", "node1"}, out.stderr
    assert "memory creeping: the job's RSS on node" in out.stderr
    run_dir = Path(next((tmp_path / "runs").glob("*/summary.json"))).parent
    samples = json.loads((run_dir / "report.json").read_text())["samples"]
    assert {s["host"] for s in samples} == {"node0", "node1"}
    assert all(s["rss_mib"] and s["cpu_percent"] is not None for s in samples)
    assert all(s["gpu_util"] == [] for s in samples)  # no nvidia-smi on these hosts


def test_an_idle_gpu_of_the_job_is_a_finding_and_its_samples_are_in_the_report(
        cluster2: Cluster, tmp_path: Path) -> None:
    job = watched_job(tmp_path, cluster2, "idle-gpu", ["--steps", "120"],
                      watch="sample_every = 0.5\ngpu_idle_after = 2\n")
    with fake_nvidia_smi(cluster2, 0, "idle.csv", tmp_path / "gpu0"):
        out, summary = up(cluster2, job, tmp_path / "runs")
    assert out.returncode == 0, out.stderr
    idle = [f for f in summary["findings"] if f["kind"] == "gpu idle"]
    assert sorted((f["host"], f["text"].split(" of the job")[0]) for f in idle) == [
        ("node0", "gpu idle: node0 GPU 0"), ("node0", "gpu idle: node0 GPU 1")], out.stderr
    run_dir = Path(next((tmp_path / "runs").glob("*/summary.json"))).parent
    samples = json.loads((run_dir / "report.json").read_text())["samples"]
    assert {tuple(s["gpu_mem_total_mib"]) for s in samples if s["host"] == "node0"} == {(81559, 81559)}
    assert all(s["gpu_util"] == [] for s in samples if s["host"] == "node1")
    assert "GPU 0" in (run_dir / "report.html").read_text()


def slurm_watched(tmp_path: Path, name: str, args: list[str], watch: str = "") -> Path:
    job = slurm_job(tmp_path, name, WATCHED.read_text(), ["--step-ms", "60", *args])
    job.write_text(job.read_text() + "[watch]\npulse = 2\n" + watch)
    return job


def test_on_slurm_the_straggler_is_named_and_a_stall_gets_its_verdict_through_the_allocation(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    slow = slurm_watched(tmp_path, "slurm-slow", ["--steps", "140", "--slow-rank", "3", "--slow-ms", "40",
                                                  "--slow-after", "20"], watch="straggler_warmup = 1\n")
    out = ddpctl(slurm_cluster, "up", str(slow), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "straggler: rank 3 on node1 is " in out.stderr and "before its forward pass" in out.stderr
    assert [f["rank"] for f in summary(tmp_path)["findings"] if f["kind"] == "straggler"] == [3]
    hung = tmp_path / "hung"
    hung.mkdir()
    job = slurm_watched(hung, "slurm-hang", ["--steps", "1000", "--hang-rank", "2", "--hang-at", "12"],
                        watch="hang_after = 3\n")
    out = ddpctl(slurm_cluster, "up", str(job), "--on-hang", "stop", "--grace", "3", cwd=hung)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "ranks 0, 1, 3 entered, rank 2 never did (node1) — rank 2 is in `load_batch` at" in out.stderr
    assert [f["rank"] for f in summary(hung)["findings"] if f["kind"] == "hang"] == [2]
    assert active_jobs(slurm_cluster) == []
