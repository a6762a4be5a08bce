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
                      authorized_keys: Path, test_user: str | None = None,
                      password_login: bool = False) -> None:
    """One host's sshd_config. No AcceptEnv: the client's environment never crosses over.

    root logs in with the cluster key (`authorized_keys`). A host with a `test_user` (a private
    one) also reads root's own ~/.ssh/authorized_keys (its home is private there); the test user
    only its own. Where `password_login`, both may also log in with their password (UsePAM no:
    sshd checks the host's /etc/shadow itself).
    """
    password = "yes" if password_login else "no"
    keys = _quoted(authorized_keys) + (" .ssh/authorized_keys" if test_user is not None else "")
    user_block = [] if test_user is None else [
        f"Match User {test_user}",
        "    AuthorizedKeysFile .ssh/authorized_keys",
        f"    PasswordAuthentication {password}",
        "Match User root",
        f"    PasswordAuthentication {password}",
    ]
    path.write_text(
        "\n".join([
            f"ListenAddress {address}",
            f"Port {port}",
            f"HostKey {_quoted(host_key)}",
            f"PidFile {_quoted(pid_file)}",
            f"AuthorizedKeysFile {keys}",
            "StrictModes no",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            f"PermitRootLogin {'yes' if password_login else 'prohibit-password'}",
            "UsePAM no",
            "UseDNS no",
            "MaxStartups 200",
            "MaxSessions 100",
            "PrintMotd no",
            "X11Forwarding no",
            "Subsystem sftp internal-sftp",
            *user_block,
            "",
        ])
    )


def write_user_db(etc: Path, user: str, uid: int, home: str, password: str, root_home: str) -> None:
    """passwd/shadow/group for one host (`ip netns exec` mounts <etc>/* over /etc/*): this
    machine's own, with root's home moved to `root_home`, plus `user`; both have `password`
    (a SHA-512 crypt, made by openssl from stdin; sshd_config says who may use it)."""
    crypted = subprocess.run(["openssl", "passwd", "-6", "-stdin"], input=password, check=True,
                             capture_output=True, text=True).stdout.strip()
    entries = {"passwd": f"{user}:x:{uid}:{uid}::{home}:/bin/sh\n",
               "shadow": f"{user}:{crypted}:19000:0:99999:7:::\n",
               "group": f"{user}:x:{uid}:\n"}
    for name, line in entries.items():
        target = etc / name
        lines = Path("/etc", name).read_text().splitlines(keepends=True)
        if name == "passwd":
            lines = [_with_field(e, 5, root_home) if e.startswith("root:") else e for e in lines]
        if name == "shadow":
            lines = [_with_field(e, 1, crypted) if e.startswith("root:") else e for e in lines]
        target.write_text("".join(lines) + line)
        target.chmod(0o640 if name == "shadow" else 0o644)


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


def write_hosts_toml(path: Path, hosts: Sequence[tuple[str, str]], python: str, spares: Sequence[str] = ()) -> None:
    """The inventory: root on every host, this machine's interpreter (shared filesystem); the
    hosts named in `spares` wait for a restart (spare = true)."""
    lines = [
        "# Written by tests/cluster.py: a namespace cluster on this machine.",
        "[defaults]",
        'user = "root"',
        f"python = {json.dumps(python)}",
    ]
    for name, address in hosts:
        lines += ["", "[[hosts]]", f"name = {json.dumps(name)}", f"address = {json.dumps(address)}"]
        lines += ["spare = true"] if name in spares else []
    path.write_text("\n".join(lines) + "\n")


def _with_field(line: str, index: int, value: str) -> str:
    fields = line.rstrip("\n").split(":")
    fields[index] = value
    return ":".join(fields) + "\n"
