"""SSH connect failures translated into one error naming the host, its address:port, what
happened (refused, unreachable, timed out, no key offered, key refused, host key) and the fix."""

from __future__ import annotations

import errno
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fabric
import paramiko
from paramiko.ssh_exception import NoValidConnectionsError

from inventory import Host
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.remote.ssh_config import KeySource, identity_files, key_sources


class UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(f"host key for {hostname} is not in known_hosts")
        self.hostname = hostname
        self.key = key


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
        if d.conn is conn and conn.connect_kwargs.get("password") is not None:
            return _password_error(host, d, exc)
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


def _password_error(host: Host, d: _Dialled, exc: BaseException) -> HostError:
    """A password login (ssh-setup's): not allowed for this user, or the password refused."""
    if isinstance(exc, paramiko.BadAuthenticationType):
        return HostError(host.name, HostErrorKind.PASSWORD_DISABLED,
                         f"sshd at {d.where} ({d.name}) does not accept a password from {d.conn.user} (it "
                         f"allows only {', '.join(exc.allowed_types) or 'nothing'})",
                         f"authorize the key another way (the provider's console, or an account that can log "
                         f"in), or allow it on {d.name}: PasswordAuthentication yes in /etc/ssh/sshd_config")
    return HostError(host.name, HostErrorKind.WRONG_PASSWORD,
                     f"{d.login}:{d.port} ({d.name}) refused the password",
                     f"check the password of {d.login}, and that {d.conn.user} is the account to log in "
                     "as (set user in the inventory); different passwords per host: --ask-each")


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
