"""`ddpctl ssh-setup`'s core: make sure the key pair exists, add its public key to every host's
authorized_keys over one password login per host (the node agent's `authorize_key` op), then prove
that the key alone logs in. Each host ends as one `HostSetup`; nothing here prints."""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from inventory import Host, Job
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.remote.agent import call_agent
from orchestrator.remote.keys import DEFAULT_KEY, LocalKey, ensure_key, key_login, password_login
from orchestrator.remote.pool import FanOut, HostPool, make_pool
from orchestrator.remote.slurm_client import login_host
from orchestrator.remote.ssh_options import Connection, RecordedHostKey
from orchestrator.remote.transport import Transport

T = TypeVar("T")

# Asked once the key is ready, for the hosts that need SSH: host name -> password.
PasswordSource = Callable[[Sequence[Host]], Mapping[str, str]]


class Outcome(str, enum.Enum):
    INSTALLED = "installed"
    PRESENT = "already present"
    LOCAL = "this machine"  # reached without SSH: nothing to set up
    FAILED = "failed"


class Reason(str, enum.Enum):
    """Why a host failed."""

    WRONG_PASSWORD = "wrong password"
    PASSWORD_DISABLED = "password login disabled"
    UNREACHABLE = "unreachable"
    UNKNOWN_HOST_KEY = "unknown host key"
    HOST_KEY_CHANGED = "host key changed"
    KEY_REFUSED = "key login refused"  # the key is in authorized_keys, yet sshd refuses it
    NOT_WRITTEN = "authorized_keys not writable"
    AGENT = "node agent failed"
    OTHER = "error"


REASONS = {
    HostErrorKind.WRONG_PASSWORD: Reason.WRONG_PASSWORD,
    HostErrorKind.PASSWORD_DISABLED: Reason.PASSWORD_DISABLED,
    HostErrorKind.UNREACHABLE: Reason.UNREACHABLE,
    HostErrorKind.SSHD_DOWN: Reason.UNREACHABLE,
    HostErrorKind.UNRESOLVED: Reason.UNREACHABLE,
    HostErrorKind.UNKNOWN_HOST_KEY: Reason.UNKNOWN_HOST_KEY,
    HostErrorKind.CHANGED_HOST_KEY: Reason.HOST_KEY_CHANGED,
    HostErrorKind.AUTH: Reason.KEY_REFUSED,
    HostErrorKind.NO_KEY: Reason.KEY_REFUSED,
    HostErrorKind.AGENT: Reason.AGENT,
}
# A password step that failed on these may still find the key already working.
PASSWORD_REFUSED = frozenset({HostErrorKind.WRONG_PASSWORD, HostErrorKind.PASSWORD_DISABLED})
STRICT_MODES_FIX = ("sshd (StrictModes) ignores a group- or world-writable ~/.ssh or authorized_keys: "
                    "chmod 700 ~/.ssh && chmod 600 ~/.ssh/authorized_keys on the host; a from= or other "
                    "option on the key's line in authorized_keys may also refuse this machine")


def reason_for(err: HostError) -> Reason:
    return REASONS.get(err.kind, Reason.OTHER)


@dataclass(frozen=True)
class SetupOptions:
    """The key and the SSH options every command takes."""

    key: Path = DEFAULT_KEY
    connection: Connection = field(default_factory=Connection)
    timeout: float = 60.0  # seconds for each host's authorize_key round trip


@dataclass(frozen=True)
class Installed:
    """What the agent's authorize_key op did on one host."""

    status: str  # "added", "present" or "failed"
    path: str = ""
    created_dir: bool = False
    created_file: bool = False
    dir_mode: int = 0
    file_mode: int = 0
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("added", "present")

    @property
    def loose_modes(self) -> bool:
        return bool((self.dir_mode | self.file_mode) & 0o022)


def parse_installed(host: str, result: Mapping[str, Any]) -> Installed:
    status = str(result.get("status", ""))
    if status not in ("added", "present", "failed"):
        raise HostError(host, HostErrorKind.AGENT, f"authorize_key answered an unknown status {status!r}",
                        "this is a ddpctl bug: the agent and the control plane disagree")
    return Installed(status, str(result.get("path", "")), bool(result.get("created_dir")),
                     bool(result.get("created_file")), int(result.get("dir_mode") or 0),
                     int(result.get("file_mode") or 0), str(result.get("message", "")))


@dataclass(frozen=True)
class HostSetup:
    """One host's result: the key installed, already there, or why not."""

    host: str
    address: str
    user: str | None
    outcome: Outcome
    reason: Reason | None = None
    message: str = ""
    fix: str = ""
    verified: bool = False  # a login with the key alone worked

    @property
    def failed(self) -> bool:
        return self.outcome is Outcome.FAILED


@dataclass(frozen=True)
class SetupReport:
    key: LocalKey
    hosts: list[HostSetup]
    new_host_keys: list[RecordedHostKey] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if any(h.failed for h in self.hosts) else 0


