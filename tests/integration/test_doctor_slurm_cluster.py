"""`ddpctl doctor job.toml` for a Slurm job on a real Slurm cluster (slurmctld + one slurmd per network
namespace): the controller checks (partition exists and takes the request), then the node checks in
one short allocation (the node agent on both nodes, the rendezvous port probed between them), and
no job left behind. The nodes share this filesystem, so `[slurm] python` is this interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.ddpctl_run import ddpctl_argv, wait_for
from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
NODE_CHECKS = ("python", "versions", "workdir", "firewall", "ifname", "nccl", "dns", "clock")


def doctor_job(directory: Path, **slurm: Any) -> Path:
    """A job.toml with a [slurm] table (the toy script); values JSON-quoted, valid TOML."""
    table = {"nodes": 2, "python": sys.executable, **slurm}
    lines = ["[job]", 'name = "doctor"', f"script = {json.dumps(str(REPO / 'train_jobs' / 'toy' / 'train.py'))}",
             "nproc_per_node = 1", "[slurm]", *[f"{k} = {json.dumps(v)}" for k, v in table.items()],
             "[env]", 'GLOO_SOCKET_IFNAME = "eth0"']
    path = directory / "job.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def doctor(cluster: SlurmCluster, job: Path, *args: str, login: bool = False, home: Path | None = None,
           timeout: float = 180) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run `ddpctl doctor --json`; Slurm's config comes from SLURM_CONF, or from the login node."""
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    if not login:
        env.update(cluster.client_env)
    if home is not None:  # the job's files on the cluster side go under $HOME/.ddpctl/runs
        env["HOME"] = str(home)
    proc = subprocess.run(ddpctl_argv("doctor", str(job), "--json", *args), capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=job.parent, check=False)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc, json.loads(proc.stdout)


def of(report: dict[str, Any], check: str, status: str | None = None) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["check"] == check and (status is None or f["status"] == status)]


def no_doctor_job_left(cluster: SlurmCluster) -> bool:
    """No node-check job in the queue but ended ones (squeue keeps them MinJobAge seconds)."""
    out = cluster.slurm("squeue", "-h", "-n", "ddpctl-doctor", "-o", "%i %T", check=True).stdout
    return all(line.split()[1] in ("COMPLETED", "CANCELLED", "FAILED") for line in out.splitlines())


def test_a_healthy_two_node_job_passes_with_the_node_checks_on_both_nodes(slurm_cluster: SlurmCluster,
                                                                          tmp_path: Path) -> None:
    c = slurm_cluster
    home = tmp_path / "home"
    home.mkdir()
    proc, report = doctor(c, doctor_job(tmp_path), home=home)
    assert proc.returncode == 0, json.dumps(report["findings"], indent=1)[-4000:]
    assert report["hosts"] == ["slurm", *c.nodes]
    for check in ("slurm", "partition", "proctrack"):
        assert report["table"]["slurm"][check] == "ok"
    for node in c.nodes:
        assert report["table"][node]["alloc"] == "ok"
        for check in NODE_CHECKS:
            assert report["table"][node][check] in ("ok", "info"), (node, check, report["table"][node])
    assert {f["host"] for f in of(report, "python", "ok")} == set(c.nodes)
    assert {f["host"] for f in of(report, "firewall", "ok")} == set(c.nodes)  # probed both ways
    assert "ProctrackType=proctrack/cgroup" in of(report, "proctrack")[0]["message"]
    (dns,) = {f["message"] for f in of(report, "dns", "ok")}
    assert dns.startswith(f"master_addr {c.nodes[0]} -> ")  # the rendezvous host, resolved on every node
    assert no_doctor_job_left(c)
    assert list((home / ".ddpctl" / "runs").iterdir()) == []  # its files removed


def test_more_nodes_than_the_partitions_max_nodes_is_an_error_before_any_allocation(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    proc, report = doctor(slurm_cluster, doctor_job(tmp_path, partition="short", nodes=2))
    assert proc.returncode == 1
    (bad,) = of(report, "partition", "fail")
    assert "MaxNodes=1" in bad["message"] and bad["host"] == "slurm"
    assert bad["fix"].startswith("set [slurm] nodes = 1 or fewer")
    assert report["hosts"] == ["slurm"]  # no allocation was asked for
    assert {f["status"] for f in of(report, "alloc")} == {"skip"}


def test_a_partition_that_does_not_exist_lists_the_partitions(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    proc, report = doctor(slurm_cluster, doctor_job(tmp_path, partition="gpu-large"))
    assert proc.returncode == 1
    (bad,) = of(report, "partition", "fail")
    assert bad["message"] == "partition gpu-large does not exist"
    assert bad["evidence"] == "partitions: debug, short"


def test_a_blocked_rendezvous_port_range_is_a_firewall_error_naming_the_port(slurm_cluster: SlurmCluster,
                                                                             tmp_path: Path) -> None:
    c = slurm_cluster
    rule = ["INPUT", "-p", "tcp", "--dport", "29500:30700", "-j", "REJECT"]
    for ns in c.nodes:  # nsenter, not `ip netns exec`: nothing remounted
        subprocess.run(["nsenter", f"--net=/run/netns/{ns}", "iptables", "-I", *rule], check=True, timeout=30)
    try:
        proc, report = doctor(c, doctor_job(tmp_path))
    finally:
        for ns in c.nodes:
            subprocess.run(["nsenter", f"--net=/run/netns/{ns}", "iptables", "-D", *rule], check=True, timeout=30)
    assert proc.returncode == 1
    (bad,) = of(report, "firewall", "fail")
    assert bad["host"] == c.nodes[0] and "TCP on the master port" in bad["message"]
    assert f"{c.nodes[1]} -> {c.nodes[0]}" in bad["evidence"] and "refused" in bad["evidence"]
    assert of(report, "python", "fail") == []  # the facts still came


def test_through_the_login_node_over_ssh_without_slurm_config_here(slurm_cluster: SlurmCluster,
                                                                    tmp_path: Path) -> None:
    c = slurm_cluster
    proc, report = doctor(c, doctor_job(tmp_path, login=c.login_alias), "--ssh-config", str(c.ssh_config),
                          login=True)
    assert proc.returncode == 0, json.dumps(report["findings"], indent=1)[-4000:]
    assert report["hosts"] == [c.login_alias, *c.nodes]
    assert f"on login node {c.login_alias}" in of(report, "slurm", "ok")[0]["message"]


def test_a_job_still_queued_at_the_timeout_is_cancelled_and_named(slurm_cluster: SlurmCluster,
                                                                   tmp_path: Path) -> None:
    c = slurm_cluster
    blocker = c.slurm("sbatch", "--parsable", "-N", "2", "--exclusive", "-o", "/dev/null", "--wrap", "sleep 300",
                      check=True).stdout.strip()
    try:
        wait_for(lambda: c.slurm("squeue", "-h", "-j", blocker, "-o", "%T").stdout.strip() == "RUNNING", 30,
                 "the blocking job to run")
        proc, report = doctor(c, doctor_job(tmp_path), "--timeout", "2")
    finally:
        c.slurm("scancel", blocker)
    assert proc.returncode == 1
    (bad,) = of(report, "alloc", "fail")
    assert "still queued after 2s" in bad["message"] and "cancelled it" in bad["message"]
    assert no_doctor_job_left(c)
    c.wait_idle(30)
