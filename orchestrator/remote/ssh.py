"""SSH transport over fabric/paramiko: one reused connection per host with OpenSSH's host-key
rules; ssh_config and keys come from ssh_config.py, failures are translated by ssh_errors.py."""

from __future__ import annotations

import contextlib
import functools
import shlex
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import fabric
import paramiko

from inventory import Host
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.remote.predial import PreDial
from orchestrator.remote.ssh_config import apply_identities
from orchestrator.remote.ssh_errors import UnknownHostKey, translate
from orchestrator.remote.ssh_options import RecordedHostKey, SshOptions
from orchestrator.remote.transport import (
    CHUNK,
    Chunk,
    CommandResult,
    LineQueue,
    OutputLine,
    RunningCommand,
    timed_out,
)


class RejectUnknown(paramiko.MissingHostKeyPolicy):
    """OpenSSH's StrictHostKeyChecking=yes."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise UnknownHostKey(hostname, key)


class AcceptNew(paramiko.MissingHostKeyPolicy):
    """OpenSSH's StrictHostKeyChecking=accept-new: record unknown keys; changed keys still fail."""

    _lock = threading.Lock()

    def __init__(self, save_to: Path, name: str = "",
                 on_new: Callable[[RecordedHostKey], None] | None = None) -> None:
        self.save_to = save_to
        self.name = name
        self.on_new = on_new

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        with self._lock:
            self.save_to.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with self.save_to.open("a") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        if self.on_new is not None:
            self.on_new(RecordedHostKey(self.name or hostname, hostname, key.get_name(), key.fingerprint,
                                        self.save_to))


def _known_hosts_files(conn: fabric.Connection, options: SshOptions) -> list[Path]:
    files = list(options.known_hosts)
    configured = conn.ssh_config.get("userknownhostsfile")
    if configured:
        files += [Path(p.strip('"')).expanduser() for p in shlex.split(configured)]
    else:
        files.append(Path("~/.ssh/known_hosts").expanduser())
    return files


def _secure(conn: fabric.Connection, options: SshOptions) -> None:
    """Replace fabric's silent AutoAddPolicy with OpenSSH's rules, on every ProxyJump hop too."""
    files = _known_hosts_files(conn, options)
    for f in files:
        if f.exists():
            conn.client.load_host_keys(str(f))
    if options.accept_new_host_keys:
        conn.client.set_missing_host_key_policy(AcceptNew(files[0], conn.original_host, options.on_new_host_key))
    else:
        conn.client.set_missing_host_key_policy(RejectUnknown())
    if isinstance(conn.gateway, fabric.Connection):
        _secure(conn.gateway, options)


# -- connections ------------------------------------------------------------------------------

def make_connection(host: Host, options: SshOptions, ssh_config: paramiko.SSHConfig) -> fabric.Connection:
    """A connection configured like `ssh NAME` by `ssh_config`, whose lookup of the name gives the
    host's options (see ssh_config.merge_lookups: blocks may match its name or its address)."""
    timeout = int(max(1, options.connect_timeout))
    conn = fabric.Connection(
        host.name, user=host.user, port=host.port, config=fabric.Config(ssh_config=ssh_config),
        connect_timeout=timeout,
        connect_kwargs={"banner_timeout": timeout, "auth_timeout": timeout, "allow_agent": True},
    )
    _secure(conn, options)
    apply_identities(conn)
    return conn


class SshRunning:
    """A remote command on an open channel; abort() drops the channel like a lost link."""

    def __init__(self, host: str, chan: paramiko.Channel) -> None:
        self.host = host
        self.chan = chan
        self._lines = LineQueue()
        self._lines.reader("stdout", functools.partial(chan.recv, CHUNK))
        self._lines.reader("stderr", functools.partial(chan.recv_stderr, CHUNK))

    def lines(self) -> Iterator[OutputLine]:
        return iter(self._lines)

    def chunks(self) -> Iterator[Chunk]:
        return self._lines.chunks()

    def send(self, data: bytes) -> None:
        self.chan.sendall(data)

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self.chan.shutdown_write()

    def wait(self, timeout: float | None = None) -> int | None:
        """The command's exit status; None when it has none (yet): the connection closed
        without one (host or sshd died, or we dropped it), or `timeout` passed."""
        if not self.chan.status_event.wait(timeout):
            return None
        code = self.chan.recv_exit_status()
        return None if code == -1 else code  # paramiko's -1: closed without an exit status

    def abort(self) -> None:
        self.chan.close()


