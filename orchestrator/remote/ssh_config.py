"""What ssh_config and this machine's keys give one inventory host: its options (`Host` blocks may
match its name or its address) and the keys paramiko will offer, or why it offers none. paramiko
only: fabric is imported where connections are made (ssh.py)."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import paramiko

from inventory import Host
from orchestrator.remote.ssh_options import config_files

if TYPE_CHECKING:
    import fabric

UNMATCHED = "ddpctl-unmatched.invalid"  # a name that only catch-all blocks (`Host *`) match


def merge_lookups(lookup: Callable[[str], paramiko.SSHConfigDict], name: str, address: str,
                  catch_all: Callable[[], paramiko.SSHConfigDict] | None = None) -> paramiko.SSHConfigDict:
    """The ssh_config options of an inventory host, whose `Host` blocks may name it or its address.

    paramiko matches the patterns (as OpenSSH does) against the name and, separately, the address;
    each lookup keeps the first value obtained. Then, for each option:

    1. the name's value wins (`Host node1`), unless it is a catch-all's (`Host *`);
    2. else the address's value (`Host 10.0.0.*`, or failing that the catch-all's);
    3. else the name's.

    A value counts as a catch-all's when `UNMATCHED`, a name no specific block matches, gets the
    same; so a `Host *` at the end of the file, where OpenSSH wants defaults, does not shadow the
    address's block. HostName: the name's if set, else the address's if set, else the address
    itself. IdentityFile accumulates as in OpenSSH: the name's files, then the address's.
    `catch_all`: the lookup of `UNMATCHED`, where the caller keeps it (the same for every host).
    """
    by_name = lookup(name)
    if address == name:
        return by_name
    by_address = lookup(address)
    defaults = catch_all() if catch_all is not None else lookup_catch_all(lookup)
    merged = paramiko.SSHConfigDict(by_address)
    for key, value in by_name.items():
        if key not in merged or value != defaults.get(key):
            merged[key] = value
    merged["hostname"] = by_name["hostname"] if by_name["hostname"] != name else by_address["hostname"]
    files = config_list(by_name.get("identityfile")) + config_list(by_address.get("identityfile"))
    if files:
        merged.update(identityfile=cast(str, list(dict.fromkeys(files))))  # a list, as paramiko keeps it
    return merged


def lookup_catch_all(lookup: Callable[[str], paramiko.SSHConfigDict]) -> paramiko.SSHConfigDict:
    try:
        return lookup(UNMATCHED)
    except paramiko.SSHException:  # e.g. CanonicalizeHostname could not canonicalize the probe
        return paramiko.SSHConfigDict()


class HostSshConfig(paramiko.SSHConfig):
    """ssh_config files whose lookup of one inventory host's name applies `merge_lookups`. A pool
    parses the files once and gives each host a view (`for_host`) that shares the parsed blocks and
    their catch-all lookup (paramiko's lookup walks every block, which costs each host's connect)."""

    host: Host | None = None

    def __init__(self) -> None:
        super().__init__()
        self._catch_all: list[paramiko.SSHConfigDict] = []  # shared by the views; filled when first needed

    def for_host(self, host: Host) -> HostSshConfig:
        view = copy.copy(self)
        view.host = host
        return view

    def catch_all(self) -> paramiko.SSHConfigDict:
        if not self._catch_all:
            self._catch_all.append(lookup_catch_all(super().lookup))
        return self._catch_all[0]

    def lookup(self, hostname: str) -> paramiko.SSHConfigDict:
        if self.host is not None and hostname == self.host.name:
            return merge_lookups(super().lookup, self.host.name, self.host.address, self.catch_all)
        return super().lookup(hostname)  # a ProxyJump hop: by its own name, as OpenSSH does


def load_ssh_config(path: Path | None, host: Host | None = None) -> HostSshConfig:
    """`path` alone (like `ssh -F`), else ~/.ssh/config then /etc/ssh/ssh_config."""
    config = HostSshConfig()
    config.host = host
    for f in config_files(path):
        with f.open() as fh:
            config.parse(fh)
    return config


# -- keys: which ones paramiko offers, and why it offers none ---------------------------------

def config_list(value: object) -> list[str]:
    """An ssh_config value paramiko keeps as a list (IdentityFile), as a list whatever its type."""
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


DEFAULT_KEYS = ("id_rsa", "id_ecdsa", "id_ed25519")  # what paramiko looks for in ~/.ssh, in order


def identity_files(ssh_config: Mapping[str, object]) -> list[Path]:
    return [Path(p).expanduser() for p in config_list(ssh_config.get("identityfile"))]


def apply_identities(conn: fabric.Connection) -> None:
    """OpenSSH's rules, on every ProxyJump hop too: a missing IdentityFile is skipped (paramiko
    would crash on it), and the default keys are tried only when no IdentityFile is set."""
    import fabric  # loaded by now: `conn` is a fabric Connection

    configured = identity_files(conn.ssh_config)
    existing = [str(p) for p in configured if p.is_file()]
    conn.connect_kwargs["look_for_keys"] = not configured
    if existing:
        conn.connect_kwargs["key_filename"] = existing
    else:
        conn.connect_kwargs.pop("key_filename", None)
    if isinstance(conn.gateway, fabric.Connection):
        apply_identities(conn.gateway)


@dataclass(frozen=True)
class KeySource:
    """A key ddpctl may log in with: offered to the server, or why not."""

    where: str  # a key file, "ssh-agent", or an agent key
    offered: bool
    detail: str  # "ED25519 SHA256:…" when offered, else the reason
    encrypted: bool = False
    in_agent: bool = False

    def __str__(self) -> str:
        return f"{self.where} ({self.detail})"


def _key_file(path: Path) -> KeySource:
    """Load `path` the way paramiko's SSHClient does (RSA, ECDSA, then Ed25519; no passphrase)."""
    if not path.is_file():
        return KeySource(str(path), False, "no such file")
    error: Exception | None = None
    for cls in (paramiko.RSAKey, paramiko.ECDSAKey, paramiko.Ed25519Key):
        try:
            key = cls.from_private_key_file(str(path))
        except paramiko.PasswordRequiredException:
            return KeySource(str(path), False, "passphrase-protected, and ddpctl never prompts", encrypted=True)
        except Exception as exc:  # not this type, unreadable, or not a key: never crash the diagnosis
            error = exc
            continue
        return KeySource(str(path), True, f"{key.algorithm_name} {key.fingerprint}")
    return KeySource(str(path), False, f"not usable: {error}")


