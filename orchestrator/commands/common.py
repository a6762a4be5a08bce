"""Options and error rendering shared by every command."""

from __future__ import annotations

import contextlib
import enum
import functools
import inspect
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from inventory import ConfigError
from orchestrator.errors import HostError, HostsFailed, LaunchBlocked
from orchestrator.remote.ssh_options import DEFAULT_PARALLEL, Connection, SshOptions

err_console = Console(stderr=True, highlight=False, soft_wrap=True)
# Piped output (logs, CI) is not cut at 80 columns: tables of hosts x checks need room.
console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)

F = TypeVar("F", bound=Callable[..., Any])

class BackendChoice(str, enum.Enum):
    ssh = "ssh"
    slurm = "slurm"


MAX_GRACE_S = 3600.0
GraceOpt = Annotated[float, typer.Option("--grace", min=0, max=MAX_GRACE_S,
                                         help="Seconds between SIGTERM and SIGKILL.")]
SshConfigOpt = Annotated[
    Path | None, typer.Option("--ssh-config", help="OpenSSH config file (default ~/.ssh/config).",
                              exists=False, dir_okay=False, rich_help_panel="SSH")]
KnownHostsOpt = Annotated[
    list[Path] | None, typer.Option("--known-hosts", help="Extra known_hosts file (repeatable).",
                                    rich_help_panel="SSH")]
AcceptNewOpt = Annotated[
    bool, typer.Option("--accept-new-host-keys",
                       help="Record unknown host keys (like StrictHostKeyChecking=accept-new); "
                            "changed keys are still refused.", rich_help_panel="SSH")]
ParallelOpt = Annotated[
    int, typer.Option("--parallel", min=1, help="Hosts contacted at once.", rich_help_panel="SSH")]
ConnectTimeoutOpt = Annotated[
    float, typer.Option("--connect-timeout", min=0.5, help="Seconds to wait for each SSH connection.",
                        rich_help_panel="SSH")]

def ssh_flags(connect_timeout: float | None = 10.0) -> Callable[[F], F]:
    """Give a command the SSH flags, declared here once (--ssh-config, --known-hosts,
    --accept-new-host-keys, --parallel and, unless `connect_timeout` is None, --connect-timeout
    with that default), in place of its `connection` parameter, which receives them as one
    Connection."""
    flags = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=kind)
             for name, kind, default in (("ssh_config", SshConfigOpt, None), ("known_hosts", KnownHostsOpt, None),
                                         ("accept_new_host_keys", AcceptNewOpt, False),
                                         ("parallel", ParallelOpt, DEFAULT_PARALLEL),
                                         ("connect_timeout", ConnectTimeoutOpt, connect_timeout))
             if name != "connect_timeout" or connect_timeout is not None]

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def with_connection(*args: Any, ssh_config: Path | None = None, known_hosts: list[Path] | None = None,
                            accept_new_host_keys: bool = False, parallel: int = DEFAULT_PARALLEL,
                            connect_timeout: float = 10.0, **kwargs: Any) -> Any:
            ssh = SshOptions(ssh_config=ssh_config, known_hosts=tuple(known_hosts or ()),
                             accept_new_host_keys=accept_new_host_keys, connect_timeout=connect_timeout)
            return command(*args, connection=Connection(ssh, parallel), **kwargs)

        signature = inspect.signature(command, eval_str=True)
        params = list(signature.parameters.values())
        at = [p.name for p in params].index("connection")
        with_connection.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[*params[:at], *flags, *params[at + 1:]])
        return with_connection  # type: ignore[return-value]

    return decorate


InventoryOpt = Annotated[
    Path | None, typer.Option("--inventory", "-i", help="Inventory: hosts.toml or an MPI/DeepSpeed hostfile.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def print_config_error(exc: ConfigError) -> None:
    where = f"{exc.location()}: " if exc.location() else ""
    err_console.print(f"[bold red]error:[/] {escape(where + exc.message)}", highlight=False)
    if exc.hint:
        err_console.print(f"  [bold]fix:[/] {escape(exc.hint)}", highlight=False)


def print_host_error(exc: HostError) -> None:
    err_console.print(f"[bold red]error:[/] {escape(exc.host + ': ' + exc.message)}", highlight=False)
    if exc.fix:
        err_console.print(f"  [bold]fix:[/] {escape(exc.fix)}", highlight=False)


@contextlib.contextmanager
def writing(path: Path, flag: str, example: str) -> Iterator[None]:
    """An OSError while writing `path` (a command's output file) -> a ConfigError naming the flag and the path."""
    try:
        yield
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}", key=flag,
                          hint=f"name a file in a folder that exists and you can write: {example}") from None


def handle_errors(func: F) -> F:
    """Bad input -> exit 2, a host failure or a blocked launch -> exit 1; never a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ConfigError as exc:
            print_config_error(exc)
            raise typer.Exit(2) from None
        except HostError as exc:
            print_host_error(exc)
            raise typer.Exit(1) from None
        except HostsFailed as exc:
            err_console.print(f"[bold red]error:[/] {escape(exc.step)} failed on {len(exc.errors)} host(s)")
            for err in exc.errors:
                print_host_error(err)
            raise typer.Exit(1) from None
        except LaunchBlocked as exc:
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            err_console.print("interrupted")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def is_terminal() -> bool:
    return sys.stdout.isatty()
