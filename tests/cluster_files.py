"""Key pairs and the files a namespace cluster writes: sshd configs, ssh_config, hosts.toml."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path


def _quoted(path: Path) -> str:
    """A path as one token of an OpenSSH config file (both sshd and ssh accept "...")."""
    text = str(path)
    if '"' in text or "\n" in text or "%" in text:
        raise ValueError(f"{text!r}: OpenSSH config paths cannot hold quotes, newlines or %")
    return f'"{text}"'


def make_keys(client_key: Path, host_key: Path) -> None:
    """Generate the test client key pair and the shared host key (ed25519, no passphrase)."""
    for key, comment in ((client_key, "ddpctl-test-client"), (host_key, "ddpctl-test-host")):
        for path in (key, key.with_suffix(".pub")):
            path.unlink(missing_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)],
            check=True, capture_output=True, text=True,
        )


def write_sshd_config(path: Path, address: str, port: int, host_key: Path, pid_file: Path,
                      authorized_keys: Path) -> None:
    """One host's sshd_config. No AcceptEnv: the client's environment never crosses over."""
    path.write_text(
        "\n".join([
            f"ListenAddress {address}",
            f"Port {port}",
            f"HostKey {_quoted(host_key)}",
            f"PidFile {_quoted(pid_file)}",
            f"AuthorizedKeysFile {_quoted(authorized_keys)}",
            "StrictModes no",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            "UseDNS no",
            "MaxStartups 200",
            "MaxSessions 100",
            "PrintMotd no",
            "X11Forwarding no",
            "Subsystem sftp internal-sftp",
            "",
        ])
    )


def write_known_hosts(path: Path, addresses: Sequence[str], port: int,
                      host_pub: Sequence[str]) -> None:
    """known_hosts lines for every address (`[addr]:port` when the port is not 22)."""
    key_type, key_b64 = host_pub[0], host_pub[1]
    names = [a if port == 22 else f"[{a}]:{port}" for a in addresses]
    path.write_text("".join(f"{name} {key_type} {key_b64}\n" for name in names))


def write_ssh_config(path: Path, hosts: Sequence[tuple[str, str]], port: int, key: Path,
                     known_hosts: Path) -> None:
    """An ssh_config naming every host, pinned to the cluster's key and known_hosts."""
    blocks = []
    for name, address in hosts:
        blocks.append("\n".join([
            f"Host {name}",
            f"    HostName {address}",
            f"    Port {port}",
            "    User root",
            f"    IdentityFile {_quoted(key)}",
            f"    UserKnownHostsFile {_quoted(known_hosts)}",
            "    StrictHostKeyChecking yes",
            "    IdentitiesOnly yes",
            "    BatchMode yes",
            "    ConnectTimeout 10",
            "",
        ]))
    path.write_text("\n".join(blocks))


def write_hosts_toml(path: Path, hosts: Sequence[tuple[str, str]], python: str) -> None:
    """The inventory: root on every host, this machine's interpreter (shared filesystem)."""
    lines = [
        "# Written by tests/cluster.py: a namespace cluster on this machine.",
        "[defaults]",
        'user = "root"',
        f"python = {json.dumps(python)}",
    ]
    for name, address in hosts:
        lines += ["", "[[hosts]]", f"name = {json.dumps(name)}", f"address = {json.dumps(address)}"]
    path.write_text("\n".join(lines) + "\n")
