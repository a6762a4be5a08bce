"""SSH transport over fabric/paramiko: one reused connection per host, OpenSSH host-key and key-file
rules, and connect failures translated into one error naming the host, its address:port and the fix."""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fabric
import paramiko
from paramiko.ssh_exception import NoValidConnectionsError

from inventory import Host
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.remote.transport import CommandResult, LineQueue, OutputLine, RunningCommand, timed_out


@dataclass(frozen=True)
class SshOptions:
    ssh_config: Path | None = None  # None: ~/.ssh/config and /etc/ssh/ssh_config
    known_hosts: tuple[Path, ...] = ()  # in addition to ssh_config's / ~/.ssh/known_hosts
    accept_new_host_keys: bool = False  # like StrictHostKeyChecking=accept-new
    connect_timeout: float = 10.0


class UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(f"host key for {hostname} is not in known_hosts")
        self.hostname = hostname
        self.key = key


class RejectUnknown(paramiko.MissingHostKeyPolicy):
    """OpenSSH's StrictHostKeyChecking=yes."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise UnknownHostKey(hostname, key)


class AcceptNew(paramiko.MissingHostKeyPolicy):
    """OpenSSH's StrictHostKeyChecking=accept-new: record unknown keys; changed keys still fail."""

    _lock = threading.Lock()

    def __init__(self, save_to: Path) -> None:
        self.save_to = save_to

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        with self._lock:
            self.save_to.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with self.save_to.open("a") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


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
        conn.client.set_missing_host_key_policy(AcceptNew(files[0]))
    else:
        conn.client.set_missing_host_key_policy(RejectUnknown())
    if isinstance(conn.gateway, fabric.Connection):
        _secure(conn.gateway, options)


# -- keys: which ones paramiko offers, and why it offers none ---------------------------------

def config_list(value: object) -> list[str]:
    """An ssh_config value paramiko keeps as a list (IdentityFile), as a list whatever its type."""
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


DEFAULT_KEYS = ("id_rsa", "id_ecdsa", "id_ed25519")  # what paramiko looks for in ~/.ssh, in order


def identity_files(ssh_config: Mapping[str, object]) -> list[Path]:
    return [Path(p).expanduser() for p in config_list(ssh_config.get("identityfile"))]


def _apply_identities(conn: fabric.Connection) -> None:
    """OpenSSH's rules, on every ProxyJump hop too: a missing IdentityFile is skipped (paramiko
    would crash on it), and the default keys are tried only when no IdentityFile is set."""
    configured = identity_files(conn.ssh_config)
    existing = [str(p) for p in configured if p.is_file()]
    conn.connect_kwargs["look_for_keys"] = not configured
    if existing:
        conn.connect_kwargs["key_filename"] = existing
    else:
        conn.connect_kwargs.pop("key_filename", None)
    if isinstance(conn.gateway, fabric.Connection):
        _apply_identities(conn.gateway)


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


# -- connections ------------------------------------------------------------------------------

def make_connection(host: Host, options: SshOptions, ssh_config: paramiko.SSHConfig) -> fabric.Connection:
    """A connection configured like `ssh NAME` by `ssh_config`, whose lookup of the name gives the
    host's options (see pool.merge_lookups: blocks may match its name or its address)."""
    timeout = int(max(1, options.connect_timeout))
    conn = fabric.Connection(
        host.name, user=host.user, port=host.port, config=fabric.Config(ssh_config=ssh_config),
        connect_timeout=timeout,
        connect_kwargs={"banner_timeout": timeout, "auth_timeout": timeout, "allow_agent": True},
    )
    _secure(conn, options)
    _apply_identities(conn)
    return conn


# -- failures: one error naming the host, its address:port, what happened and the fix ----------

@dataclass(frozen=True)
class _Dialled:
    """What failed: the inventory host, or the ProxyJump hop that failed on the way to it."""

    conn: Any  # fabric.Connection
    name: str
    via: str  # "" or "via ProxyJump host bastion: "
    source: str  # where the address comes from

    @property
    def address(self) -> str:
        return str(self.conn.host)

    @property
    def port(self) -> int:
        return int(self.conn.port)

    @property
    def where(self) -> str:
        return f"{self.address}:{self.port}"

    @property
    def login(self) -> str:
        return f"{self.conn.user}@{self.address}"

    def copy_id(self, pub: str | None = None) -> str:
        jump = self.conn.ssh_config.get("proxyjump")
        return shlex.join(["ssh-copy-id", *(["-i", pub] if pub else []),
                           *(["-p", str(self.port)] if self.port != 22 else []),
                           *(["-o", f"ProxyJump={jump}"] if jump else []), self.login])


def _dialled(host: Host, conn: fabric.Connection) -> _Dialled:
    hop = conn
    while isinstance(hop.gateway, fabric.Connection) and not hop.gateway.is_connected:
        hop = hop.gateway  # the first hop that failed: the ones before it are connected
    if hop is not conn:
        return _Dialled(hop, hop.original_host, f"via ProxyJump host {hop.original_host}: ",
                        "ProxyJump in ssh_config")
    source = "the inventory" if conn.host == host.address else "HostName in ssh_config"
    return _Dialled(conn, host.name, "", source)


