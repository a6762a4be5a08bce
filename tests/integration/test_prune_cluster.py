"""Bounded state on the real cluster (2 hosts with their own homes): `keep_runs = 2` over 4 short
runs leaves 2 run directories on each host and here; a chatty run keeps its output once on a host
(no torchrun rank files left beside output.log) while `ddpctl logs` still shows every line; a
running detached job is pruned neither by a launch beside it nor by `ddpctl prune`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import Cluster, start_cluster
from tests.cluster_files import write_hosts_toml
from tests.ddpctl_run import run_ddpctl, ssh_args, wait_for

pytestmark = pytest.mark.cluster

RUNS = "/srv/root/.ddpctl/runs"  # root's home on a private host: each host's own state root
LINES = 3000  # per rank: a chatty job's output, every line of which must survive
CHATTY = textwrap.dedent("""\
    import os, sys, time
    rank = os.environ["RANK"]
    out = sys.stdout if int(rank) % 2 == 0 else sys.stderr
    for i in range(int(sys.argv[1])):
        out.write("rank %s line %d %s\\n" % (rank, i, "x" * 60))
    out.flush()
    time.sleep(float(sys.argv[2]))
""")


@pytest.fixture(scope="module")
def private2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two hosts whose homes (so their ~/.ddpctl) are their own: pruning touches no other test's runs."""
    from tests.cluster import require_cluster

    require_cluster()
    with start_cluster(2, tmp_path_factory.mktemp("prune"), private=True) as cluster:
        yield cluster


def job(tmp_path: Path, cluster: Cluster, name: str, keep_runs: int, lines: int, sleep: float) -> Path:
    hosts = tmp_path / "hosts.toml"
    write_hosts_toml(hosts, [(h.name, h.address) for h in cluster.hosts], sys.executable)
    hosts.write_text(hosts.read_text().replace("[defaults]\n", f"[defaults]\nkeep_runs = {keep_runs}\n"))
    (tmp_path / "chatty.py").write_text(CHATTY)
    path = tmp_path / f"{name}.toml"
    path.write_text(textwrap.dedent(f"""\
        inventory = {json.dumps(str(hosts))}
        [job]
        name = {json.dumps(name)}
        script = {json.dumps(str(tmp_path / "chatty.py"))}
        args = ["{lines}", "{sleep}"]
        nproc_per_node = 2
        [rendezvous]
        master_port = "auto"
        """))
    return path


def on_host(cluster: Cluster, i: int, *argv: str) -> str:
    done = subprocess.run(cluster.ssh_argv(i, *argv), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def host_runs(cluster: Cluster, i: int) -> list[str]:
    return sorted(on_host(cluster, i, "ls", "-1", RUNS).split())


def here_runs(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "runs").iterdir())


def up(job_path: Path, tmp_path: Path, cluster: Cluster, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_ddpctl("up", str(job_path), "--runs-dir", str(tmp_path / "runs"), "--grace", "3", *extra,
                      *ssh_args(cluster), cwd=tmp_path, timeout=240)


def job_id_of(output: str) -> str:
    return re.search(r"job (\S+): 2 host\(s\)", output).group(1)  # type: ignore[union-attr]


def test_keep_runs_bounds_every_host_and_here_and_the_output_is_kept_once(private2: Cluster,
                                                                        tmp_path: Path) -> None:
    path = job(tmp_path, private2, "bounded", keep_runs=2, lines=LINES, sleep=0)
    ids = []
    for n in range(4):
        done = up(path, tmp_path, private2)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        ids.append(job_id_of(done.stdout + done.stderr))
        if n >= 2:  # the third launch on: one old run goes on each host and here, one line each
            said = done.stdout + done.stderr
            for where in ("on node0", "on node1", "here in"):
                assert re.search(rf"pruned 1 old run {where}", said), said[-3000:]
    for i in range(2):
        assert host_runs(private2, i) == sorted(ids[2:]), host_runs(private2, i)
    assert here_runs(tmp_path) == sorted(ids[2:])

    last = ids[-1]  # the output once on the host: no rank file left beside output.log
    left = on_host(private2, 0, "find", f"{RUNS}/{last}", "-name", "std*.log").split()
    assert left == []
    assert on_host(private2, 0, "ls", f"{RUNS}/{last}/node0").split().count("output.log") == 1
    logs = run_ddpctl("logs", last, "-i", str(tmp_path / "hosts.toml"), *ssh_args(private2), cwd=tmp_path)
    assert logs.returncode == 0, logs.stderr[-2000:]
    for rank in range(4):
        got = [int(m) for m in re.findall(rf"^\[node\d:{rank}\] rank {rank} line (\d+) ", logs.stdout, re.MULTILINE)]
        assert got == list(range(LINES)), f"rank {rank}: {len(got)} of {LINES} lines"
    here_log = (tmp_path / "runs" / last / "node1.log").read_text()
    assert here_log.count("rank 3 line ") == LINES


def test_a_running_detached_job_is_never_pruned(private2: Cluster, tmp_path: Path) -> None:
    long = job(tmp_path, private2, "stays", keep_runs=1, lines=5, sleep=600)
    started = up(long, tmp_path, private2, "--detach")
    assert started.returncode == 0, started.stderr[-3000:]
    detached = json.loads(next((tmp_path / "runs").glob("*/detached.json")).read_text())["job_id"]
    try:
        wait_for(lambda: detached in host_runs(private2, 1), 60, "the detached job's run directory")
        beside = up(job(tmp_path, private2, "beside", keep_runs=1, lines=5, sleep=0), tmp_path, private2)
        assert beside.returncode == 0, beside.stdout[-3000:] + beside.stderr[-3000:]
        inventory = ["-i", str(tmp_path / "hosts.toml"), *ssh_args(private2)]
        pruned = run_ddpctl("prune", "--keep", "0", *inventory, cwd=tmp_path)
        assert pruned.returncode == 0, pruned.stdout + pruned.stderr
        for i in range(2):
            assert host_runs(private2, i) == [detached], host_runs(private2, i)
        assert here_runs(tmp_path) == [detached]
        ps = run_ddpctl("ps", "--json", "--job", detached, *inventory, cwd=tmp_path)
        assert len(json.loads(ps.stdout)["jobs"]) == 2, ps.stdout  # it runs on, untouched
    finally:
        down = run_ddpctl("down", detached, "--grace", "3", "-i", str(tmp_path / "hosts.toml"),
                          *ssh_args(private2), cwd=tmp_path)
    assert down.returncode == 0, down.stdout + down.stderr
    wait_for(lambda: not json.loads(run_ddpctl("ps", "--json", "--job", detached, *inventory,
                                               cwd=tmp_path).stdout)["jobs"], 60, "the detached job's end")
    gone = run_ddpctl("prune", "--keep", "0", *inventory, cwd=tmp_path)  # ended now: it goes everywhere
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert host_runs(private2, 0) == [] and here_runs(tmp_path) == []
