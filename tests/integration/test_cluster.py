"""The namespace cluster is real: own hostnames and sshd, TCP between hosts, faults, teardown."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import paramiko
import pytest

from tests.cluster import Cluster, leftovers, start_cluster
from tests.cluster_sys import (
    NETWORK,
    REGISTRY,
    cluster_records,
    neigh_limits,
    pid_alive,
    read_pid,
    reap_stale_clusters,
    registry_lock,
    wait_until,
)

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

pytestmark = pytest.mark.cluster

MakeCluster = Callable[[int], Cluster]

LISTENER = """
import socket, sys
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
conn, peer = srv.accept()
data = conn.recv(100).decode()
conn.sendall(f"{socket.gethostname()} got {data} from {peer[0]}".encode())
"""
CLIENT = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20) as s:
    s.sendall(b"ping")
    print(s.recv(200).decode())
"""
SQUATTER = """
import socket, time
s = socket.create_server(("0.0.0.0", 29500))
print("bound", flush=True)
time.sleep(600)
"""


def ssh(cluster: Cluster, i: int, *remote: str, options: tuple[str, ...] = (),
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = cluster.ssh_argv(i, *remote)
    argv[1:1] = list(options)
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env,
                          stdin=subprocess.DEVNULL)


def paramiko_client(cluster: Cluster, known_hosts: Path) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return client


def connect(client: paramiko.SSHClient, cluster: Cluster, i: int) -> None:
    client.connect(cluster.hosts[i].address, port=cluster.port, username="root",
                   key_filename=str(cluster.key), look_for_keys=False, allow_agent=False,
                   timeout=20)


