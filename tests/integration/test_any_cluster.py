"""Any cluster shape, nothing extra to type: hosts known only by ssh_config aliases (HostName,
ProxyJump) that cannot resolve each other's names, and this machine plus namespace hosts (its
hostname maps to 127.0.0.1, as this machine's does). The jobs name no master_addr and no
*_SOCKET_IFNAME: ddpctl settles them from each host's own addresses and routes, doctor finds
nothing wrong, and the job trains."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.cluster import Cluster
from tests.ddpctl_run import TOY, run_ddpctl

pytestmark = pytest.mark.cluster

IDENTITY = re.compile(r"rank=(\d) local_rank=0 world_size=(\d) node_rank=(\d) params_identical=True")


def bare_job(directory: Path, inventory: Path, name: str) -> Path:
    """A job that names no address and no interface: the new user's first job file."""
    path = directory / f"{name}.toml"
    path.write_text("\n".join([
        f"inventory = {json.dumps(str(inventory))}", "[job]", f"name = {json.dumps(name)}",
        f"script = {json.dumps(str(TOY))}", 'args = ["--epochs", "1"]', "nproc_per_node = 1",
        "[rendezvous]", 'master_port = "auto"']) + "\n")
    return path


def options(ssh_config: str, host: str) -> str:
    """The option lines of `Host host` in the cluster's ssh_config (HostName, key, known_hosts)."""
    block = ssh_config.split(f"Host {host}\n", 1)[1].split("\nHost ", 1)[0]
    return "".join(f"{line}\n" for line in block.splitlines() if line.strip())


def doctor_errors(job: Path, *ssh: str) -> tuple[int, list[dict[str, str]], str]:
    out = run_ddpctl("doctor", str(job), "--json", *ssh, timeout=180)
    report = json.loads(out.stdout)
    return out.returncode, [f for f in report["findings"] if f["status"] == "fail"], out.stderr


def test_hosts_known_only_by_alias_behind_a_jump_host_pass_doctor_and_train(
        make_cluster: type, tmp_path: Path) -> None:
    cluster: Cluster = make_cluster(3)  # type: ignore[operator]
    for i in range(3):  # no host resolves any hostname, its own included
        cluster.unlist_hostname(i, f"{cluster.prefix}-h{i}")
    base = cluster.ssh_config.read_text()
    aliases = tmp_path / "ssh_config"  # box1 and box2 are reached through box0, known as `gate` too
    aliases.write_text("".join(
        f"Host {alias}\n{options(base, cluster.hosts[i].name)}" + ("    ProxyJump gate\n" if i else "")
        for alias, i in (("box0", 0), ("box1", 1), ("box2", 2), ("gate", 0))))
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(f"[defaults]\npython = {json.dumps(sys.executable)}\n"
                         + "".join(f'\n[[hosts]]\nname = "box{i}"\n' for i in range(3)))
    job = bare_job(tmp_path, inventory, "aliases")
    ssh = ("--ssh-config", str(aliases))
    code, errors, stderr = doctor_errors(job, *ssh)
    assert code == 0 and errors == [], (errors, stderr[-2000:])
    out = run_ddpctl("up", str(job), "--runs-dir", str(tmp_path / "runs"), *ssh, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    master = cluster.hosts[0].address
    assert f"master_addr {master}: box0's address on its route to the other hosts" in out.stderr
    assert "GLOO_SOCKET_IFNAME=eth0" in out.stderr and "does not resolve" in out.stderr
    assert sorted(m.group(1) for m in IDENTITY.finditer(out.stdout)) == ["0", "1", "2"]


def test_this_machine_plus_a_server_passes_doctor_and_trains(make_cluster: type, tmp_path: Path) -> None:
    """Gloo is pinned to the bridge here whatever this machine's hostname maps to: 127.0.0.1 (as
    on this project's machine), nothing, or an address on another interface (not the bridge, which
    the test makes)."""
    cluster: Cluster = make_cluster(1)  # type: ignore[operator]
    inventory = tmp_path / "hosts.toml"
    server = cluster.hosts[0]
    inventory.write_text(f"[defaults]\nuser = \"root\"\npython = {json.dumps(sys.executable)}\n"
                         '\n[[hosts]]\nname = "localhost"\naddress = "localhost"\n'
                         f'\n[[hosts]]\nname = "{server.name}"\naddress = "{server.address}"\n')
    job = bare_job(tmp_path, inventory, "here-and-there")
    ssh = ("--ssh-config", str(cluster.ssh_config))
    code, errors, stderr = doctor_errors(job, *ssh)
    assert code == 0 and errors == [], (errors, stderr[-2000:])
    out = run_ddpctl("up", str(job), "--runs-dir", str(tmp_path / "runs"), *ssh, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"master_addr {cluster.bridge_address}: localhost's address on its route" in out.stderr
    assert f"localhost: GLOO_SOCKET_IFNAME={cluster.bridge}" in out.stderr
    assert sorted(m.group(1) for m in IDENTITY.finditer(out.stdout)) == ["0", "1"]
    assert "/etc/hosts" not in out.stderr
