"""The reference train jobs across two real hosts, through `ddpctl up` and `ddpctl doctor`."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from inventory import load_job
from tests.cluster import Cluster, require_cluster, start_cluster
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
    out = run_ddpctl("doctor", str(job), "--bandwidth", "--max-bytes", "1M", "--json",
                     "--runs-dir", str(tmp_path / "runs"), *ssh_args(cluster2), timeout=300)
    assert out.returncode == 0, out.stdout[-2000:]
    report = json.loads(out.stdout)
    table = report["bandwidth"]
    sizes = [r["size_bytes"] for r in table["results"]]
    assert sizes == sorted(sizes) and sizes[0] == 1024 and sizes[-1] == 1 << 20
    assert table["world_size"] == 2 and all(r["busbw_gbps"] > 0 for r in table["results"])


@pytest.fixture(scope="module")
def private2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two hosts that share no filesystem (each its own /srv), for the job's [sync]."""
    require_cluster()
    with start_cluster(2, tmp_path_factory.mktemp("private2"), private=True) as cluster:
        yield cluster


def classifier_with_multinode_sync(proj: Path, cluster: Cluster, epochs: int) -> Path:
    """The image classifier's directory as job-multinode.toml syncs it (its [sync] table, its
    --checkpoint-dir checkpoints --resume), with a tiny run and this cluster's inventory."""
    multinode = load_job(CLASSIFIER.parent / "job-multinode.toml")
    assert multinode.sync is not None and multinode.sync.exclude == ()  # no exclude keeps the checkpoints
    resume = list(multinode.args[-3:])
    assert resume == ["--checkpoint-dir", "checkpoints", "--resume"]
    proj.mkdir(exist_ok=True)
    for src in CLASSIFIER.parent.glob("*.py"):
        shutil.copy2(src, proj / src.name)
    args = ["--epochs", str(epochs), "--width", "4", "--train-size", "64", "--test-size", "32", "--batch-size", "16",
            *resume]
    job = proj / "job-multinode.toml"
    job.write_text(f"inventory = {json.dumps(str(cluster.hosts_toml))}\n"
                   f'[job]\nname = "classifier_resume"\nscript = "train.py"\nargs = {json.dumps(args)}\n'
                   'nproc_per_node = 1\n[rendezvous]\nmaster_port = "auto"\n[env]\nGLOO_SOCKET_IFNAME = "eth0"\n'
                   '[sync]\ndest = "/srv/ic/train_jobs/image_classifier"\n')
    return job


def test_image_classifier_resumes_from_the_checkpoints_its_hosts_kept_across_syncs(
        private2: Cluster, tmp_path: Path) -> None:
    proj = tmp_path / "image_classifier"
    runs = ["--runs-dir", str(tmp_path / "runs"), *ssh_args(private2)]
    first = run_ddpctl("up", str(classifier_with_multinode_sync(proj, private2, 1)), *runs, timeout=300)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "resume: no checkpoint in checkpoints, starting fresh" in first.stdout and "epoch=0 loss=" in first.stdout
    ckpt = "/srv/ic/train_jobs/image_classifier/checkpoints/last.pt"
    assert private2.run_in(0, ["test", "-s", ckpt]).returncode == 0  # rank 0's host wrote it

    second = run_ddpctl("up", str(classifier_with_multinode_sync(proj, private2, 2)), *runs, timeout=300)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-4000:]
    assert re.search(r"sync node0: 1 file \(\d+ B\) sent, .*kept \d+ files? the host made", out), out  # the job file
    assert "resumed from checkpoint at epoch=1 (restart 0)" in second.stdout, second.stdout
    assert "epoch=1 loss=" in second.stdout and "epoch=0 loss=" not in second.stdout  # epoch 0 was not run again
    assert private2.run_in(0, ["test", "-s", ckpt]).returncode == 0