def start_orphan(cluster: Cluster, i: int, job_id: str) -> int:
    """Start `sleep` over ssh tagged with job_id, kill the ssh client, return the sleep's pid."""
    client = subprocess.Popen(cluster.ssh_argv(i, f"DDPCTL_JOB_ID={job_id} exec sleep 600"),
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    wait_until(lambda: bool(cluster.job_pids(i, job_id)), 30, f"job {job_id} on host {i}")
    client.kill()
    client.wait(timeout=10)
    [pid] = cluster.job_pids(i, job_id)
    return pid


def test_hosts_toml_lists_every_host_with_a_test_range_address(cluster2: Cluster) -> None:
    data = tomllib.loads(cluster2.hosts_toml.read_text())
    assert data["defaults"] == {"user": "root", "python": sys.executable}
    listed = [(h["name"], h["address"]) for h in data["hosts"]]
    assert listed == [(h.name, h.address) for h in cluster2.hosts]
    addresses = {ipaddress.ip_address(a) for _, a in listed}
    assert len(addresses) == 2
    assert all(a in NETWORK for a in addresses)
    assert ipaddress.ip_address(cluster2.bridge_address) in cluster2.network


def test_each_host_answers_ssh_with_its_own_hostname_and_address(cluster2: Cluster) -> None:
    for i, host in enumerate(cluster2.hosts):
        result = ssh(cluster2, i, "hostname; ip -o -4 addr show dev eth0")
        assert result.returncode == 0, result.stderr
        hostname, eth0 = result.stdout.splitlines()
        assert hostname == host.name
        assert f" {host.address}/24 " in eth0


def test_client_environment_does_not_reach_the_hosts(cluster2: Cluster) -> None:
    env = {**os.environ, "DDPCTL_PROBE": "leaked"}
    result = ssh(cluster2, 0, "printenv DDPCTL_PROBE || echo unset",
                 options=("-o", "SendEnv=DDPCTL_PROBE"), env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "unset"


def test_hosts_reach_each_other_over_tcp(cluster2: Cluster) -> None:
    node0, node1 = cluster2.hosts
    listener = cluster2.exec_in(1, [sys.executable, "-c", LISTENER, node1.address, "29400"],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout is not None
        assert listener.stdout.readline().strip() == "listening"
        result = cluster2.run_in(0, [sys.executable, "-c", CLIENT, node1.address, "29400"])
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"node1 got ping from {node0.address}"
    finally:
        listener.kill()
        listener.wait(timeout=10)


def test_paramiko_checks_the_host_key_and_logs_in_with_the_cluster_key(cluster2: Cluster) -> None:
    client = paramiko_client(cluster2, cluster2.known_hosts)
    try:
        connect(client, cluster2, 1)
        _, stdout, _ = client.exec_command("hostname")
        assert stdout.read().decode().strip() == "node1"
    finally:
        client.close()


def test_paramiko_rejects_a_host_missing_from_known_hosts(cluster2: Cluster,
                                                          tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    client = paramiko_client(cluster2, empty)
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        connect(client, cluster2, 0)
    client.close()


def test_unauthorized_key_is_refused_until_authorized_again(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(1)
    cluster.unauthorize_key(0)
    refused = ssh(cluster, 0, "true")
    assert refused.returncode == 255
    assert "Permission denied" in refused.stderr
    client = paramiko_client(cluster, cluster.known_hosts)
    with pytest.raises(paramiko.AuthenticationException):
        connect(client, cluster, 0)
    client.close()
    cluster.authorize_key(0)
    assert ssh(cluster, 0, "true").returncode == 0


def test_stopped_sshd_refuses_connections_until_restarted(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(1)
    cluster.stop_sshd(0)
    refused = ssh(cluster, 0, "true")
    assert refused.returncode == 255
    assert "Connection refused" in refused.stderr
    cluster.start_sshd(0)
    assert ssh(cluster, 0, "hostname").stdout.strip() == "node0"


def test_set_hostname_changes_what_the_host_reports(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(1)
    cluster.set_hostname(0, "renamed-host")
    assert ssh(cluster, 0, "hostname").stdout.strip() == "renamed-host"
    assert cluster.run_in(0, ["hostname"]).stdout.strip() == "renamed-host"
    assert cluster.hostname(0) == "renamed-host"


def test_names_resolve_nowhere_unless_the_test_says_so(make_cluster: Callable[..., Cluster]) -> None:
    """The default cluster is the harder one: no host resolves any host's name, its own included
    (a cluster that made them resolve hid issue 54); `resolvable` lists the hosts whose do."""
    cluster = make_cluster(2, resolvable=[1])
    assert not cluster.resolves(0) and cluster.resolves(1)
    for i in range(2):
        assert cluster.run_in(i, ["getent", "hosts", "node0"]).returncode != 0
        assert cluster.run_in(i, ["getent", "hosts", "node1"]).stdout.split()[:1] == [cluster.hosts[1].address]
    own = cluster.run_in(0, ["python3", "-c", "import socket; socket.getaddrinfo(socket.gethostname(), None)"])
    assert own.returncode != 0 and "gaierror" in own.stderr, own.stderr


def test_link_down_makes_a_host_unreachable_until_link_up(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(1)
    cluster.link_down(0)
    down = ssh(cluster, 0, "true", options=("-o", "ConnectTimeout=1"))
    assert down.returncode == 255
    assert "timed out" in down.stderr or "No route to host" in down.stderr
    cluster.link_up(0)
    assert ssh(cluster, 0, "true").returncode == 0


def test_iptables_rule_applies_inside_one_host_only(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(2)
    cluster.iptables(0, "-I", "INPUT", "-p", "tcp", "--dport", "22", "-j", "REJECT",
                     "--reject-with", "tcp-reset")
    assert "--dport 22" in cluster.iptables(0, "-S", "INPUT").stdout
    refused = ssh(cluster, 0, "true")
    assert refused.returncode == 255
    assert "Connection refused" in refused.stderr
    assert ssh(cluster, 1, "true").returncode == 0


def test_dummy_interface_is_visible_only_inside_its_host(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(2)
    cluster.add_dummy_interface(0, "docker0", "172.17.0.1/16")
    inside = ssh(cluster, 0, "ip -o -4 addr show")
    assert "docker0" in inside.stdout
    assert "172.17.0.1/16" in inside.stdout
    assert "docker0" not in ssh(cluster, 1, "ip -o -4 addr show").stdout


def test_job_pids_find_what_a_killed_ssh_client_left_running(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(1)
    orphan = start_orphan(cluster, 0, "job-7")
    assert pid_alive(orphan)  # the trap: killing the local client leaves the remote command
    assert orphan in cluster.pids(0)
    assert cluster.job_pids(0, "job-8") == []


def test_teardown_leaves_no_namespace_link_or_process(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(2)
    squatter = cluster.exec_in(1, [sys.executable, "-c", SQUATTER], stdout=subprocess.PIPE,
                               text=True)
    assert squatter.stdout is not None
    assert squatter.stdout.readline().strip() == "bound"
    orphan = start_orphan(cluster, 0, "job-9")
    sshds = [read_pid(h.sshd_pid_file) for h in cluster.hosts]
    assert all(pid is not None and pid_alive(pid) for pid in sshds)
    cluster.teardown()
    assert squatter.poll() is not None
    assert not any(pid_alive(pid) for pid in [orphan, *sshds] if pid is not None)
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    addrs = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True)
    assert f"{cluster.prefix}-" not in netns.stdout
    assert f"{cluster.prefix}-" not in links.stdout
    assert f" {cluster.bridge_address}/" not in addrs.stdout
    assert not (REGISTRY / f"{cluster.prefix}.json").exists()


def test_context_manager_tears_down_when_the_body_fails(cluster_available: None,
                                                        tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"), start_cluster(1, tmp_path) as cluster:
        assert leftovers(cluster.prefix)
        raise RuntimeError("boom")
    assert leftovers(cluster.prefix) == []


def test_each_cluster_gets_its_own_names_and_subnet(make_cluster: MakeCluster) -> None:
    first, second = make_cluster(1), make_cluster(1)
    assert first.prefix != second.prefix
    assert not first.network.overlaps(second.network)
    assert all(len(h.veth) <= 15 for h in [*first.hosts, *second.hosts])
    assert ssh(second, 0, "hostname").stdout.strip() == "node0"


def test_atexit_tears_down_a_cluster_its_owner_forgot(cluster_available: None,
                                                      tmp_path: Path) -> None:
    owner = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
        "from tests.cluster import start_cluster;"
        "c = start_cluster(1, Path(sys.argv[2])); print(c.prefix, flush=True)"
    )
    root = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-c", owner, root, str(tmp_path)],
                          capture_output=True, text=True, timeout=60, check=True)
    assert leftovers(done.stdout.strip()) == []


def test_cluster_of_a_dead_owner_is_reaped(cluster_available: None, tmp_path: Path) -> None:
    owner = (
        "import os, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
        "from tests.cluster import start_cluster;"
        "c = start_cluster(1, Path(sys.argv[2])); print(c.prefix, flush=True); os._exit(0)"
    )
    root = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-c", owner, root, str(tmp_path)],
                          capture_output=True, text=True, timeout=60, check=True)
    prefix = done.stdout.strip()
    sshd = read_pid(tmp_path / "sshd.node0.pid")
    assert leftovers(prefix), "the owner died without teardown: its cluster should remain"
    reap_stale_clusters()
    assert leftovers(prefix) == []
    assert sshd is not None
    assert not pid_alive(sshd)


def test_a_large_cluster_raises_the_arp_table_limits_until_torn_down(cluster_available: None,
                                                                     tmp_path: Path) -> None:
    # Under the registry lock no other process's cluster comes or goes meanwhile (it is reentrant).
    with registry_lock():
        others_raised = any(record.get("neigh") for _, record in cluster_records())
        before = neigh_limits()
        with start_cluster(12, tmp_path):
            during = neigh_limits()
        after = neigh_limits()
    assert during["gc_thresh3"] >= max(4 * 13**2, before["gc_thresh3"])
    assert during["gc_thresh2"] >= max(2 * 13**2, before["gc_thresh2"])
    assert during["gc_thresh1"] >= max(13**2, before["gc_thresh1"])  # above the default 128
    assert after == (during if others_raised else before)  # the last large cluster restores them
