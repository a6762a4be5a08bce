"""`ddpctl doctor` on the real namespace cluster: each injected fault gives its finding and exit code."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from tests.cluster import Cluster, require_cluster, start_cluster

pytestmark = pytest.mark.cluster
runner = CliRunner()
CLEAN_ENV = {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1"}
MASTER_PORT = 29500


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two hosts for this module; every test undoes its fault in a finally."""
    require_cluster()
    with start_cluster(2, tmp_path_factory.mktemp("doctor")) as c:
        yield c


def write_job(cluster: Cluster, env: dict[str, str], python: str | None = None, pick: bool = True) -> Path:
    jobdir = cluster.workdir / "job"
    jobdir.mkdir(exist_ok=True)
    (jobdir / "train.py").write_text("print('train')\n")
    inventory = cluster.hosts_toml
    if python is not None:
        inventory = jobdir / "hosts.toml"
        text = cluster.hosts_toml.read_text().splitlines()
        inventory.write_text("\n".join(f"python = {json.dumps(python)}"
                                       if line.startswith("python =") else line for line in text))
    env_lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in env.items())
    job = jobdir / "job.toml"
    job.write_text(f'inventory = {json.dumps(str(inventory))}\n[job]\nname = "doc"\n'
                   f'script = "train.py"\n[rendezvous]\nmaster_port = {MASTER_PORT}\n'
                   + ("" if pick else "pick_interfaces = false\n") + f"[env]\n{env_lines}\n")
    return job


def doctor(cluster: Cluster, env: dict[str, str] | None = None, python: str | None = None,
           *extra: str, pick: bool = True) -> tuple[int, dict[str, Any]]:
    job = write_job(cluster, CLEAN_ENV if env is None else env, python, pick)
    result = runner.invoke(app, ["doctor", str(job), "--json", "--ssh-config",
                                 str(cluster.ssh_config), "--connect-timeout", "5", *extra])
    try:
        data = json.loads(result.stdout)
    except ValueError:
        pytest.fail(f"doctor printed no JSON (exit {result.exit_code}): {result.output}")
    assert data["exit_code"] == result.exit_code
    return result.exit_code, data


def findings(data: dict[str, Any], check: str, status: str) -> list[dict[str, Any]]:
    return [f for f in data["findings"] if f["check"] == check and f["status"] == status]


def errors(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in data["findings"] if f["status"] == "fail"]


def test_a_clean_cluster_exits_0_with_no_error(cluster: Cluster) -> None:
    code, data = doctor(cluster)
    assert (code, errors(data)) == (0, [])
    assert data["table"]["node0"]["firewall"] == "ok" and data["table"]["node1"]["python"] == "ok"


def test_drop_on_the_master_port_is_an_error_naming_master_and_port(cluster: Cluster) -> None:
    rule = ["INPUT", "-p", "tcp", "--dport", str(MASTER_PORT), "-j", "DROP"]
    cluster.iptables(0, "-I", *rule)
    try:
        code, data = doctor(cluster)
    finally:
        cluster.iptables(0, "-D", *rule)
    bad = findings(data, "firewall", "fail")
    assert code == 1
    assert [f["host"] for f in bad] == ["node0"]
    assert "master port 29500" in bad[0]["message"] and "node1" in bad[0]["message"]
    assert "ufw allow from" in bad[0]["fix"]


def test_a_worker_dropping_all_but_ssh_fails_the_ephemeral_probe(cluster: Cluster) -> None:
    cluster.iptables(1, "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT")
    cluster.iptables(1, "-A", "INPUT", "-j", "DROP")
    try:
        code, data = doctor(cluster)
    finally:
        cluster.iptables(1, "-F", "INPUT")
    bad = findings(data, "firewall", "fail")
    assert code == 1
    assert {f["host"] for f in bad} == {"node1"}
    assert any("ephemeral" in f["message"] and "node0" in f["message"] for f in bad)
    assert any("timeout" in f["evidence"] for f in bad)


