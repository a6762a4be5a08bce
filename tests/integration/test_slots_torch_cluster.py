"""A host's slots are its process count, and a host whose interpreter has no torch is refused
before launch (issue 27), on real hosts."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster import Cluster
from tests.ddpctl_run import TOY, no_job_processes, only_summary, run_ddpctl, ssh_args, wait_for

pytestmark = pytest.mark.cluster

SYSTEM_PYTHON = "/usr/bin/python3"
IDENTITY = re.compile(r"^\[(node\d):(\d)\]\s+rank=(\d) local_rank=(\d) world_size=(\d) node_rank=(\d) "
                      r"params_identical=True", re.MULTILINE)


def inventory(path: Path, cluster: Cluster, extra: dict[str, list[str]]) -> Path:
    """A TOML inventory of the cluster's hosts, root on each, with `extra` lines per host name."""
    lines = ['[defaults]', 'user = "root"', f"python = {json.dumps(sys.executable)}"]
    for h in cluster.hosts:
        lines += ["[[hosts]]", f"name = {json.dumps(h.name)}", f"address = {json.dumps(h.address)}",
                  *extra.get(h.name, [])]
    path.write_text("\n".join(lines) + "\n")
    return path


def job_file(path: Path, inventory_path: Path, name: str) -> Path:
    """A job that sets no nproc_per_node: each host's slots decide."""
    path.write_text(f"inventory = {json.dumps(str(inventory_path))}\n[job]\nname = {json.dumps(name)}\n"
                    f'script = {json.dumps(str(TOY))}\nargs = ["--epochs", "1"]\n'
                    '[rendezvous]\nmaster_port = "auto"\n[env]\nGLOO_SOCKET_IFNAME = "eth0"\n')
    return path


def test_hostfile_slots_are_the_process_count_and_the_dry_run_says_so(cluster2: Cluster, tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{h.name} slots=2\n" for h in cluster2.hosts))
    out = run_ddpctl("up", str(job_file(tmp_path / "hf.toml", hostfile, "hf")), "--dry-run", *ssh_args(cluster2))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "2 host(s), world size 4" in out.stdout
    for h in cluster2.hosts:
        assert re.search(rf"^{h.name} \(node_rank \d, nproc 2 \(hostfile slots\)", out.stdout, re.MULTILINE)


def test_inventory_slots_run_that_many_ranks_per_host(cluster2: Cluster, tmp_path: Path) -> None:
    hosts = inventory(tmp_path / "hosts.toml", cluster2, {h.name: ["slots = 2"] for h in cluster2.hosts})
    runs = tmp_path / "runs"
    out = run_ddpctl("up", str(job_file(tmp_path / "slots.toml", hosts, "slots")), "--runs-dir", str(runs),
                     *ssh_args(cluster2))
    assert out.returncode == 0, out.stderr[-3000:]
    found = sorted(m.group(3, 4, 5, 6) for m in IDENTITY.finditer(out.stdout))
    # (rank, local_rank, world_size, node_rank): two ranks per host, four in all
    assert found == [("0", "0", "4", "0"), ("1", "1", "4", "0"), ("2", "0", "4", "1"), ("3", "1", "4", "1")]
    summary = only_summary(runs)
    assert summary["world_size"] == 4
    wait_for(lambda: no_job_processes(cluster2, summary["job_id"]), 30, "no job process left")


def test_a_host_whose_python_has_no_torch_is_refused_before_any_rank_starts(
        cluster2: Cluster, tmp_path: Path) -> None:
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import torch"], capture_output=True, text=True, check=False)
    assert probe.returncode != 0 and "No module named 'torch'" in probe.stderr, "the system python has torch"
    bad = cluster2.hosts[1].name
    hosts = inventory(tmp_path / "hosts.toml", cluster2, {bad: [f"python = {json.dumps(SYSTEM_PYTHON)}"]})
    runs = tmp_path / "runs"
    out = run_ddpctl("up", str(job_file(tmp_path / "notorch.toml", hosts, "notorch")), "--runs-dir", str(runs),
                     *ssh_args(cluster2))
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert "the pre-launch checks found errors; no rank was started" in out.stderr
    assert f"torch is not importable by {SYSTEM_PYTHON}" in out.stderr
    refused = [line for line in out.stderr.splitlines() if "torch is not importable" in line]
    assert len(refused) == 1 and bad in refused[0], out.stderr  # only that host, named
    assert not runs.exists()  # no run was started
