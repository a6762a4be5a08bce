"""`ddpctl up` never hangs silently, on the real cluster: each fault doctor can see stops the launch
before any rank starts, with doctor's finding; with --no-checks the rendezvous watchdog names it;
the failure summary shows the first failing rank's own exception."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cluster import Cluster
from tests.ddpctl_run import no_job_processes, only_summary, run_ddpctl, ssh_args, wait_for, write_job

pytestmark = pytest.mark.cluster

BLOCKED = "the pre-launch checks found errors; no rank was started"
# A DDP script without torchelastic's @record: rank 3 (node1) raises; the others then fail in the
# collective because their peer died.
CRASH_WITHOUT_RECORD = textwrap.dedent("""\
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 3:
        raise ValueError("rank three broke: " + os.environ["DDPCTL_TEST_WORD"])
    dist.all_reduce(torch.ones(1))  # the others wait here for rank 3 until its death reaches them
    """)


def up(cluster: Cluster, job: Path, runs: Path, *extra: str, timeout: float = 180):
    return run_ddpctl("up", str(job), "--runs-dir", str(runs), "--grace", "3", *extra, *ssh_args(cluster),
                      timeout=timeout)


def assert_nothing_started(out, runs: Path) -> None:  # type: ignore[no-untyped-def]
    assert out.returncode == 1, out.stderr
    assert BLOCKED in out.stderr
    assert not list(runs.glob("*/summary.json")), "a blocked launch starts no job"
    assert "<" not in "\n".join(line for line in out.stderr.splitlines() if "fix:" in line)


def test_master_port_dropped_by_a_firewall(make_cluster: Callable[[int], Cluster], tmp_path: Path) -> None:
    cluster = make_cluster(2)
    port = 29611
    cluster.iptables(0, "-I", "INPUT", "-p", "tcp", "--dport", str(port), "-j", "DROP")
    job = write_job(tmp_path, cluster, "fw", ["--epochs", "1"], port=port)
    runs = tmp_path / "runs"

    out = up(cluster, job, runs)
    assert_nothing_started(out, runs)
    assert f"[firewall] node0: TCP on the master port {port} is blocked between node0 and node1" in out.stderr
    assert "fix: on node0: sudo ufw allow from" in out.stderr

    # Without the checks, the watchdog finds the same cause within its bound and stops the job.
    out = up(cluster, job, runs, "--no-checks", "--join-timeout", "8")
    assert out.returncode == 1, out.stderr
    assert "the ranks did not all join within 8s: torchrun's rendezvous at" in out.stderr
    assert "node1: 0 of 2 rank(s) started" in out.stderr
    assert f"TCP on the master port {port} is blocked between node0 and node1" in out.stderr
    summary = only_summary(runs)
    assert summary["cause"] and "never completed" in summary["cause"]
    wait_for(lambda: no_job_processes(cluster, summary["job_id"]), 30, "no process of the job left")


def test_c10d_where_no_hostname_resolves_trains(make_cluster: Callable[[int], Cluster], tmp_path: Path) -> None:
    """c10d looks each host's own name up unless torchrun is given its address: `up` gives each
    host the address it reported (--local-addr), so names that resolve nowhere (the cluster's
    default: `nowhere-node` too) neither block nor hang the launch (issue 54)."""
    cluster = make_cluster(2)
    cluster.unlist_hostname(1, "nowhere-node")
    job = write_job(tmp_path, cluster, "c10d-names", ["--epochs", "1"], backend="c10d", env={})
    runs = tmp_path / "runs"
    out = up(cluster, job, runs)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[dns]" not in out.stderr and "does not resolve on" not in out.stderr
    summary = only_summary(runs)
    commands = [host["command"] for host in summary["hosts"]]
    assert [f"--local-addr {h.address}" in c for h, c in zip(cluster.hosts, commands, strict=True)] == [True, True]


@pytest.mark.parametrize(("env", "finding"), [
    ({"GLOO_SOCKET_IFNAME": "docker0"},
     "GLOO_SOCKET_IFNAME=docker0: docker0 (172.17.0.1/16) does not route to the master"),
    ({"NCCL_SOCKET_IFNAME": "^lo"}, "an exclusion list replaces NCCL's default skipping of docker"),
])
def test_a_decoy_interface_named_or_let_in(make_cluster: Callable[[int], Cluster], tmp_path: Path,
                                           env: dict[str, str], finding: str) -> None:
    cluster = make_cluster(2)
    cluster.add_dummy_interface(1, "docker0", "172.17.0.1/16")
    job = write_job(tmp_path, cluster, "decoy", ["--epochs", "1"], env=env)
    runs = tmp_path / "runs"
    out = up(cluster, job, runs)
    assert_nothing_started(out, runs)
    assert re.search(r"\[ifname\] node1: .*" + re.escape(finding), out.stderr), out.stderr


def test_a_script_missing_from_the_hosts_workdir(cluster2: Cluster, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('here, but not on the hosts')\n")
    remote = tmp_path / "remote"  # the hosts' workdir: it exists, the script is not in it
    remote.mkdir()
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(cluster2.hosts_toml.read_text().replace("[defaults]", f'[defaults]\nworkdir = "{remote}"'))
    job = write_job(tmp_path, cluster2, "noscript", script=Path("train.py"))
    job.write_text(job.read_text().replace(str(cluster2.hosts_toml), str(inventory)))
    runs = tmp_path / "runs"
    out = up(cluster2, job, runs)
    assert_nothing_started(out, runs)
    assert f"[workdir] node0, node1: script {remote / 'train.py'} is missing on node0" in out.stderr

    out = up(cluster2, job, runs, "--no-checks")  # the rank wrapper reports it as Python does
    assert out.returncode == 1
    assert f"can't open file '{remote / 'train.py'}'" in out.stderr
    assert re.search(r"first failure: rank \d on node\d", out.stderr), out.stderr


def test_an_address_with_nothing_behind_it(cluster2: Cluster, tmp_path: Path) -> None:
    nobody = str(cluster2.network.network_address + 250)
    job = write_job(tmp_path, cluster2, "nobody", ["--epochs", "1"], port=29612)
    job.write_text(job.read_text().replace("[rendezvous]", f'[rendezvous]\nmaster_addr = "{nobody}"'))
    runs = tmp_path / "runs"
    out = up(cluster2, job, runs)
    assert_nothing_started(out, runs)
    assert f"node1 -> node0 {nobody}:29612" in out.stderr
    assert f"master_addr {nobody} is not an address of node0" in out.stderr


def test_a_rank_crashing_on_node1_is_the_root_cause_without_record(cluster2: Cluster, tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(CRASH_WITHOUT_RECORD)
    job = write_job(tmp_path, cluster2, "crash-plain", script=script, env={"DDPCTL_TEST_WORD": "$(id); 'x'"})
    runs = tmp_path / "runs"
    out = up(cluster2, job, runs)
    assert out.returncode == 1
    assert "first failure: rank 3 on node1 (node_rank 1, local rank 1): ValueError: rank three broke: " \
           "$(id); 'x'" in out.stderr
    assert f'File "{script}", line 8, in <module>' in out.stderr
    assert "ChildFailedError" not in out.stderr.split("first failure:")[1]
    summary = only_summary(runs)
    assert summary["root_cause"]["host"] == "node1" and summary["root_cause"]["error"]["rank"] == 3
    assert summary["first_failure"] == "node1"
    wait_for(lambda: no_job_processes(cluster2, summary["job_id"]), 30, "no process of the job left")


def test_a_clean_launch_runs_the_checks_and_reports_nothing(cluster2: Cluster, tmp_path: Path) -> None:
    job = write_job(tmp_path, cluster2, "clean", ["--epochs", "1"])
    runs = tmp_path / "runs"
    out = up(cluster2, job, runs)
    assert out.returncode == 0, out.stderr
    assert "warning [" not in out.stderr and BLOCKED not in out.stderr
    summary = only_summary(runs)
    assert summary["root_cause"] is None and summary["cause"] is None
    assert json.loads((runs / summary["job_id"] / "summary.json").read_text())["exit_code"] == 0


def test_ports_between_the_ranks_dropped_but_the_master_port_open(make_cluster: Callable[[int], Cluster],
                                                                  tmp_path: Path) -> None:
    """A security group that lets only ssh and the master port in: torchrun's rendezvous completes,
    Gloo's connections between the ranks never do."""
    cluster = make_cluster(2)
    port = 29614
    for i in (0, 1):
        for rule in (["-i", "lo", "-j", "ACCEPT"],
                     ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
                     ["-p", "tcp", "--dport", "22", "-j", "ACCEPT"],
                     ["-p", "tcp", "--dport", str(port), "-j", "ACCEPT"],
                     ["-p", "tcp", "-j", "DROP"]):
            cluster.iptables(i, "-A", "INPUT", *rule)
    job = write_job(tmp_path, cluster, "mesh", ["--epochs", "1"], port=port)
    runs = tmp_path / "runs"

    out = up(cluster, job, runs)
    assert_nothing_started(out, runs)
    assert "TCP on ephemeral ports (NCCL/Gloo)" in out.stderr and "is blocked between" in out.stderr

    out = up(cluster, job, runs, "--no-checks", "--join-timeout", "8")
    assert out.returncode == 1, out.stderr
    assert "the ranks did not all join within 8s: init_process_group" in out.stderr
    assert "node0: 0 of 2 rank(s) returned from init_process_group" in out.stderr
    assert "re-probe of the master port and the ports between the hosts" in out.stderr
    assert re.search(r"TCP on ephemeral ports \(NCCL/Gloo\) \d+(, \d+)? is blocked between node\d and node\d",
                     out.stderr.split("rendezvous failed:")[1]), out.stderr
    assert "TCP on the master port" not in out.stderr
    summary = only_summary(runs)
    wait_for(lambda: no_job_processes(cluster, summary["job_id"]), 30, "no process of the job left")
