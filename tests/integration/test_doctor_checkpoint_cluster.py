"""`ddpctl doctor`'s checkpoint check on the namespace cluster: a [restart] checkpoint_dir on the
filesystem the hosts share is shared, one in each host's own /srv is host-local, one under a
regular file cannot be created; doctor leaves no marker file behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from tests.cluster import Cluster, start_cluster

pytestmark = pytest.mark.cluster
runner = CliRunner()
MARKERS = ".ddpctl-doctor-*"


def doctor(cluster: Cluster, jobdir: Path, checkpoint_dir: str) -> dict[str, Any]:
    jobdir.mkdir(parents=True, exist_ok=True)
    (jobdir / "train.py").write_text("print('train')\n")
    job = jobdir / "job.toml"
    job.write_text(f"inventory = {json.dumps(str(cluster.hosts_toml))}\n[job]\nname = \"ckpt\"\n"
                   'script = "train.py"\n[rendezvous]\nmaster_port = "auto"\n'
                   f"[restart]\nmax_restarts = 1\ncheckpoint_dir = {json.dumps(checkpoint_dir)}\n"
                   '[env]\nGLOO_SOCKET_IFNAME = "eth0"\nNCCL_SOCKET_IFNAME = "eth0"\n')
    result = runner.invoke(app, ["doctor", str(job), "--json", "--ssh-config", str(cluster.ssh_config),
                                 "--connect-timeout", "5"])
    try:
        data: dict[str, Any] = json.loads(result.stdout)
    except ValueError:
        pytest.fail(f"doctor printed no JSON (exit {result.exit_code}): {result.output}")
    return data


def checkpoint_findings(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in data["findings"] if f["check"] == "checkpoint"]


def test_a_dir_on_the_shared_filesystem_is_shared_and_no_marker_stays(cluster2: Cluster, tmp_path: Path) -> None:
    data = doctor(cluster2, tmp_path / "job", "ckpt")
    found = checkpoint_findings(data)
    assert [(f["status"], f["message"]) for f in found if f["host"] is None] == [
        ("ok", f"{tmp_path / 'job' / 'ckpt'} is shared by all 2 hosts")], found
    assert {h: row["checkpoint"] for h, row in data["table"].items()} == {"node0": "ok", "node1": "ok"}
    assert (tmp_path / "job" / "ckpt").is_dir() and list(tmp_path.rglob(MARKERS)) == []


def test_a_dir_that_cannot_be_created_fails_on_each_host(cluster2: Cluster, tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "file").write_text("a file, not a directory\n")
    data = doctor(cluster2, tmp_path / "job", "file/ckpt")
    fails = {f["host"]: f for f in checkpoint_findings(data) if f["status"] == "fail"}
    assert set(fails) == {"node0", "node1"}
    path = tmp_path / "job" / "file" / "ckpt"
    assert f"cannot create checkpoint_dir {path} on node1" in fails["node1"]["message"]
    assert "Not a directory" in fails["node1"]["message"] and data["exit_code"] == 1


def test_a_dir_in_each_hosts_own_filesystem_is_host_local(cluster_available: None, tmp_path: Path) -> None:
    with start_cluster(2, tmp_path / "private", private=True) as cluster:
        data = doctor(cluster, tmp_path / "job", "~/ckpt")  # root's home: each host's own /srv
    found = checkpoint_findings(data)
    (local,) = [f for f in found if f["host"] is None]
    assert local["status"] == "warn" and "host-local on each host" in local["message"], found
    assert "filesystem every host mounts" in local["fix"]
    assert {f["host"] for f in found if f["status"] == "ok"} == {"node0", "node1"}  # each writable