class SshTransport:
    """Runs argv on one host over a single fabric connection, opened on first use, reused."""

    def __init__(self, host: Host, options: SshOptions, ssh_config: paramiko.SSHConfig,
                 login: Mapping[str, Any] | None = None, dial: PreDial | None = None) -> None:
        self.host = host
        self.options = options
        self.ssh_config = ssh_config  # the user's ssh_config, looked up for this host (HostPool)
        self._login = login  # connect kwargs that replace ssh_config's keys and the agent (ssh-setup)
        self._dial = dial  # the TCP connection HostPool.connect_ahead dialled, for the first open
        self._conn: fabric.Connection | None = None
        self._lock = threading.Lock()
        self._used = False  # a command (or close) has asked for the connection: no opening ahead
        self._ahead_error: Exception | None = None  # connect_ahead's failure, for the first use
        self._stale: list[fabric.Connection] = []  # replaced by reconnect(), closed at the next

    def connection(self) -> fabric.Connection:
        with self._lock:
            self._used = True
            if self._ahead_error is not None:  # opening ahead failed: this use reports it, no second dial
                error, self._ahead_error = self._ahead_error, None
                raise error
            if self._conn is None or not self._conn.is_connected:
                self._conn = self._open_connection()
            return self._conn

    def connect_ahead(self) -> None:
        """Open the connection now, for a first use to come (HostPool.connect_ahead): that use
        waits for it, or raises its error. Nothing happens once a use has come first."""
        with self._lock:
            if self._used or self._conn is not None:
                return
            try:
                self._conn = self._open_connection()
            except Exception as exc:
                self._ahead_error = exc

    def _open_connection(self) -> fabric.Connection:
        conn = make_connection(self.host, self.options, self.ssh_config)
        conn.connect_kwargs.update(self._login or {})
        dial, self._dial = self._dial, None
        try:
            if dial is not None and (conn.gateway is not None or (conn.host, conn.port) != dial.target):
                dial.discard()  # fabric aims elsewhere after all
                dial = None
            if conn.gateway is None:  # a direct connection: on our socket (predial.py), dialled now if not ahead
                sock = (dial or PreDial((conn.host, conn.port), self.options.connect_timeout)).take()
                if sock is not None:
                    conn.connect_kwargs["sock"] = sock
            conn.open()
        except Exception as exc:  # translated once, here, at the boundary
            raise translate(self.host, conn, exc, self.options.ssh_config) from None
        assert conn.transport is not None
        conn.transport.set_keepalive(5)
        return conn

    def _open(self, argv: Sequence[str]) -> paramiko.Channel:
        conn = self.connection()
        try:
            chan = conn.transport.open_session(timeout=self.options.connect_timeout)
            chan.exec_command(shlex.join(argv))
        except Exception as exc:
            raise HostError(self.host.name, HostErrorKind.LOST,
                            f"SSH connection to {self.host.address} failed: {exc!r}") from None
        assert isinstance(chan, paramiko.Channel)
        return chan

    def start(self, argv: Sequence[str], *, stdin: bytes | None = None) -> RunningCommand:
        running = SshRunning(self.host.name, self._open(argv))
        if stdin:
            running.send(stdin)
        return running

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        started = time.monotonic()
        running = SshRunning(self.host.name, self._open(argv))
        if stdin:
            running.send(stdin)
        running.close_stdin()
        out: list[str] = []
        err: list[str] = []
        reader = threading.Thread(target=_collect, args=(running, out, err), daemon=True)
        reader.start()
        code = running.wait(timeout)
        if code is None and not running.chan.status_event.is_set():
            running.abort()
            raise timed_out(self.host.name, argv, timeout)
        code = -1 if code is None else code  # closed without an exit status
        reader.join(5)
        return CommandResult(self.host.name, tuple(argv), code, "\n".join(out) + ("\n" if out else ""),
                             "\n".join(err) + ("\n" if err else ""), time.monotonic() - started)

    def reconnect(self) -> None:
        """Open a fresh connection for the commands to come (the current one may be stuck: its
        TCP backoff grown over an outage). The old one stays open, so its sessions end only
        when their user drops them; it is closed at the next reconnect or at close(), in the
        background, never waited on. Raises the new connection's HostError."""
        fresh = self._open_connection()
        with self._lock:
            self._used = True
            stale, self._stale = self._stale, []
            if self._conn is not None:
                self._stale.append(self._conn)
            self._conn = fresh
        for conn in stale:
            threading.Thread(target=conn.close, daemon=True).start()

    def close(self) -> None:
        with self._lock:
            self._used = True
            if self._dial is not None:
                self._dial.discard()
                self._dial = None
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            stale, self._stale = self._stale, []
        for conn in stale:
            threading.Thread(target=conn.close, daemon=True).start()


def _collect(running: SshRunning, out: list[str], err: list[str]) -> None:
    for line in running.lines():
        (out if line.stream == "stdout" else err).append(line.text)
