"""`ddpctl doctor` on the real namespace cluster: each SSH fault is its own finding, naming the
host, its address:port and a fix with real values, never a placeholder."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from tests.cluster import Cluster, require_cluster, start_cluster

pytestmark = pytest.mark.cluster
runner = CliRunner()
PLACEHOLDER = re.compile(r"<[A-Za-z][A-Za-z _-]*>")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two hosts for this module; every test undoes its fault in a finally."""
    require_cluster()
    with start_cluster(2, tmp_path_factory.mktemp("ssh-honest")) as c:
        yield c


@pytest.fixture(autouse=True)
def no_agent_and_empty_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No ssh-agent and no ~/.ssh keys or config: only what each test's ssh_config names."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv("HOME", str(home))
    return home


def doctor(inventory: Path, ssh_config: Path, timeout: int = 3, *extra: str) -> tuple[int, str]:
    result = runner.invoke(app, ["doctor", "-i", str(inventory), "--ssh-config", str(ssh_config),
                                 "--connect-timeout", str(timeout), *extra])
    return result.exit_code, result.stdout


def ssh_findings(inventory: Path, ssh_config: Path, timeout: int = 3) -> dict[str, dict[str, Any]]:
    """Host -> its ssh finding, after checking that no finding holds a placeholder."""
    code, out = doctor(inventory, ssh_config, timeout, "--json")
    data = json.loads(out)
    found = {f["host"]: f for f in data["findings"] if f["check"] == "ssh"}
    for f in found.values():
        for part in ("message", "evidence", "fix"):
            assert not PLACEHOLDER.search(f[part]), f"{f['host']} {part}: {f[part]}"
    if any(f["status"] == "fail" for f in found.values()):
        assert code == 1
    return found


def findings_during(cluster: Cluster, fault: Callable[[], None], undo: Callable[[], None]) -> dict[str, dict[str, Any]]:
    """The cluster's ssh findings while `fault` holds; `undo` runs whatever happens."""
    fault()
    try:
        return ssh_findings(cluster.hosts_toml, cluster.ssh_config)
    finally:
        undo()


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_stopped_sshd_is_a_refused_finding_naming_host_address_and_port(cluster: Cluster) -> None:
    addr = cluster.hosts[1].address
    cluster.stop_sshd(1)
    try:
        found = ssh_findings(cluster.hosts_toml, cluster.ssh_config)
        code, text = doctor(cluster.hosts_toml, cluster.ssh_config)
    finally:
        cluster.start_sshd(1)
    bad = found["node1"]
    assert (bad["status"], found["node0"]["status"]) == ("fail", "ok")
    assert bad["evidence"].startswith(f"sshd_down: {addr}:22 (node1) refused the connection")
    assert "on node1: sudo systemctl start ssh" in bad["fix"]
    ssh_lines = text[text.index("[ssh]"):]  # the rendered finding, as a person reads it
    assert code == 1 and "node1" in ssh_lines and not PLACEHOLDER.search(ssh_lines)


def test_a_downed_link_is_an_unreachable_finding_not_a_refused_one(cluster: Cluster) -> None:
    addr = cluster.hosts[1].address
    bad = findings_during(cluster, lambda: cluster.link_down(1), lambda: cluster.link_up(1))["node1"]
    assert bad["status"] == "fail" and bad["evidence"].startswith("unreachable: ")
    assert (f"connecting to {addr}:22 (node1) timed out after 3s" in bad["evidence"]
            or f"no route to host {addr}:22 (node1)" in bad["evidence"])
    assert f"ping {addr}" in bad["fix"] and "node1" in bad["fix"]


def test_an_address_nobody_holds_is_no_route_to_host(cluster: Cluster, tmp_path: Path) -> None:
    ghost = str(cluster.network[250])  # on the cluster's bridge, unused: neighbour discovery fails
    inventory = write_config(tmp_path / "hosts.toml", f'[defaults]\nuser = "root"\n[[hosts]]\n'
                             f'name = "ghost"\naddress = "{ghost}"\npython = {json.dumps(sys.executable)}\n')
    found = ssh_findings(inventory, cluster.ssh_config, timeout=10)  # ARP gives up after ~3 s
    bad = found["ghost"]
    assert bad["evidence"].startswith(f"unreachable: no route to host {ghost}:22 (ghost)")
    assert f"that {ghost} in the inventory is ghost's address" in bad["fix"]