def _agent_keys() -> list[KeySource]:
    sock = os.environ.get("SSH_AUTH_SOCK")
    if not sock:
        return [KeySource("ssh-agent", False, "not running: SSH_AUTH_SOCK is not set", in_agent=True)]
    try:
        agent = paramiko.Agent()
        keys = agent.get_keys()
        agent.close()
    except Exception as exc:
        return [KeySource("ssh-agent", False, f"not usable at {sock}: {exc}", in_agent=True)]
    if not keys:
        return [KeySource("ssh-agent", False, f"has no keys (ssh-add -l; SSH_AUTH_SOCK={sock})", in_agent=True)]
    return [KeySource(f"ssh-agent key {k.comment or '(no comment)'}", True, f"{k.algorithm_name} {k.fingerprint}",
                      in_agent=True) for k in keys]


def key_sources(conn: fabric.Connection) -> list[KeySource]:
    """Every key paramiko tries for `conn`, in its order: IdentityFile, ssh-agent, default keys."""
    configured = identity_files(conn.ssh_config)
    sources = [_key_file(p) for p in configured]
    if conn.connect_kwargs.get("allow_agent", True):
        sources += _agent_keys()
    defaults = [Path("~/.ssh").expanduser() / name for name in DEFAULT_KEYS]
    if conn.connect_kwargs.get("look_for_keys", True):
        sources += [_key_file(p) for p in defaults]
    else:
        sources.append(KeySource(", ".join(map(str, defaults)), False, "not tried: IdentityFile is set"))
    return sources
