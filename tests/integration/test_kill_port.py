"""`ddpctl kill-port` on the real namespace cluster: holders on inventory hosts found and killed over SSH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from node_agent.host.runstate import alive
from orchestrator.cli import app
from tests.cluster import Cluster
from tests.unit.ports_listeners import NOBODY, SYSTEM_PYTHON, fake_torchrun_argv, listener_argv, started

pytestmark = pytest.mark.cluster
runner = CliRunner()


def on_host(cluster: Cluster, i: int) -> Callable[..., subprocess.Popen[str]]:
    return lambda argv, **kw: cluster.exec_in(i, argv, **kw)


def kill_port(cluster: Cluster, port: int, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["kill-port", str(port), "-i", str(cluster.hosts_toml), "--ssh-config",
                                 str(cluster.ssh_config), "--connect-timeout", "10", *args])
    return result.exit_code, result.output


def argv_for(port: int = 0, children: int = 0) -> Sequence[str]:
    return listener_argv("v4", "tcp", port, children)


def test_listener_on_a_host_is_found_killed_and_the_port_freed(cluster2: Cluster) -> None:
    node1 = cluster2.hosts[1].name
    with started(argv_for(children=1), popen=on_host(cluster2, 1)) as ln:
        code, out = kill_port(cluster2, ln.port, "--host", node1, "--dry-run")
        assert code == 1 and str(ln.proc.pid) in out and all(alive(p) for p in ln.pids), out
        code, out = kill_port(cluster2, ln.port, "--host", node1, "--yes", "--grace", "3")
        assert code == 0, out
        assert ln.gone(), "the listener or its child survived"
        assert f"{node1}: port {ln.port} is now free" in out
        code, out = kill_port(cluster2, ln.port, "--host", node1, "--dry-run")
        assert code == 0 and f"{node1}: port {ln.port} is free" in out, out


def test_each_host_sees_only_its_own_namespace(cluster2: Cluster) -> None:
    """The same port held on both hosts: --host node1 leaves node0's holder; --all frees both."""
    node0, node1 = cluster2.hosts[0].name, cluster2.hosts[1].name
    with started(argv_for(), popen=on_host(cluster2, 1)) as ln1, \
            started(argv_for(ln1.port), popen=on_host(cluster2, 0)) as ln0:
        code, out = kill_port(cluster2, ln1.port, "--host", node1, "--yes", "--json")
        data: dict[str, Any] = json.loads(out)
        assert code == 0 and list(data["hosts"]) == [node1], out
        assert [o["pid"] for o in data["hosts"][node1]["owners"]] == [ln1.proc.pid]
        assert ln1.gone() and alive(ln0.proc.pid)
        code, out = kill_port(cluster2, ln1.port, "--all", "--yes", "--json")
        data = json.loads(out)
        assert code == 0 and sorted(data["hosts"]) == sorted([node0, node1]), out
        assert data["hosts"][node0]["killed"][0]["pid"] == ln0.proc.pid
        assert data["hosts"][node1]["owners"] == [] and ln0.gone()


def bindable(cluster: Cluster, i: int, port: int) -> bool:
    """A plain bind (no SO_REUSEADDR) of `port` inside host i's namespace succeeds."""
    code = "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); print('bound')"
    run = cluster.run_in(i, [sys.executable, "-c", code, str(port)])
    return run.returncode == 0 and "bound" in run.stdout


def test_after_the_kill_the_port_binds_inside_the_host(cluster2: Cluster) -> None:
    node1 = cluster2.hosts[1].name
    with started(argv_for(29601, children=2), popen=on_host(cluster2, 1)) as ln:
        assert not bindable(cluster2, 1, 29601)
        code, out = kill_port(cluster2, 29601, "--host", node1, "--yes", "--grace", "3")
        assert code == 0, out
        assert ln.gone(), "the listener or a child survived"
        for child in ln.children:
            assert f"killed pid {child} (SIGTERM) [tree]" in out, out
        assert bindable(cluster2, 1, 29601)


def test_a_torchrun_tree_with_its_job_id_on_a_host(cluster2: Cluster, tmp_path: Path) -> None:
    node1 = cluster2.hosts[1].name
    env = {**os.environ, "DDPCTL_JOB_ID": "kp-cluster-1"}
    with started(fake_torchrun_argv(tmp_path), popen=lambda argv, **kw: cluster2.exec_in(1, argv, env=env, **kw)) \
            as ln:
        worker, sibling = ln.children
        code, out = kill_port(cluster2, ln.port, "--host", node1, "--yes", "--json")
        assert code == 0, out
        host = json.loads(out)["hosts"][node1]
        assert [(o["pid"], o["ddpctl_job_id"]) for o in host["owners"]] == [(worker, "kp-cluster-1")]
        assert sorted(k["pid"] for k in host["killed"]) == sorted([ln.proc.pid, worker, sibling])
        assert ln.gone(), "the torchrun agent or a sibling worker survived"


def test_another_users_listener_on_a_host_is_refused_then_forced(cluster2: Cluster) -> None:
    if not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"{SYSTEM_PYTHON} missing")
    node1 = cluster2.hosts[1].name
    argv = listener_argv("v4", "tcp", 0, 0, python=SYSTEM_PYTHON, prefix=NOBODY)
    with started(argv, popen=on_host(cluster2, 1)) as ln:
        code, out = kill_port(cluster2, ln.port, "--host", node1, "--yes")
        assert code == 1 and alive(ln.proc.pid), out
        assert f"refusing pid {ln.proc.pid} (nobody)" in out and "--force" in out
        code, out = kill_port(cluster2, ln.port, "--host", node1, "--yes", "--force")
        assert code == 0 and ln.gone(), out


def test_the_hosts_sshd_is_never_killed_even_forced(make_cluster: Callable[[int], Cluster]) -> None:
    """Port 22 on a host: its sshd carries ddpctl's own session, so --force --yes still kills nothing."""
    cluster = make_cluster(1)
    node0 = cluster.hosts[0].name
    code, out = kill_port(cluster, 22, "--host", node0, "--yes", "--force", "--json")
    host = json.loads(out)["hosts"][node0]
    assert code == 1 and host.get("killed", []) == [], out
    assert {o["name"] for o in host["owners"]} == {"sshd"}
    assert all("ddpctl's own session" in (o["refusal"] or "") for o in host["owners"])
    code, out = kill_port(cluster, 22, "--host", node0, "--dry-run")
    assert code == 1 and "sshd" in out, out  # sshd still answers


def test_all_with_one_host_down_still_frees_the_others(make_cluster: Callable[[int], Cluster]) -> None:
    cluster = make_cluster(2)
    node0, node1 = cluster.hosts[0].name, cluster.hosts[1].name
    with started(argv_for(), popen=on_host(cluster, 1)) as ln:
        cluster.stop_sshd(0)
        code, out = kill_port(cluster, ln.port, "--all", "--yes", "--json")
        data = json.loads(out)
        assert code == 1, out
        assert list(data["failed"]) == [node0] and data["failed"][node0]["host"] == node0
        assert data["hosts"][node1]["free_after"] is True and ln.gone()
