"""Where a command's fixed seconds go on a cluster, each cost measured alone (median of `runs`):
ddpctl's own start-up, the SSH handshakes, one exec over an open connection (which pays the
login shell's rc files on every host), one node-agent round trip (shipping its code, starting
Python there), and the command's own round trip (`last`). Shared by the benchmarks."""

from __future__ import annotations

import os
import pwd
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from inventory import Host  # noqa: E402
from orchestrator.remote.agent import call_agent  # noqa: E402
from orchestrator.remote.pool import HostPool, make_pool  # noqa: E402
from orchestrator.remote.ssh import SshTransport  # noqa: E402
from orchestrator.remote.ssh_options import Connection, SshOptions  # noqa: E402
from tests.ddpctl_run import ddpctl_argv  # noqa: E402


def user_env() -> dict[str, str]:
    """This environment, as a user's shell has it: this machine sets PYTHONDONTWRITEBYTECODE=1,
    which makes every ddpctl start compile its own sources again (about 0.15 s); a user's Python
    writes bytecode on first run, and pip compiles it at install. And a login session has USER and
    LOGNAME (login and sshd set them), which this machine's commands run without: paramiko asks
    getpass.getuser() for every ssh_config block at every lookup, and without them each answer is
    a passwd lookup (about 1 ms per host connected, on a 16-host config)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    name = pwd.getpwuid(os.getuid()).pw_name
    env.setdefault("USER", name)
    env.setdefault("LOGNAME", name)
    return env


def host_python(where: Path) -> Path:
    """An interpreter as a cluster host has one: this one's packages (torch among them) but not
    ddpctl, which hosts never install (the agent is shipped). This machine's venv has ddpctl as an
    editable install, whose finder every Python start there imports (~10 ms, pathlib and more):
    a cost of this checkout, not of a host. A venv whose one .pth names this site-packages."""
    import site
    import venv

    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (where / "lib" / version / "site-packages" / "host-packages.pth").write_text(
        "\n".join(site.getsitepackages()) + "\n")
    return where / "bin" / "python"


def fixed_costs(ssh_config: Path, hosts: Sequence[Host], runs: int,
                last: tuple[str, Callable[[HostPool], object]]) -> dict[str, float]:
    """Each fixed cost of a command alone: seconds, medians over `runs`."""
    subprocess.run(ddpctl_argv("--help"), capture_output=True, check=True, env=user_env())  # bytecode
    out: dict[str, list[float]] = {}

    def timed(key: str, fn: Callable[[], object]) -> None:
        t0 = time.monotonic()
        fn()
        out.setdefault(key, []).append(time.monotonic() - t0)

    def connect(transport: object) -> object:
        assert isinstance(transport, SshTransport)
        return transport.connection()

    for _ in range(runs):
        timed("ddpctl start-up (python, imports: `ddpctl --help`)",
              lambda: subprocess.run(ddpctl_argv("--help"), capture_output=True, check=True, env=user_env()))
        with make_pool(Connection(SshOptions(ssh_config=ssh_config))) as pool:
            timed("SSH handshakes, all hosts at once (paramiko)", lambda: pool.map(hosts, connect))
            timed("one exec per host: `true` (the login shell's rc)",
                  lambda: pool.map(hosts, lambda t: t.run(["true"], timeout=30)))
            timed("one node-agent round trip per host (ship, start)",
                  lambda: pool.map(hosts, lambda t: call_agent(t, "ping", timeout=30)))
            timed(last[0], lambda: last[1](pool))
    return {k: statistics.median(v) for k, v in out.items()}


def print_costs(title: str, costs: dict[str, float]) -> None:
    print(title)
    for k, v in costs.items():
        print(f"  {k:<56} {v:6.2f}s")
