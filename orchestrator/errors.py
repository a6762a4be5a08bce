"""Errors that name a host, what went wrong and the fix; the CLI renders them without traceback."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class HostErrorKind(str, enum.Enum):
    UNREACHABLE = "unreachable"  # no route to host, or no answer in time: host/link down, wrong address
    SSHD_DOWN = "sshd_down"  # connection refused on the SSH port: the host is up, sshd does not listen
    UNRESOLVED = "unresolved"  # name does not resolve
    UNKNOWN_HOST_KEY = "unknown_host_key"
    CHANGED_HOST_KEY = "changed_host_key"
    AUTH = "auth"  # keys were offered and refused: passwordless SSH not set up for them
    NO_KEY = "no_key"  # no key to offer: no IdentityFile, ssh-agent key or default key found
    WRONG_PASSWORD = "wrong_password"  # a password login (ssh-setup) was refused
    PASSWORD_DISABLED = "password_disabled"  # sshd allows no password login for this user
    TIMEOUT = "timeout"  # a command ran past its deadline
    LOST = "lost"  # the connection died while a command ran
    AGENT = "agent"  # the node agent could not run or answered garbage
    PROTOCOL = "protocol"
    SLURM = "slurm"  # a Slurm command is missing or refused the request
    SYNC = "sync"  # copying the job's source to the host failed


@dataclass
class HostError(Exception):
    """Something failed on (or on the way to) one host."""

    host: str
    kind: HostErrorKind
    message: str
    fix: str = ""

    def __str__(self) -> str:
        text = f"{self.host}: {self.message}"
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text

    def to_json(self) -> dict[str, str]:
        return {"host": self.host, "kind": self.kind.value, "message": self.message, "fix": self.fix}


class LaunchBlocked(Exception):
    """The launch cannot start (a busy master port, ...); the message names the host and the fix."""


@dataclass
class HostsFailed(Exception):
    """Several hosts failed the same step; each error names its host and fix."""

    step: str
    errors: list[HostError]

    def __str__(self) -> str:
        return f"{self.step} failed on {len(self.errors)} host(s):\n" + "\n".join(str(e) for e in self.errors)
