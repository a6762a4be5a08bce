"""SSH failures say what happened, where and the fix; ssh_config blocks match the name or the address.

No host: each test builds the connection ddpctl would open and hands `translate` the exception
paramiko or the socket layer raises for that failure.
"""

from __future__ import annotations

import errno
import re
import socket
import subprocess
from pathlib import Path

import paramiko
import pytest
from doctor_fixtures import observe
from paramiko.ssh_exception import NoValidConnectionsError

from inventory import Host
from orchestrator.checks import firewall
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.remote.ssh import make_connection
from orchestrator.remote.ssh_config import HostSshConfig, merge_lookups
from orchestrator.remote.ssh_errors import translate
from orchestrator.remote.ssh_options import SshOptions

NODE1 = Host(name="node1", address="198.18.0.11", user="root")
PLACEHOLDER = re.compile(r"<[A-Za-z][A-Za-z _-]*>")


def config(text: str, host: Host = NODE1) -> HostSshConfig:
    parsed = HostSshConfig.from_text(text)
    parsed.host = host
    return parsed


def error_for(exc: BaseException, text: str = "", host: Host = NODE1, timeout: float = 3,
              ssh_config: Path | None = None) -> HostError:
    conn = make_connection(host, SshOptions(connect_timeout=timeout), config(text, host))
    err = translate(host, conn, exc, ssh_config)
    for part in (err.message, err.fix):
        assert not PLACEHOLDER.search(part), part
    return err


def make_key(path: Path, passphrase: str = "") -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", "test", "-f", str(path)],
                   check=True, capture_output=True)
    return path


@pytest.fixture(autouse=True)
def no_agent_and_empty_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No ssh-agent and a HOME without keys or config, whatever the machine running the tests has."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv("HOME", str(home))
    return home


# -- network: refused (host up, sshd not listening) vs unreachable (no route, no answer) ---------

def refused(address: str) -> NoValidConnectionsError:
    return NoValidConnectionsError({(address, 22): ConnectionRefusedError(errno.ECONNREFUSED, "refused")})


def no_route(address: str) -> NoValidConnectionsError:
    return NoValidConnectionsError({(address, 22): OSError(errno.EHOSTUNREACH, "No route to host")})


@pytest.mark.parametrize(("exc", "kind", "message", "fix"), [
    (refused("198.18.0.11"), HostErrorKind.SSHD_DOWN, "198.18.0.11:22 (node1) refused the connection",
     "on node1: sudo systemctl start ssh"),
    (no_route("198.18.0.11"), HostErrorKind.UNREACHABLE, "no route to host 198.18.0.11:22 (node1)",
     "ping 198.18.0.11"),
    (TimeoutError("timed out"), HostErrorKind.UNREACHABLE,
     "connecting to 198.18.0.11:22 (node1) timed out after 3s", "sudo ufw allow 22/tcp"),
    (OSError(errno.ENETUNREACH, "Network is unreachable"), HostErrorKind.UNREACHABLE,
     "no route to 198.18.0.11:22 (node1)", "ip route get 198.18.0.11"),
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), HostErrorKind.UNRESOLVED,
     "cannot resolve 198.18.0.11 (node1, from the inventory)", "add 198.18.0.11 to /etc/hosts"),
])
def test_network_failures_name_host_address_port_and_fix(exc: BaseException, kind: HostErrorKind,
                                                          message: str, fix: str) -> None:
    err = error_for(exc)
    assert (err.host, err.kind) == ("node1", kind)
    assert message in err.message and fix in err.fix


def test_refused_and_unreachable_are_different_kinds() -> None:
    assert error_for(refused("198.18.0.11")).kind != error_for(no_route("198.18.0.11")).kind


def test_the_port_from_ssh_config_is_the_one_named() -> None:
    err = error_for(refused("198.18.0.11"), "Host node1\n    Port 2222\n", Host("node1", "198.18.0.11"))
    assert "198.18.0.11:2222" in err.message and "if it is not 2222" in err.fix


def test_an_address_from_ssh_config_hostname_is_blamed_on_ssh_config() -> None:
    err = error_for(no_route("10.9.9.9"), "Host node1\n    HostName 10.9.9.9\n")
    assert "10.9.9.9:22" in err.message and "HostName in ssh_config" in err.fix


# -- keys: none to offer vs offered and refused ------------------------------------------------

