"""The SSH options every command takes, and the ssh_config files they name. Standard library only:
a command makes its pool, and dials its hosts (predial.py), before paramiko and fabric load."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

DEFAULT_PARALLEL = 64


@dataclass(frozen=True)
class RecordedHostKey:
    """A host key that --accept-new-host-keys wrote to a known_hosts file."""

    name: str  # the host (or ProxyJump hop) as ssh_config names it
    known_as: str  # its known_hosts entry: the address, or [address]:port
    key_type: str  # "ssh-ed25519"
    fingerprint: str  # "SHA256:…", as OpenSSH prints it
    file: Path


@dataclass(frozen=True)
class SshOptions:
    ssh_config: Path | None = None  # None: ~/.ssh/config and /etc/ssh/ssh_config
    known_hosts: tuple[Path, ...] = ()  # in addition to ssh_config's / ~/.ssh/known_hosts
    accept_new_host_keys: bool = False  # like StrictHostKeyChecking=accept-new
    connect_timeout: float = 10.0
    # Told of every host key accept-new records (from the connecting threads).
    on_new_host_key: Callable[[RecordedHostKey], None] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Connection:
    """How a command reaches its hosts, from its SSH flags to its pool: the SSH options and how
    many hosts it contacts at once."""

    ssh: SshOptions = SshOptions()
    parallel: int = DEFAULT_PARALLEL

    def recording(self, on_new_host_key: Callable[[RecordedHostKey], None]) -> Connection:
        """The same connection, telling `on_new_host_key` of every host key accept-new records."""
        return replace(self, ssh=replace(self.ssh, on_new_host_key=on_new_host_key))


def connection_of(ssh_config: str | Path | None = None, known_hosts: Sequence[str | Path] = (),
                  accept_new_host_keys: bool = False, parallel: int = DEFAULT_PARALLEL,
                  connect_timeout: float = 10.0) -> Connection:
    """The Python API's keywords that mirror the CLI's SSH flags, as the one object the pool takes."""
    ssh = SshOptions(ssh_config=Path(ssh_config) if ssh_config is not None else None,
                     known_hosts=tuple(Path(p) for p in known_hosts), accept_new_host_keys=accept_new_host_keys,
                     connect_timeout=connect_timeout)
    return Connection(ssh, parallel)


def config_files(path: Path | None) -> list[Path]:
    """The ssh_config files read: `path` alone (like `ssh -F`), else ~/.ssh/config then
    /etc/ssh/ssh_config, where they exist."""
    if path is not None:
        return [path]
    return [p for p in (Path("~/.ssh/config").expanduser(), Path("/etc/ssh/ssh_config")) if p.is_file()]


_PROXY = re.compile(r"^\s*(proxyjump|proxycommand)\b", re.IGNORECASE | re.MULTILINE)


def names_a_proxy(path: Path | None) -> bool:
    """Whether any ssh_config file read mentions ProxyJump or ProxyCommand, for any host (an
    unreadable file counts as one that does): where none does, every host is dialled directly."""
    for f in config_files(path):
        try:
            if _PROXY.search(f.read_text(errors="replace")):
                return True
        except OSError:
            return True
    return False
