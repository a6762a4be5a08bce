"""The reference train jobs across two real hosts, through `ddpctl up` and `ddpctl doctor`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cluster import Cluster
from tests.ddpctl_run import REPO, run_ddpctl, ssh_args, write_job

pytestmark = pytest.mark.cluster

CLASSIFIER = REPO / "train_jobs" / "image_classifier" / "train.py"


def test_image_classifier_learns_across_two_hosts(cluster2: Cluster, tmp_path: Path) -> None:
    args = ["--epochs", "4", "--width", "8", "--train-size", "512", "--test-size", "256", "--batch-size", "32",
            "--checkpoint-dir", str(tmp_path / "ckpt")]
    job = write_job(tmp_path, cluster2, "classifier", args, script=CLASSIFIER, nproc=1)
    out = run_ddpctl("up", str(job), "--runs-dir", str(tmp_path / "runs"), *ssh_args(cluster2), timeout=400)
    assert out.returncode == 0, out.stderr[-2000:]
    final = re.search(r"final acc=([0-9.]+)", out.stdout)
    assert final is not None and float(final.group(1)) > 0.3
    checks = re.findall(r"world_size=2 node_rank=(\d) params_identical=(\w+) checksum=(\S+)", out.stdout)
    assert sorted(n for n, _s, _c in checks) == ["0", "1"]
    assert {s for _n, s, _c in checks} == {"True"} and len({c for _n, _s, c in checks}) == 1
    assert (tmp_path / "ckpt" / "last.pt").exists()


def test_doctor_bandwidth_reports_a_monotone_size_table(cluster2: Cluster, tmp_path: Path) -> None:
    job = write_job(tmp_path, cluster2, "bw", env={"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1"})
    out = run_ddpctl("doctor", str(job), "--bandwidth", "--pairs", "--max-bytes", "1M", "--json",
                     "--runs-dir", str(tmp_path / "runs"), *ssh_args(cluster2), timeout=300)
    assert out.returncode == 0, out.stdout[-2000:]
    report = json.loads(out.stdout)
    table = report["bandwidth"]
    sizes = [r["size_bytes"] for r in table["results"]]
    assert sizes == sorted(sizes) and sizes[0] == 1024 and sizes[-1] == 1 << 20
    assert table["world_size"] == 2 and all(r["busbw_gbps"] > 0 for r in table["results"])
    assert list(report["pairs"]) == ["node0<->node1"] and report["pairs"]["node0<->node1"] > 0