def test_a_key_removed_from_authorized_keys_is_key_refused_naming_the_key(cluster: Cluster) -> None:
    addr = cluster.hosts[0].address
    found = findings_during(cluster, lambda: cluster.unauthorize_key(0), lambda: cluster.authorize_key(0))
    bad = found["node0"]
    assert bad["status"] == "fail" and found["node1"]["status"] == "ok"
    assert "key not authorized" in bad["message"]
    assert f"root@{addr}:22 (node0) refused every key offered: {cluster.key} (ED25519 SHA256:" in bad["evidence"]
    assert f"ssh-copy-id -i {cluster.key}.pub root@{addr}" in bad["fix"]


def test_an_identity_file_that_points_nowhere_is_no_key_offered_naming_the_files(
        cluster: Cluster, tmp_path: Path, no_agent_and_empty_home: Path) -> None:
    missing = tmp_path / "no_such_key"
    text = cluster.ssh_config.read_text().replace(str(cluster.key), str(missing))
    config = write_config(tmp_path / "ssh_config", text)
    found = ssh_findings(cluster.hosts_toml, config)
    for i, name in enumerate(("node0", "node1")):
        bad = found[name]
        assert bad["status"] == "fail" and bad["evidence"].startswith("no_key: ")
        assert f"root@{cluster.hosts[i].address}:22 ({name})" in bad["evidence"]
        assert f"{missing} (no such file)" in bad["evidence"]
        assert "ssh-agent (not running: SSH_AUTH_SOCK is not set)" in bad["evidence"]
        assert f"{no_agent_and_empty_home}/.ssh/id_ed25519 (not tried: IdentityFile is set)" in bad["evidence"]
        assert f"ssh-keygen -t ed25519 -f {missing}" in bad["fix"] and f"IdentityFile in {config}" in bad["fix"]


def test_no_identity_file_and_no_default_key_is_no_key_offered_naming_the_defaults(
        cluster: Cluster, tmp_path: Path, no_agent_and_empty_home: Path) -> None:
    text = "".join(line + "\n" for line in cluster.ssh_config.read_text().splitlines()
                   if "IdentityFile" not in line)
    found = ssh_findings(cluster.hosts_toml, write_config(tmp_path / "ssh_config", text))
    evidence = found["node1"]["evidence"]
    assert found["node1"]["status"] == "fail" and evidence.startswith("no_key: ")
    for key in ("id_rsa", "id_ecdsa", "id_ed25519"):
        assert f"{no_agent_and_empty_home / '.ssh' / key} (no such file)" in evidence


def test_a_host_block_for_the_address_applies_to_a_host_named_otherwise(cluster: Cluster, tmp_path: Path) -> None:
    """The inventory says gpu-a/gpu-b; only `Host <the cluster's /24>.*` knows the key, user and
    known_hosts, and a trailing `Host *` with another User does not shadow it."""
    pattern = ".".join(str(cluster.network.network_address).split(".")[:3]) + ".*"
    config = write_config(tmp_path / "ssh_config", "\n".join([
        f"Host {pattern}",
        "    User root",
        f'    IdentityFile "{cluster.key}"',
        f'    UserKnownHostsFile "{cluster.known_hosts}"',
        "    IdentitiesOnly yes",
        "Host *",
        "    User nobody",
        "    ConnectTimeout 10",
        "",
    ]))
    inventory = write_config(tmp_path / "hosts.toml", f"[defaults]\npython = {json.dumps(sys.executable)}\n" + "".join(
        f'[[hosts]]\nname = "gpu-{c}"\naddress = "{h.address}"\n' for c, h in zip("ab", cluster.hosts, strict=True)))
    found = ssh_findings(inventory, config)
    assert {name: f["status"] for name, f in found.items()} == {"gpu-a": "ok", "gpu-b": "ok"}, found
    unmatched = write_config(tmp_path / "other_config", config.read_text().replace(pattern, "10.255.255.*"))
    assert ssh_findings(inventory, unmatched)["gpu-a"]["status"] == "fail"  # the block is what made it work