def test_nccl_socket_ifname_naming_a_missing_interface(cluster: Cluster) -> None:
    code, data = doctor(cluster, {**CLEAN_ENV, "NCCL_SOCKET_IFNAME": "=ens9"})
    bad = findings(data, "ifname", "fail")
    assert code == 1
    assert sorted(f["host"] for f in bad) == ["node0", "node1"]
    assert "matches no interface" in bad[0]["message"]
    assert "NCCL_SOCKET_IFNAME=eth0" in bad[0]["fix"]


def test_a_docker_like_interface_with_ifname_unset_is_pinned_away_or_else_a_warning(cluster: Cluster) -> None:
    cluster.add_dummy_interface(1, "virbr0", "192.168.122.1/24")
    env = {k: v for k, v in CLEAN_ENV.items() if k != "NCCL_SOCKET_IFNAME"}
    try:
        code, data = doctor(cluster, env, None, "--strict")
        off, off_data = doctor(cluster, env, pick=False)
        off_strict, _ = doctor(cluster, env, None, "--strict", pick=False)
    finally:
        cluster.run_in(1, ["ip", "link", "del", "virbr0"])
    pinned = [f for f in findings(data, "ifname", "info") if "virbr0" in f["message"]]
    assert [f["host"] for f in pinned] == ["node1"] and code == 0
    assert "ddpctl sets NCCL_SOCKET_IFNAME==eth0 on node1" in pinned[0]["message"]
    warned = [f for f in findings(off_data, "ifname", "warn") if "virbr0" in f["message"]]
    assert [f["host"] for f in warned] == ["node1"]
    assert (off, off_strict) == (0, 1)


def test_a_listener_squatting_on_the_master_port(cluster: Cluster) -> None:
    squatter = cluster.exec_in(0, ["python3", "-c", "import socket, sys, time\n"
                                   "s = socket.create_server(('0.0.0.0', int(sys.argv[1])))\n"
                                   "print('up', flush=True)\ntime.sleep(600)", str(MASTER_PORT)],
                               stdout=subprocess.PIPE)
    try:
        assert squatter.stdout is not None and squatter.stdout.readline() == b"up\n"
        code, data = doctor(cluster)
    finally:
        squatter.send_signal(signal.SIGKILL)
        squatter.wait(10)
    bad = findings(data, "port", "fail")
    assert code == 1
    assert [f["host"] for f in bad] == ["node0"]
    assert "29500" in bad[0]["message"] and "kill-port 29500 --host node0" in bad[0]["fix"]
    if "cannot list port owners" not in bad[0]["message"]:  # node_agent/ops/ports.py present
        assert "python3" in bad[0]["evidence"]


def test_sshd_down_and_unauthorized_key_are_distinct_findings(cluster: Cluster) -> None:
    cluster.unauthorize_key(0)
    cluster.stop_sshd(1)
    try:
        code, data = doctor(cluster)
    finally:
        cluster.authorize_key(0)
        cluster.start_sshd(1)
    bad = {f["host"]: f for f in findings(data, "ssh", "fail")}
    assert code == 1
    assert "key not authorized" in bad["node0"]["message"] and "ssh-copy-id" in bad["node0"]["fix"]
    assert "sshd is not running" in bad["node1"]["message"]
    assert data["table"]["node1"]["python"] == "skip"


def test_an_interpreter_without_torch(cluster: Cluster) -> None:
    if subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True,
                      check=False).returncode == 0:
        pytest.skip("/usr/bin/python3 has torch here")
    code, data = doctor(cluster, None, "/usr/bin/python3")
    bad = findings(data, "python", "fail")
    assert code == 1
    assert sorted(f["host"] for f in bad) == ["node0", "node1"]
    assert "torch is not importable by /usr/bin/python3" in bad[0]["message"]


def test_the_cluster_is_clean_again_after_every_fault(cluster: Cluster) -> None:
    code, data = doctor(cluster)
    assert (code, errors(data)) == (0, [])
