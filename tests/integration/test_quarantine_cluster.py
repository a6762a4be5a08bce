"""Quarantine on the real cluster (orchestrator/restarts/hostledger.py): a host whose rank is
SIGKILLed in two runs is quarantined, the next `up` runs on the spare and says so with the release
command, and `ddpctl hosts --release` puts the host back. The ledger is this test's own
(tests/conftest.py sets DDPCTL_STATE_DIR; the `ddpctl` subprocesses inherit it)."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import Cluster
from tests.cluster_files import write_hosts_toml
from tests.ddpctl_run import run_ddpctl, ssh_args

pytestmark = pytest.mark.cluster

# Every rank meets the others; a rank on the host named by DDPCTL_TEST_KILL then dies of SIGKILL
# (as the OOM killer ends it), the others wait for it in a barrier.
SCRIPT = """\
import os, signal, socket
import torch.distributed as dist

dist.init_process_group("gloo")
if socket.gethostname() == os.environ["DDPCTL_TEST_KILL"]:
    os.kill(os.getpid(), signal.SIGKILL)
dist.barrier()
print("rank", dist.get_rank(), "done on", socket.gethostname(), flush=True)
dist.destroy_process_group()
"""


def job_file(tmp_path: Path, cluster: Cluster) -> tuple[Path, Path]:
    hosts = tmp_path / "hosts.toml"
    write_hosts_toml(hosts, [(h.name, h.address) for h in cluster.hosts], sys.executable, [cluster.hosts[2].name])
    script = tmp_path / "killed.py"
    script.write_text(SCRIPT)
    job = tmp_path / "job.toml"
    job.write_text(textwrap.dedent(f"""\
        inventory = {json.dumps(str(hosts))}
        [job]
        name = "quarantine"
        script = {json.dumps(str(script))}
        nproc_per_node = 1
        [rendezvous]
        master_port = "auto"
        join_timeout = 30
        [env]
        GLOO_SOCKET_IFNAME = "eth0"
        DDPCTL_TEST_KILL = "node1"
        """))
    return job, hosts


def up(job: Path, tmp_path: Path, cluster: Cluster) -> tuple[int, str]:
    done = run_ddpctl("up", str(job), "--runs-dir", str(tmp_path / "runs"), "--grace", "2", *ssh_args(cluster),
                      timeout=120)
    return done.returncode, done.stdout + done.stderr


def rows(hosts: Path) -> dict[str, dict[str, Any]]:
    done = run_ddpctl("hosts", "-i", str(hosts), "--json", timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    return {h["name"]: h for h in json.loads(done.stdout)["hosts"]}


def states(hosts: Path) -> dict[str, str]:
    return {name: row["state"] for name, row in rows(hosts).items()}


def test_a_host_sigkilled_in_two_runs_is_quarantined_and_the_next_up_runs_on_the_spare(
        make_cluster: Callable[[int], Cluster], tmp_path: Path) -> None:
    cluster = make_cluster(3)
    job, hosts = job_file(tmp_path, cluster)
    for run in (1, 2):
        code, text = up(job, tmp_path, cluster)
        assert code != 0, text[-3000:]
        assert "SIGKILL" in text, text[-3000:]
        if run == 2:
            assert "node1 is suspect (1 host fault(s) in 24 h: SIGKILL at " in text, text[-3000:]
    assert states(hosts) == {"node0": "ok", "node1": "quarantined", "node2": "ok"}
    code, text = up(job, tmp_path, cluster)
    assert code == 0, text[-3000:]
    assert "leaving node1 out: quarantined (2 host faults in 24 h: SIGKILL at " in text, text[-3000:]
    assert "; release it with: ddpctl hosts --release node1" in text
    assert "spare node2 takes a place in this run" in text
    assert "done on node2" in text and "done on node1" not in text
    # a detached up leaves it out too, and its hosts are recorded as seen
    before = {name: row["runs"] for name, row in rows(hosts).items()}
    detached = run_ddpctl("up", str(job), "--detach", "--runs-dir", str(tmp_path / "detached"), *ssh_args(cluster),
                          timeout=120)
    text = detached.stdout + detached.stderr
    assert detached.returncode == 0, text[-3000:]
    assert "leaving node1 out: quarantined (2 host faults in 24 h: " in text, text[-3000:]
    assert "spare node2 takes a place in this run" in text
    (record,) = (tmp_path / "detached").glob("*/detached.json")
    assert sorted(json.loads(record.read_text())["started"]) == ["node0", "node2"]
    after = {name: row["runs"] for name, row in rows(hosts).items()}
    assert after == {"node0": before["node0"] + 1, "node1": before["node1"], "node2": before["node2"] + 1}
    released = run_ddpctl("hosts", "-i", str(hosts), "--release", "node1", timeout=30)
    assert released.returncode == 0 and "released node1" in released.stdout, released.stdout + released.stderr
    assert states(hosts)["node1"] == "ok"
