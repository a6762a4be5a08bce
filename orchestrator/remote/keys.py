"""The local key pair `ssh-setup` installs (an Ed25519 pair created when missing, through the
`cryptography` package paramiko uses), and the connect kwargs of its two logins: the password
alone, then that key alone."""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from inventory import ConfigError

DEFAULT_KEY = Path("~/.ssh/id_ed25519")


@dataclass(frozen=True)
class LocalKey:
    """The key pair: its private file, the public line installed on the hosts, its fingerprint."""

    path: Path
    public_line: str  # "ssh-ed25519 AAAA… user@machine"
    algorithm: str  # "ED25519"
    fingerprint: str  # "SHA256:…", as ssh-keygen -l prints it
    created: bool  # this run generated it

    @property
    def public_path(self) -> Path:
        return public_path(self.path)


def public_path(path: Path) -> Path:
    return path.with_name(path.name + ".pub")


def default_comment() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


def ensure_key(path: Path, comment: str | None = None) -> LocalKey:
    """Load the key at `path`, or create an Ed25519 pair there (private 0600, `.pub` beside it)."""
    path = path.expanduser()
    created = not path.exists()
    if created:
        try:
            _generate(path, comment or default_comment())
        except OSError as exc:
            raise ConfigError(f"cannot create {exc.filename or path}: {exc.strerror or exc}", key="--key",
                              hint="pass --key with a path in a directory you can write") from None
    key = _load(path)
    line = f"{key.get_name()} {key.get_base64()}"
    pub = public_path(path)
    if pub.is_file():
        words = pub.read_text().split()
        if words[:2] != line.split():
            raise ConfigError(f"{pub} does not hold the public half of {path}", key="--key",
                              hint=f"rewrite it: ssh-keygen -y -f {path} > {pub}")
        line = " ".join(words[:3])
    else:
        line = f"{line} {comment or default_comment()}"
        pub.write_text(line + "\n")
    return LocalKey(path, line, key.algorithm_name, key.fingerprint, created)


def _generate(path: Path, comment: str) -> None:
    pub = public_path(path)
    if pub.exists():
        raise ConfigError(f"{pub} exists but its private key {path} does not", key="--key",
                          hint=f"move {pub} away, or pass --key with the private key's path")
    if not path.parent.is_dir():
        path.parent.mkdir(mode=0o700, parents=True)
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(pem)
    pub.write_text(f"{public.decode()} {comment}\n")


def _load(path: Path) -> paramiko.PKey:
    if not path.is_file():
        raise ConfigError(f"{path} is not a file", key="--key", hint="pass --key with a private key's path")
    try:
        return paramiko.PKey.from_path(str(path))
    except (paramiko.PasswordRequiredException, TypeError) as exc:  # cryptography: TypeError("…password…")
        if isinstance(exc, TypeError) and "password" not in str(exc).lower():
            raise
        raise ConfigError(f"{path} is passphrase-protected, and ddpctl never asks for a passphrase",
                          key="--key", hint="pass --key with a new path: ssh-setup creates a key there") from None
    except (paramiko.SSHException, ValueError, OSError) as exc:
        raise ConfigError(f"{path} is not a private key ddpctl can read: {exc}", key="--key",
                          hint="pass --key with a new path: ssh-setup creates a key there") from None


def password_login(password: str) -> Mapping[str, Any]:
    """Connect kwargs of a login with `password` alone: no key file, no default keys, no agent."""
    return {"password": password, "key_filename": None, "look_for_keys": False, "allow_agent": False}


def key_login(key: Path) -> Mapping[str, Any]:
    """Connect kwargs of a login with `key` alone: no other key, no agent, no password."""
    return {"key_filename": [str(key)], "look_for_keys": False, "allow_agent": False, "password": None}
