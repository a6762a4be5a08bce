"""The SSH transport against real sshd: OpenSSH host-key rules, ssh_config aliases, one connection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inventory import Host
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.remote.agent import call_agent
from orchestrator.remote.pool import HostPool
from orchestrator.remote.ssh_options import SshOptions
from tests.cluster import Cluster
from tests.ddpctl_run import run_ddpctl

pytestmark = pytest.mark.cluster


def config_with_known_hosts(cluster: Cluster, tmp_path: Path, known_hosts: Path) -> Path:
    text = cluster.ssh_config.read_text().replace(str(cluster.known_hosts), str(known_hosts))
    path = tmp_path / "ssh_config"
    path.write_text(text)
    return path


def ps(cluster: Cluster, config: Path, *extra: str) -> tuple[int, str]:
    out = run_ddpctl("ps", "-i", str(cluster.hosts_toml), "--ssh-config", str(config), *extra, timeout=60)
    return out.returncode, out.stdout + out.stderr


def test_unknown_host_key_is_refused_by_default(cluster2: Cluster, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    code, text = ps(cluster2, config_with_known_hosts(cluster2, tmp_path, empty))
    assert code == 1
    assert "node0" in text and "unknown host key" in text and "--accept-new-host-keys" in text
    assert empty.read_text() == ""


def test_accept_new_records_unknown_keys_then_connects(cluster2: Cluster, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    config = config_with_known_hosts(cluster2, tmp_path, known)
    code, text = ps(cluster2, config, "--accept-new-host-keys")
    assert code == 0, text
    recorded = known.read_text()
    assert all(h.address in recorded for h in cluster2.hosts)
    assert ps(cluster2, config)[0] == 0  # now known: the default (strict) mode connects


def test_changed_host_key_is_refused_even_with_accept_new(cluster2: Cluster, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    other = "AAAAC3NzaC1lZDI1NTE5AAAAIFfTq0XoP1oJ0mQ2v8m3p2m0b0Qm3dXh2bqJQn3nXz4e"
    known.write_text("".join(f"{h.address} ssh-ed25519 {other}\n" for h in cluster2.hosts))
    code, text = ps(cluster2, config_with_known_hosts(cluster2, tmp_path, known), "--accept-new-host-keys")
    assert code == 1
    assert "CHANGED" in text and "ssh-keygen -R" in text


def test_inventory_name_resolves_through_ssh_config_alias(cluster2: Cluster, tmp_path: Path) -> None:
    """A host given only by name is dialled through its ssh_config block (HostName, User, key)."""
    inventory = tmp_path / "hosts.toml"
    inventory.write_text('[[hosts]]\nname = "node1"\n')
    out = run_ddpctl("ps", "-i", str(inventory), "--ssh-config", str(cluster2.ssh_config), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["failed"] == {}


def test_one_connection_per_host_is_reused_for_every_command(cluster2: Cluster) -> None:
    host = Host(name="node0", address=cluster2.hosts[0].address)
    with HostPool(SshOptions(ssh_config=cluster2.ssh_config)) as pool:
        transport = pool.transport(host)
        first = call_agent(transport, "ping").result
        conn = transport.connection()  # type: ignore[attr-defined]
        second = call_agent(transport, "ping").result
        assert transport.connection() is conn  # type: ignore[attr-defined]
        assert pool.transport(host) is transport
    assert first["hostname"] == second["hostname"] == cluster2.hostname(0)


def test_unreachable_host_fails_within_the_connect_timeout(cluster2: Cluster) -> None:
    ghost = Host(name="ghost", address=str(cluster2.network[250]))  # on the cluster's bridge, unused
    with HostPool(SshOptions(connect_timeout=2)) as pool:
        fan = pool.map([ghost], lambda t: call_agent(t, "ping"))
    err = fan.failed["ghost"]
    assert isinstance(err, HostError) and err.host == "ghost"
    assert err.kind in (HostErrorKind.UNREACHABLE, HostErrorKind.SSHD_DOWN)
