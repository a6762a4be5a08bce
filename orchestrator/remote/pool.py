"""One transport per host, reused for the whole run, with its view of ssh_config, and a bounded
parallel fan-out over hosts."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar, cast

import paramiko

from inventory import ConfigError, Host
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.remote.ssh import SshOptions, SshTransport, config_list
from orchestrator.remote.transport import LocalTransport, Transport

T = TypeVar("T")

DEFAULT_PARALLEL = 64


@dataclass
class FanOut(Generic[T]):
    """Each host maps to its result or its error: partial failure is data."""

    succeeded: dict[str, T] = field(default_factory=dict)
    failed: dict[str, HostError] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed


UNMATCHED = "ddpctl-unmatched.invalid"  # a name that only catch-all blocks (`Host *`) match


def merge_lookups(lookup: Callable[[str], paramiko.SSHConfigDict], name: str,
                  address: str) -> paramiko.SSHConfigDict:
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
    """
    by_name = lookup(name)
    if address == name:
        return by_name
    by_address = lookup(address)
    try:
        catch_all = lookup(UNMATCHED)
    except paramiko.SSHException:  # e.g. CanonicalizeHostname could not canonicalize the probe
        catch_all = paramiko.SSHConfigDict()
    merged = paramiko.SSHConfigDict(by_address)
    for key, value in by_name.items():
        if key not in merged or value != catch_all.get(key):
            merged[key] = value
    merged["hostname"] = by_name["hostname"] if by_name["hostname"] != name else by_address["hostname"]
    files = config_list(by_name.get("identityfile")) + config_list(by_address.get("identityfile"))
    if files:
        merged.update(identityfile=cast(str, list(dict.fromkeys(files))))  # a list, as paramiko keeps it
    return merged


class HostSshConfig(paramiko.SSHConfig):
    """ssh_config files whose lookup of one inventory host's name applies `merge_lookups`."""

    host: Host | None = None

    def lookup(self, hostname: str) -> paramiko.SSHConfigDict:
        if self.host is not None and hostname == self.host.name:
            return merge_lookups(super().lookup, self.host.name, self.host.address)
        return super().lookup(hostname)  # a ProxyJump hop: by its own name, as OpenSSH does


def load_ssh_config(path: Path | None, host: Host | None = None) -> HostSshConfig:
    """`path` alone (like `ssh -F`), else ~/.ssh/config then /etc/ssh/ssh_config."""
    config = HostSshConfig()
    config.host = host
    files = [path] if path is not None else [
        p for p in (Path("~/.ssh/config").expanduser(), Path("/etc/ssh/ssh_config")) if p.is_file()]
    for f in files:
        with f.open() as fh:
            config.parse(fh)
    return config


class HostPool:
    """Opens each host's connection on first use and keeps it for every later command."""

    def __init__(self, options: SshOptions | None = None, max_parallel: int = DEFAULT_PARALLEL) -> None:
        self.options = options or SshOptions()
        self.max_parallel = max(1, max_parallel)
        self._transports: dict[str, Transport] = {}
        self._lock = threading.Lock()

    def transport(self, host: Host) -> Transport:
        with self._lock:
            t = self._transports.get(host.name)
            if t is None:
                t = LocalTransport(host) if host.is_local else SshTransport(
                    host, self.options, load_ssh_config(self.options.ssh_config, host))
                self._transports[host.name] = t
            return t

    def map(self, hosts: Iterable[Host], fn: Callable[[Transport], T]) -> FanOut[T]:
        hosts = list(hosts)
        out: FanOut[T] = FanOut()
        if not hosts:
            return out

        def one(host: Host) -> tuple[str, T | HostError]:
            try:
                return host.name, fn(self.transport(host))
            except HostError as exc:
                return host.name, exc
            except Exception as exc:  # a crash on one host is that host's error, not ours
                return host.name, HostError(host.name, HostErrorKind.PROTOCOL, f"{type(exc).__name__}: {exc}")

        with ThreadPoolExecutor(max_workers=min(self.max_parallel, len(hosts))) as pool:
            for name, value in pool.map(one, hosts):
                if isinstance(value, HostError):
                    out.failed[name] = value
                else:
                    out.succeeded[name] = value
        return out

    def close(self) -> None:
        with self._lock:
            transports, self._transports = list(self._transports.values()), {}
        for t in transports:
            t.close()

    def __enter__(self) -> HostPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_pool(ssh_config: Path | None, known_hosts: Sequence[Path] | None, accept_new: bool,
              parallel: int = DEFAULT_PARALLEL, connect_timeout: float = 10.0) -> HostPool:
    """A pool with the SSH options every command (and the Python API) takes."""
    if ssh_config is not None and not ssh_config.is_file():
        raise ConfigError(f"SSH config file {ssh_config} does not exist", key="--ssh-config")
    options = SshOptions(ssh_config=ssh_config, known_hosts=tuple(known_hosts or ()),
                         accept_new_host_keys=accept_new, connect_timeout=connect_timeout)
    return HostPool(options, max_parallel=parallel)