def setup_hosts(job: Job) -> list[Host]:
    """The hosts a job reaches over SSH: its hosts, or for a Slurm job its login node."""
    if job.slurm is not None:
        return [login_host(job.slurm.login, job.inventory)]
    return list(job.hosts)


def host_outcome(host: Host, install: Installed | HostError | None, verify: HostError | bool | None) -> HostSetup:
    """One host's outcome from the password step (None: not tried) and the key-only login (True:
    worked, None: not tried)."""

    def row(outcome: Outcome, reason: Reason | None = None, message: str = "", fix: str = "") -> HostSetup:
        return HostSetup(host.name, host.address, host.user, outcome, reason, message, fix, verify is True)

    if host.is_local:
        return row(Outcome.LOCAL, message="ddpctl runs commands here without SSH")
    if verify is True:
        if isinstance(install, Installed) and install.status == "added":
            return row(Outcome.INSTALLED, message=_added(install))
        if isinstance(install, HostError):
            return row(Outcome.PRESENT, message="the key already logs in (the password login failed: "
                                                f"{reason_for(install).value})")
        return row(Outcome.PRESENT, message=f"already in {install.path}" if install else "")
    if isinstance(install, HostError):
        return row(Outcome.FAILED, reason_for(install), install.message, install.fix)
    if install is None or not install.ok:
        return row(Outcome.FAILED, Reason.NOT_WRITTEN, install.message if install else "the key was never sent",
                   "check that the home directory exists, belongs to this user, and its disk is not full")
    if isinstance(verify, HostError) and reason_for(verify) is not Reason.KEY_REFUSED:
        return row(Outcome.FAILED, reason_for(verify), f"the key is in {install.path}, but logging in with it "
                   f"failed: {verify.message}", verify.fix)
    return row(Outcome.FAILED, Reason.KEY_REFUSED, f"the key is in {install.path}, but sshd refused a login "
               "with it", _refused_fix(install))


def _added(install: Installed) -> str:
    created = [name for name, made in (("~/.ssh", install.created_dir), ("the file", install.created_file)) if made]
    return f"added to {install.path}" + (f" (created {' and '.join(created)})" if created else "")


def _refused_fix(install: Installed) -> str:
    modes = (f"~/.ssh is {install.dir_mode:o} and authorized_keys {install.file_mode:o}: "
             if install.loose_modes else "")
    return modes + STRICT_MODES_FIX


def _install(t: Transport, key: LocalKey, timeout: float) -> Installed:
    reply = call_agent(t, "authorize_key", {"key": key.public_line}, timeout=timeout)
    return parse_installed(t.host.name, reply.result)


def _login_works(t: Transport) -> bool:
    result = t.run(["true"], timeout=30)
    if not result.ok:
        raise HostError(t.host.name, HostErrorKind.PROTOCOL,
                        f"the key logs in, but `true` exited {result.exit_code}: {result.tail(3)}",
                        "check the account's login shell (it must run commands)")
    return True


def ssh_setup(hosts: Sequence[Host], options: SetupOptions, passwords: PasswordSource,
              notice: Callable[[str], None] = lambda text: None) -> SetupReport:
    """Create the key if missing, install it on every host that needs SSH, verify key-only login."""
    recorded: list[RecordedHostKey] = []
    lock = threading.Lock()

    def record(key: RecordedHostKey) -> None:
        with lock:
            recorded.append(key)

    secrets: dict[str, str] = {}
    remote = [h for h in hosts if not h.is_local]
    with _pool(options, lambda h: password_login(secrets[h.name]), record) as pool:
        key = ensure_key(options.key)  # after make_pool: a bad --ssh-config creates no key
        if key.created:
            notice(f"created {key.path} ({key.algorithm} {key.fingerprint}) and {key.public_path}")
        if remote:
            secrets.update(passwords(remote))
            notice(f"logging in to {len(remote)} host(s) with the password to add the key")
        installed = pool.map(remote, lambda t: _install(t, key, options.timeout))
    secrets.clear()
    again = [h for h in remote if _worth_verifying(installed, h.name)]
    with _pool(options, lambda h: key_login(key.path), record) as pool:
        if again:
            notice(f"logging in to {len(again)} host(s) with the key alone")
        verified = pool.map(again, _login_works)
    rows = []
    for h in hosts:
        install = _one(installed, h.name)
        verify = _one(verified, h.name)
        rows.append(host_outcome(h, install, verify))
    return SetupReport(key, rows, recorded)


def _pool(options: SetupOptions, login: Callable[[Host], Mapping[str, Any]],
          record: Callable[[RecordedHostKey], None]) -> HostPool:
    """A pool with every command's SSH options, logging in as `login` says."""
    return make_pool(options.connection.recording(record), login=login)


def _worth_verifying(installed: FanOut[Installed], name: str) -> bool:
    """After the key was written, or where only the password was refused (it may already work)."""
    if name in installed.succeeded:
        return installed.succeeded[name].ok
    return installed.failed[name].kind in PASSWORD_REFUSED


def _one(fan: FanOut[T], name: str) -> T | HostError | None:
    if name in fan.failed:
        return fan.failed[name]
    return fan.succeeded.get(name)