def translate(host: Host, conn: fabric.Connection, exc: BaseException,
              ssh_config: Path | None = None) -> HostError:
    """Turn a paramiko/socket exception into one error naming the host, its address:port and the fix."""
    d = _dialled(host, conn)
    if isinstance(exc, paramiko.BadHostKeyException):
        return HostError(host.name, HostErrorKind.CHANGED_HOST_KEY,
                         f"{d.via}host key of {d.where} ({d.name}) CHANGED (expected "
                         f"{exc.expected_key.get_fingerprint().hex()}, got {exc.key.get_fingerprint().hex()}); "
                         "refusing to connect",
                         f"if {d.name} was reinstalled: ssh-keygen -R {d.address}, then verify and "
                         "reconnect; otherwise treat it as a possible man-in-the-middle")
    if isinstance(exc, UnknownHostKey):
        return HostError(host.name, HostErrorKind.UNKNOWN_HOST_KEY,
                         f"{d.via}unknown host key for {exc.hostname} ({d.name}, {exc.key.get_name()}); "
                         "refusing to connect",
                         f"verify it, then: ssh-keyscan -p {d.port} {d.address} >> ~/.ssh/known_hosts "
                         "(or pass --accept-new-host-keys)")
    if _is_auth_failure(d.conn, exc):
        return _auth_error(host, d, exc, ssh_config)
    return _network_error(host, d, exc) or HostError(
        host.name, HostErrorKind.PROTOCOL, f"{d.via}SSH to {d.where} ({d.name}) failed: {exc!r}",
        f"try: ssh {'-p ' + str(d.port) + ' ' if d.port != 22 else ''}{d.login} true")


def _is_auth_failure(conn: fabric.Connection, exc: BaseException) -> bool:
    """paramiko fails authentication with AuthenticationException when the server refused a key,
    SSHException("No authentication methods available") when it had none to offer, or the last
    key file's load error: all raised on an open, unauthenticated transport."""
    if isinstance(exc, paramiko.AuthenticationException):
        return True
    if not isinstance(exc, paramiko.SSHException):
        return False
    transport = conn.client.get_transport()
    return "authentication" in str(exc).lower() or bool(
        transport is not None and transport.active and not transport.is_authenticated())


def _auth_error(host: Host, d: _Dialled, exc: BaseException, ssh_config: Path | None) -> HostError:
    sources = key_sources(d.conn)
    offered = [s for s in sources if s.offered]
    if isinstance(exc, paramiko.BadAuthenticationType) and "publickey" not in exc.allowed_types:
        return HostError(host.name, HostErrorKind.AUTH,
                         f"{d.via}sshd at {d.where} ({d.name}) accepts no keys (it allows only "
                         f"{', '.join(exc.allowed_types) or 'nothing'}); ddpctl logs in with keys only",
                         f"on {d.name}: set PubkeyAuthentication yes in /etc/ssh/sshd_config, then "
                         "sudo systemctl reload ssh")
    refused = isinstance(exc, paramiko.AuthenticationException) and not isinstance(
        exc, paramiko.PasswordRequiredException)
    if "no authentication methods available" in str(exc).lower() or (not offered and not refused):
        return HostError(host.name, HostErrorKind.NO_KEY,
                         f"{d.via}no SSH key to offer to {d.login}:{d.port} ({d.name}); looked at: "
                         + "; ".join(map(str, sources)), _no_key_fix(d, sources, ssh_config))
    keys = ", ".join(map(str, offered)) or "keys that ddpctl cannot list"
    return HostError(host.name, HostErrorKind.AUTH,
                     f"{d.via}{d.login}:{d.port} ({d.name}) refused every key offered: {keys}",
                     _refused_fix(d, offered))


def _no_key_fix(d: _Dialled, sources: list[KeySource], ssh_config: Path | None) -> str:
    encrypted = [s.where for s in sources if s.encrypted]
    if encrypted:
        return f"load it into ssh-agent (eval $(ssh-agent) if none runs): ssh-add {shlex.quote(encrypted[0])}"
    missing = [str(p) for p in identity_files(d.conn.ssh_config) if not p.is_file()]
    key = missing[0] if missing else str(Path("~/.ssh/id_ed25519").expanduser())
    fix = f"ssh-keygen -t ed25519 -f {shlex.quote(key)}, then {d.copy_id(key + '.pub')}"
    if missing:
        fix += f"; or point IdentityFile in {ssh_config or '~/.ssh/config'} at a key that exists"
    return fix


def _refused_fix(d: _Dialled, offered: list[KeySource]) -> str:
    user = d.conn.user
    wrong_user = (f"; if {user} is not the account to log in as on {d.name}, set user for {d.name} in "
                  "the inventory (or User in ssh_config)")
    files = [s.where for s in offered if not s.in_agent]
    if not files:
        return f"authorize your ssh-agent's key on {d.name}: {d.copy_id()}" + wrong_user
    pub = files[0] + ".pub"
    make_pub = "" if Path(pub).is_file() else f"ssh-keygen -y -f {shlex.quote(files[0])} > {shlex.quote(pub)}, then "
    return (f"authorize {files[0]} on {d.name}: {make_pub}{d.copy_id(pub)} (or append {pub} to "
            f"~{user}/.ssh/authorized_keys on {d.name})" + wrong_user)


