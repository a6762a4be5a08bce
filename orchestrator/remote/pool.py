"""One transport per host, reused for the whole run, with its view of ssh_config, and a bounded
parallel fan-out over hosts. paramiko and fabric (ssh_config.py, ssh.py: ~0.1 s of imports) load
with the first SSH transport, not with this module: connect_ahead dials the hosts first."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from inventory import ConfigError, Host
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.remote.predial import PreDial, dial_target
from orchestrator.remote.ssh_options import DEFAULT_PARALLEL, Connection, SshOptions, names_a_proxy
from orchestrator.remote.transport import LocalTransport, Transport

if TYPE_CHECKING:
    from orchestrator.remote.ssh_config import HostSshConfig

T = TypeVar("T")

__all__ = ["DEFAULT_PARALLEL", "Connection", "FanOut", "HostPool", "make_pool"]


@dataclass
class FanOut(Generic[T]):
    """Each host maps to its result or its error: partial failure is data."""

    succeeded: dict[str, T] = field(default_factory=dict)
    failed: dict[str, HostError] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed


class HostPool:
    """Opens each host's connection on first use and keeps it for every later command."""

    def __init__(self, options: SshOptions | None = None, max_parallel: int = DEFAULT_PARALLEL,
                 login: Callable[[Host], Mapping[str, Any]] | None = None) -> None:
        self.options = options or SshOptions()
        self.max_parallel = max(1, max_parallel)
        self.login = login  # per host: connect kwargs replacing keys/agent (ssh-setup's logins)
        self._transports: dict[str, Transport] = {}
        self._ssh_config: HostSshConfig | None = None
        self._dials: dict[str, PreDial] = {}  # connect_ahead's, until the host's transport takes it
        self._lock = threading.Lock()

    def _config(self) -> HostSshConfig:
        if self._ssh_config is None:  # parsed once: each host gets a view of it
            from orchestrator.remote.ssh_config import load_ssh_config  # paramiko: see the module's doc

            self._ssh_config = load_ssh_config(self.options.ssh_config)
        return self._ssh_config

    def transport(self, host: Host) -> Transport:
        with self._lock:
            t = self._transports.get(host.name)
            if t is None:
                if host.is_local:
                    t = LocalTransport(host)
                else:
                    from orchestrator.remote.ssh import SshTransport  # fabric: see the module's doc

                    t = SshTransport(host, self.options, self._config().for_host(host),
                                     self.login(host) if self.login else None, self._dials.pop(host.name, None))
                self._transports[host.name] = t
            return t

    def connect_ahead(self, hosts: Iterable[Host]) -> None:
        """Start opening each SSH host's connection in the background and return: the TCP dials
        go out before fabric is imported, the handshakes (at most max_parallel at once) run while
        the caller goes on with its own work (a command's remaining imports and planning). Each
        host's first command waits for its connection and raises its error, as if it had dialled
        itself."""
        remote = [h for h in hosts if not h.is_local]
        # Where no ssh_config file names a proxy, fabric connects each host to its HostName (its
        # address unless ssh_config renames it) and Port: dialled before paramiko even loads, and
        # dropped at the handshake where ssh_config aims elsewhere after all. Else after reading it.
        direct = not names_a_proxy(self.options.ssh_config)
        with self._lock:
            for h in remote[:self.max_parallel]:  # the rest are dialled by their handshake's turn
                if h.name not in self._transports and h.name not in self._dials:
                    target = (h.address, h.port or 22) if direct else \
                        dial_target(h, self._config().for_host(h).lookup(h.name))
                    if target is not None:
                        self._dials[h.name] = PreDial(target, self.options.connect_timeout)
        from orchestrator.remote.ssh import SshTransport  # fabric loads here, once the dials are out

        pending: queue.SimpleQueue[SshTransport] = queue.SimpleQueue()
        for h in remote:
            t = self.transport(h)
            assert isinstance(t, SshTransport)
            pending.put(t)

        def work() -> None:
            while True:
                try:
                    t = pending.get_nowait()
                except queue.Empty:
                    return
                t.connect_ahead()

        for _ in range(min(self.max_parallel, len(remote))):
            threading.Thread(target=work, name="ddpctl-connect-ahead", daemon=True).start()

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
            dials, self._dials = list(self._dials.values()), {}
        for d in dials:
            d.discard()
        for t in transports:
            t.close()

    def __enter__(self) -> HostPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_pool(connection: Connection, *, login: Callable[[Host], Mapping[str, Any]] | None = None) -> HostPool:
    """A pool reaching its hosts as `connection` says (every command's SSH flags, or the Python
    API's keywords); `login`: per host, connect kwargs replacing keys and agent (ssh-setup's)."""
    ssh_config = connection.ssh.ssh_config
    if ssh_config is not None and not ssh_config.is_file():
        raise ConfigError(f"SSH config file {ssh_config} does not exist", key="--ssh-config")
    return HostPool(connection.ssh, max_parallel=connection.parallel, login=login)