def test_no_key_offered_names_the_missing_identity_file_the_agent_and_the_skipped_defaults(
        tmp_path: Path, no_agent_and_empty_home: Path) -> None:
    missing = tmp_path / "cluster_key"
    err = error_for(paramiko.SSHException("No authentication methods available"),
                    f"Host node1\n    IdentityFile {missing}\n", ssh_config=tmp_path / "ssh_config")
    assert err.kind == HostErrorKind.NO_KEY
    assert f"{missing} (no such file)" in err.message
    assert "SSH_AUTH_SOCK is not set" in err.message
    assert f"{no_agent_and_empty_home}/.ssh/id_ed25519" in err.message and "not tried" in err.message
    assert f"ssh-keygen -t ed25519 -f {missing}" in err.fix
    assert f"ssh-copy-id -i {missing}.pub root@198.18.0.11" in err.fix
    assert f"IdentityFile in {tmp_path / 'ssh_config'}" in err.fix


def test_no_key_offered_without_identity_file_names_the_default_keys_looked_for(
        no_agent_and_empty_home: Path) -> None:
    err = error_for(paramiko.SSHException("No authentication methods available"))
    ssh_dir = no_agent_and_empty_home / ".ssh"
    assert err.kind == HostErrorKind.NO_KEY
    for name in ("id_rsa", "id_ecdsa", "id_ed25519"):
        assert f"{ssh_dir / name} (no such file)" in err.message
    assert f"ssh-keygen -t ed25519 -f {ssh_dir / 'id_ed25519'}" in err.fix


def test_key_refused_names_the_offered_key_and_the_real_user_at_address(tmp_path: Path) -> None:
    key = make_key(tmp_path / "id_ed25519")
    fingerprint = paramiko.PKey.from_path(key).fingerprint
    err = error_for(paramiko.AuthenticationException("Authentication failed."),
                    f"Host node1\n    IdentityFile {key}\n")
    assert err.kind == HostErrorKind.AUTH
    assert f"root@198.18.0.11:22 (node1) refused every key offered: {key} (ED25519 {fingerprint})" in err.message
    assert f"ssh-copy-id -i {key}.pub root@198.18.0.11" in err.fix
    assert "set user for node1 in the inventory" in err.fix


def test_key_refused_on_another_port_copies_the_key_to_that_port(tmp_path: Path) -> None:
    key = make_key(tmp_path / "id_ed25519")
    err = error_for(paramiko.AuthenticationException("Authentication failed."),
                    f"Host 198.18.0.*\n    User work\n    Port 2222\n    IdentityFile {key}\n",
                    Host("node1", "198.18.0.11"))
    assert f"work@198.18.0.11:2222 (node1) refused every key offered: {key}" in err.message
    assert f"ssh-copy-id -i {key}.pub -p 2222 work@198.18.0.11" in err.fix


def test_a_passphrase_protected_key_alone_is_no_key_offered_and_the_fix_is_ssh_add(tmp_path: Path) -> None:
    key = make_key(tmp_path / "locked", passphrase="secret words")
    err = error_for(paramiko.PasswordRequiredException("private key file is encrypted"),
                    f"Host node1\n    IdentityFile {key}\n")
    assert err.kind == HostErrorKind.NO_KEY
    assert f"{key} (passphrase-protected" in err.message
    assert f"ssh-add {key}" in err.fix


def test_a_server_without_public_key_auth_says_so() -> None:
    err = error_for(paramiko.BadAuthenticationType("Bad authentication type", ["password"]))
    assert err.kind == HostErrorKind.AUTH
    assert "accepts no keys (it allows only password)" in err.message
    assert "PubkeyAuthentication yes" in err.fix


# -- the connection: missing identity files skipped, defaults only without IdentityFile -------

def test_missing_identity_files_are_skipped_and_defaults_only_tried_without_one(tmp_path: Path) -> None:
    key = make_key(tmp_path / "id_ed25519")
    text = f"Host node1\n    IdentityFile {tmp_path / 'gone'}\n    IdentityFile {key}\n"
    conn = make_connection(NODE1, SshOptions(), config(text))
    assert conn.connect_kwargs["key_filename"] == [str(key)]
    assert conn.connect_kwargs["look_for_keys"] is False
    bare = make_connection(NODE1, SshOptions(), config(""))
    assert "key_filename" not in bare.connect_kwargs and bare.connect_kwargs["look_for_keys"] is True


# -- ssh_config: Host patterns match the inventory name and its address --------------------------

def lookup_of(text: str, name: str = "node1", address: str = "10.0.0.5") -> paramiko.SSHConfigDict:
    return merge_lookups(paramiko.SSHConfig.from_text(text).lookup, name, address)


