"""The Slurm test cluster is real: idle nodes, multi-node jobs, a login node over SSH, teardown."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster_sys import pid_alive, read_pid, wait_until
from tests.slurm_cluster import (
    SLURM_REGISTRY,
    SlurmCluster,
    reap_stale_slurm_clusters,
    require_slurm,
    slurm_leftovers,
    start_slurm_cluster,
)

pytestmark = pytest.mark.cluster

# A job that leaves a double-forked process behind (it escapes its shell; only cgroups find it).
ORPHAN_JOB = "setsid sh -c 'sleep 300 & echo $! > {pid_file}' </dev/null >/dev/null 2>&1; sleep 300"


def job_state(cluster: SlurmCluster, job_id: str) -> str:
    return cluster.slurm("squeue", "-h", "-j", job_id, "-o", "%T").stdout.strip()


def wait_running(cluster: SlurmCluster, job_id: str, pid_file: Path) -> int:
    """Wait until the job runs and its orphan wrote its pid; return that pid."""
    wait_until(lambda: job_state(cluster, job_id) == "RUNNING" and read_pid(pid_file) is not None,
               30.0, f"job {job_id} to run")
    pid = read_pid(pid_file)
    assert pid is not None
    return pid


def test_cluster_comes_up_with_all_nodes_idle(slurm_cluster: SlurmCluster) -> None:
    c = slurm_cluster
    assert c.nodes == [f"{c.prefix}-c1", f"{c.prefix}-c2"]
    idle = c.slurm("sinfo", "-h", "-N", "-t", "idle", "-o", "%N", check=True).stdout.split()
    assert sorted(set(idle)) == c.nodes
    short = c.slurm("scontrol", "show", "partition", "short", check=True).stdout
    assert "MaxNodes=1 " in short and "MaxTime=00:10:00 " in short
    assert c.bring_up_s > 0  # how long: bench/slurm_cluster_cost.py
    # The root namespace stays without Slurm configuration: clients there need client_env.
    assert not Path("/etc/slurm/slurm.conf").exists()
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    bare = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=30, env=env)
    assert bare.returncode != 0


def test_two_node_batch_job_runs_srun_on_both_nodes(slurm_cluster: SlurmCluster,
                                                    tmp_path: Path) -> None:
    c = slurm_cluster
    out = tmp_path / "job.out"
    done = c.slurm("sbatch", "--wait", "-N", "2", "-o", str(out), "--wrap", "srun hostname",
                   timeout=60)
    assert done.returncode == 0, done.stderr
    assert sorted(out.read_text().split()) == c.nodes
    c.wait_idle(30)
    assert c.node_pids(0) == [] and c.node_pids(1) == []


def test_login_node_over_ssh_needs_no_slurm_conf(slurm_cluster: SlurmCluster,
                                                 tmp_path: Path) -> None:
    c = slurm_cluster
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    argv = ["ssh", "-F", str(c.ssh_config), c.login_alias]
    info = subprocess.run([*argv, "sinfo", "-h"], capture_output=True, text=True, timeout=60,
                          env=env)
    assert info.returncode == 0, info.stderr
    assert info.stdout.split()[:2] == ["debug*", "up"]
    who = subprocess.run([*argv, 'hostname; echo "conf=${SLURM_CONF-}"'], capture_output=True,
                         text=True, timeout=60, env=env)
    assert who.stdout.split() == [f"{c.prefix}-login", "conf="]
    # A job submitted there runs srun and scontrol with the config at the default path.
    out = tmp_path / "login-job.out"
    job = subprocess.run(
        [*argv, f"sbatch --wait -N 2 -o {out} --wrap 'srun hostname; scontrol show hostnames'"],
        capture_output=True, text=True, timeout=60, env=env)
    assert job.returncode == 0, job.stderr
    assert sorted(out.read_text().split()) == sorted(c.nodes * 2)


def test_scancel_leaves_no_process_on_the_node(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    c = slurm_cluster
    pid_file = tmp_path / "orphan.pid"
    job_id = c.slurm("sbatch", "--parsable", "-N", "1", "-w", c.nodes[1], "-o", "/dev/null",
                     "--wrap", ORPHAN_JOB.format(pid_file=pid_file), check=True).stdout.strip()
    orphan = wait_running(c, job_id, pid_file)
    assert orphan in c.node_pids(1)
    c.slurm("scancel", job_id, check=True)
    wait_until(lambda: c.node_pids(1) == [], 30.0, f"job {job_id}'s processes to go")
    assert not pid_alive(orphan)
    c.wait_idle(30)


def test_teardown_leaves_nothing(tmp_path: Path) -> None:
    require_slurm()
    cluster = start_slurm_cluster(1, tmp_path / "c")
    try:
        pid_file = tmp_path / "orphan.pid"
        job_id = cluster.slurm("sbatch", "--parsable", "-o", "/dev/null", "--wrap",
                               ORPHAN_JOB.format(pid_file=pid_file), check=True).stdout.strip()
        orphan = wait_running(cluster, job_id, pid_file)
        daemons = [read_pid(p) for p, _ in cluster._pid_files()]
        assert all(pid is not None and pid_alive(pid) for pid in daemons)
        assert slurm_leftovers(cluster.prefix, cluster.nodes)  # namespaces, links, cgroups
    finally:
        cluster.teardown()
    assert cluster.teardown_s > 0  # how long: bench/slurm_cluster_cost.py
    assert not any(pid_alive(pid) for pid in [orphan, *daemons] if pid is not None)
    assert slurm_leftovers(cluster.prefix, cluster.nodes) == []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    assert f"{cluster.prefix}-" not in netns.stdout + links.stdout
    assert not list(Path("/sys/fs/cgroup").glob(f"*/slurm_{cluster.prefix}-*"))
    assert not (SLURM_REGISTRY / f"{cluster.prefix}.json").exists()


def test_cluster_of_a_dead_owner_is_reaped(tmp_path: Path) -> None:
    require_slurm()
    owner = (
        "import os, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
        "from tests.slurm_cluster import start_slurm_cluster;"
        "c = start_slurm_cluster(1, Path(sys.argv[2]));"
        "c.slurm('sbatch', '-o', '/dev/null', '--wrap', 'sleep 300', check=True);"
        "print(c.prefix, flush=True); os._exit(0)"
    )
    root = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-c", owner, root, str(tmp_path)],
                          capture_output=True, text=True, timeout=60, check=True)
    prefix = done.stdout.strip()
    nodes = [f"{prefix}-c1"]
    slurmctld = read_pid(tmp_path / "run" / "slurmctld.pid")
    assert slurm_leftovers(prefix, nodes), "the owner died without teardown: its cluster remains"
    assert prefix in reap_stale_slurm_clusters()
    assert slurm_leftovers(prefix, nodes) == []
    assert slurmctld is not None and not pid_alive(slurmctld)