def _errnos(exc: BaseException) -> set[int]:
    if isinstance(exc, NoValidConnectionsError):  # paramiko's: every address refused or unreachable
        return {e.errno for e in exc.errors.values() if isinstance(e, OSError) and e.errno is not None}
    return {exc.errno} if isinstance(exc, OSError) and exc.errno is not None else set()


def _network_error(host: Host, d: _Dialled, exc: BaseException) -> HostError | None:
    codes = _errnos(exc)
    name, addr, port = d.name, d.address, d.port
    if isinstance(exc, socket.gaierror):
        return HostError(host.name, HostErrorKind.UNRESOLVED,
                         f"{d.via}cannot resolve {addr} ({name}, from {d.source}): {exc.strerror or exc}",
                         f"set {name}'s IP address in {d.source}, or add {addr} to /etc/hosts or DNS")
    if errno.ECONNREFUSED in codes:
        return HostError(host.name, HostErrorKind.SSHD_DOWN,
                         f"{d.via}{d.where} ({name}) refused the connection: the machine answers, but "
                         f"nothing accepts connections on port {port} (sshd stopped or on another port)",
                         f"on {name}: sudo systemctl start ssh (sshd on RHEL/Fedora), and check its port "
                         f"with sudo ss -ltnp | grep sshd; if it is not {port}, set port for {name} in "
                         "the inventory (or Port in ssh_config)")
    if isinstance(exc, TimeoutError):
        return HostError(host.name, HostErrorKind.UNREACHABLE,
                         f"{d.via}connecting to {d.where} ({name}) timed out after {d.conn.connect_timeout}s: "
                         f"no reply at all (host down, link down, wrong address, or a firewall dropping "
                         f"port {port})",
                         f"ping {addr}: without a reply, check that {name} is up, its link, and its address "
                         f"in {d.source}; with one, a firewall drops port {port}: on {name}, sudo ufw allow "
                         f"{port}/tcp (or sudo iptables -I INPUT -p tcp --dport {port} -j ACCEPT)")
    if errno.EHOSTUNREACH in codes:
        return HostError(host.name, HostErrorKind.UNREACHABLE,
                         f"{d.via}no route to host {d.where} ({name}): nothing answers at {addr} (host "
                         "down, link down, or wrong address)",
                         f"check that {name} is up and its link is up (ping {addr}), and that {addr} in "
                         f"{d.source} is {name}'s address (ip -br addr on {name})")
    if errno.ENETUNREACH in codes:
        return HostError(host.name, HostErrorKind.UNREACHABLE,
                         f"{d.via}network unreachable: this machine has no route to {d.where} ({name})",
                         f"check {name}'s address in {d.source}, or add a route to its network "
                         f"(ip route get {addr} shows none)")
    return None


class SshRunning:
    """A remote command on an open channel; abort() drops the channel like a lost link."""

    def __init__(self, host: str, chan: paramiko.Channel) -> None:
        self.host = host
        self.chan = chan
        self._lines = LineQueue()
        self._lines.reader("stdout", chan.makefile("rb"))
        self._lines.reader("stderr", chan.makefile_stderr("rb"))

    def lines(self) -> Iterator[OutputLine]:
        return iter(self._lines)

    def send(self, data: bytes) -> None:
        self.chan.sendall(data)

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self.chan.shutdown_write()

    def wait(self, timeout: float | None = None) -> int | None:
        if not self.chan.status_event.wait(timeout):
            return None
        return self.chan.recv_exit_status()

    def abort(self) -> None:
        self.chan.close()


class SshTransport:
    """Runs argv on one host over a single fabric connection, opened on first use, reused."""

    def __init__(self, host: Host, options: SshOptions, ssh_config: paramiko.SSHConfig) -> None:
        self.host = host
        self.options = options
        self.ssh_config = ssh_config  # the user's ssh_config, looked up for this host (HostPool)
        self._conn: fabric.Connection | None = None
        self._lock = threading.Lock()

    def connection(self) -> fabric.Connection:
        with self._lock:
            if self._conn is None or not self._conn.is_connected:
                conn = make_connection(self.host, self.options, self.ssh_config)
                try:
                    conn.open()
                except Exception as exc:  # translated once, here, at the boundary
                    raise translate(self.host, conn, exc, self.options.ssh_config) from None
                assert conn.transport is not None
                conn.transport.set_keepalive(5)
                self._conn = conn
            return self._conn

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
        if code is None:
            running.abort()
            raise timed_out(self.host.name, argv, timeout)
        reader.join(5)
        return CommandResult(self.host.name, tuple(argv), code, "\n".join(out) + ("\n" if out else ""),
                             "\n".join(err) + ("\n" if err else ""), time.monotonic() - started)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _collect(running: SshRunning, out: list[str], err: list[str]) -> None:
    for line in running.lines():
        (out if line.stream == "stdout" else err).append(line.text)