@pytest.mark.parametrize(("text", "key", "expected"), [
    # an address block applies to a host the inventory names otherwise
    ("Host 10.0.0.*\n    User work\n", "user", "work"),
    ("Host 10.0.0.5\n    Port 2200\n", "port", "2200"),
    # the name's block wins over the address's
    ("Host node1\n    User alice\nHost 10.0.0.*\n    User work\n", "user", "alice"),
    ("Host 10.0.0.*\n    User work\nHost node1\n    User alice\n", "user", "alice"),
    # a trailing catch-all does not shadow the address's block ...
    ("Host 10.0.0.*\n    User work\nHost *\n    User nobody\n", "user", "work"),
    # ... but a leading one wins, as it does for `ssh 10.0.0.5` (first value obtained)
    ("Host *\n    User first\nHost 10.0.0.*\n    User work\n", "user", "first"),
    # only a catch-all: its value
    ("Host *\n    User nobody\n", "user", "nobody"),
    # HostName: the name's, else the address's, else the address itself
    ("Host node1\n    HostName 10.9.9.9\nHost 10.0.0.*\n    HostName 10.8.8.8\n", "hostname", "10.9.9.9"),
    ("Host 10.0.0.*\n    HostName 10.8.8.8\n", "hostname", "10.8.8.8"),
    ("Host 10.0.0.*\n    User work\n", "hostname", "10.0.0.5"),
    ("Host other\n    User bob\n", "user", None),
])
def test_merge_lookups_precedence(text: str, key: str, expected: str | None) -> None:
    assert lookup_of(text).get(key) == expected


def test_identity_files_accumulate_name_first_then_address() -> None:
    text = "Host 10.0.0.*\n    IdentityFile /k/addr_key\nHost node1\n    IdentityFile /k/name_key\n"
    assert lookup_of(text)["identityfile"] == ["/k/name_key", "/k/addr_key"]


def test_each_hosts_view_of_one_parse_looks_up_as_its_own_parse_would() -> None:
    text = ("Host node1\n    User alice\nHost 10.0.0.*\n    User work\n    Port 2200\n"
            "Host *\n    User nobody\n    ConnectTimeout 7\n")
    shared = HostSshConfig.from_text(text)
    hosts = [Host(name="node1", address="10.0.0.5"), Host(name="node2", address="10.0.0.6"),
             Host(name="node3", address="192.0.2.9")]
    views = [shared.for_host(h) for h in hosts]
    for host, view in zip(hosts, views, strict=True):
        alone = HostSshConfig.from_text(text)
        alone.host = host
        assert view.lookup(host.name) == alone.lookup(host.name)
    assert [v.lookup(h.name)["user"] for h, v in zip(hosts, views, strict=True)] == ["alice", "work", "nobody"]
    assert shared.host is None and shared.catch_all()["connecttimeout"] == "7"  # one, shared by the views
    assert all(v.catch_all() is shared.catch_all() for v in views)


def test_a_name_that_is_its_address_is_one_plain_lookup() -> None:
    text = "Host 10.0.0.*\n    User work\n"
    assert lookup_of(text, "10.0.0.5", "10.0.0.5") == paramiko.SSHConfig.from_text(text).lookup("10.0.0.5")


def test_the_connection_uses_the_address_block_and_a_proxyjump_hop_only_its_own(tmp_path: Path) -> None:
    key = make_key(tmp_path / "id_ed25519")
    text = (f"Host 10.0.0.*\n    User work\n    Port 2200\n    IdentityFile {key}\n    ProxyJump bastion\n"
            "Host bastion\n    HostName 192.0.2.1\n    User jump\n")
    host = Host("node1", "10.0.0.5")
    conn = make_connection(host, SshOptions(), config(text, host))
    assert (conn.host, conn.user, conn.port) == ("10.0.0.5", "work", 2200)
    assert conn.connect_kwargs["key_filename"] == [str(key)]
    assert (conn.gateway.host, conn.gateway.user, conn.gateway.port) == ("192.0.2.1", "jump", 22)


def test_a_failing_proxyjump_hop_is_named_instead_of_the_target() -> None:
    text = "Host node1\n    ProxyJump bastion\nHost bastion\n    HostName 192.0.2.1\n"
    err = error_for(refused("192.0.2.1"), text)
    assert err.host == "node1" and err.kind == HostErrorKind.SSHD_DOWN
    assert err.message.startswith("via ProxyJump host bastion: 192.0.2.1:22 (bastion) refused")
    assert err.fix.startswith("on bastion:")


# -- firewall: the fix names the peers' networks, not a placeholder ---------------------------------

def test_the_unprobed_firewall_warning_names_the_peer_subnet() -> None:
    ufw = {"firewall": {"ufw": {"active": True, "default_incoming": "deny", "rules": []}}}
    (warned,) = [f for f in firewall.check(observe({1: ufw})) if f.host == "node1" and f.fix]
    assert "sudo ufw allow from 198.18.0.0/24" in warned.fix
    assert not PLACEHOLDER.search(warned.fix)
