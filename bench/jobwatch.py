"""Shared by bench/chatty_output.py, bench/failfast_backlog.py and bench/host_loss.py: a child
process timed and measured by wait4 (its exit instant, peak RSS, CPU), `ddpctl up` and the manual
recipe started with their output going to files, and the wait for a job's processes to be gone."""

from __future__ import annotations

import contextlib
import os
import pwd
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.cluster import Cluster  # noqa: E402
from tests.cluster_sys import all_netns_pids, kill, pid_alive  # noqa: E402
from tests.ddpctl_run import write_job  # noqa: E402

CHATTY = ROOT / "train_jobs" / "chatty.py"
POLL_S = 0.02  # how often the pids of a job are looked at while it is torn down
RESCAN_S = 0.5  # how often /proc is searched again for job processes started since the last look
DDPCTL_HELP = ("the ddpctl to measure: a directory holding its source tree, or a git revision of this "
               "repository (exported to a temporary directory: e.g. HEAD, to leave uncommitted edits out); "
               "default: this checkout")


class Ddpctl:
    """Which ddpctl source tree `ddpctl up` runs from (`python -m orchestrator` there: the tree's
    orchestrator, node_agent and inventory come before this venv's editable install)."""

    def __init__(self, where: str | None, stack: contextlib.ExitStack) -> None:
        if where is None:
            self.tree, self.label = ROOT, f"this checkout ({ROOT})"
        elif Path(where).is_dir():
            self.tree, self.label = Path(where).resolve(), f"the tree {Path(where).resolve()}"
        else:
            rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{where}^{{commit}}"],
                                 capture_output=True, text=True, check=True).stdout.strip()
            self.tree = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ddpctl-rev-")))
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", str(self.tree)], input=archive.stdout, check=True)
            self.label = f"revision {where} ({rev[:10]}, exported to {self.tree})"

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "orchestrator", *args]

    def env(self) -> dict[str, str]:
        """This environment, as a user's shell has it (as bench/breakdown.py's user_env: bytecode
        written, USER and LOGNAME set), with the tree first on the path."""
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        name = pwd.getpwuid(os.getuid()).pw_name
        env.setdefault("USER", name)
        env.setdefault("LOGNAME", name)
        env["PYTHONPATH"] = os.pathsep.join([str(self.tree), *filter(None, [env.get("PYTHONPATH")])])
        return env

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout, cwd=self.tree,
                              env=self.env(), check=False)


def scratch(stack: contextlib.ExitStack, keep: Path | None) -> tuple[Path, Path]:
    """A scratch directory removed when `stack` closes (clusters go there), and where a run's
    outputs go: `keep` (--keep), made if need be, else the scratch directory itself."""
    scratch_dir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
    out = keep or scratch_dir
    out.mkdir(parents=True, exist_ok=True)
    return scratch_dir, out


def high_water_mib(pid: int) -> float | None:
    """The process's own peak RSS so far (VmHWM: its current program's, after exec)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


class Child:
    """A process started in its own session, reaped by wait4 in a thread: the instant it exited
    (time.time(), hosts share this clock), its exit code, its CPU seconds, and its own peak RSS.
    The peak is read from /proc (VmHWM) while it runs, not taken from wait4: a child started with
    vfork inherits, through exec, the high-water mark of the process that started it (this
    benchmark's, which holds the outputs it checks), and wait4's ru_maxrss reports that."""

    def __init__(self, argv: Sequence[str], out: Path, err: Path | None = None,
                 env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        with out.open("wb") as fo, (err or Path(os.devnull)).open("wb") as fe:
            self.started = time.time()
            self.proc = subprocess.Popen(list(argv), stdout=fo, stderr=subprocess.STDOUT if err is None else fe,
                                         stdin=subprocess.DEVNULL, start_new_session=True, env=env, cwd=cwd)
        self.ended: float | None = None
        self.code: int | None = None
        self.rusage: resource.struct_rusage | None = None
        self.high_water: float | None = None
        self._reaper = threading.Thread(target=self._reap, daemon=True)
        self._reaper.start()
        threading.Thread(target=self._watch_rss, daemon=True).start()

    def _watch_rss(self) -> None:
        while not self.done:
            seen = high_water_mib(self.proc.pid)
            if seen is not None and not self.done:
                self.high_water = max(self.high_water or 0.0, seen)
            time.sleep(0.02)

    def _reap(self) -> None:
        _, status, usage = os.wait4(self.proc.pid, 0)
        self.ended = time.time()
        self.code = os.waitstatus_to_exitcode(status)
        self.rusage = usage
        self.proc.returncode = self.code  # Popen must not wait for it again

    @property
    def done(self) -> bool:
        return self.ended is not None

    def wait(self, timeout: float) -> bool:
        self._reaper.join(timeout)
        return self.done

    @property
    def wall(self) -> float | None:
        return None if self.ended is None else self.ended - self.started

    @property
    def peak_rss_mib(self) -> float | None:
        return self.high_water

    @property
    def cpu_s(self) -> float | None:
        return None if self.rusage is None else self.rusage.ru_utime + self.rusage.ru_stime

    def kill(self) -> None:
        if not self.done:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.wait(10)


def start_ddpctl(ddpctl: Ddpctl, cluster: Cluster, tmp: Path, name: str, port: int, args: Sequence[str], *,
                 script: Path = CHATTY, nproc: int = 2, flags: Sequence[str] = ()) -> tuple[Child, Path]:
    """`ddpctl up job.toml` (stdout to <tmp>/<name>.out, stderr to .err); returns it and its runs dir."""
    job = write_job(tmp, cluster, name, list(args), script=script, nproc=nproc, port=port)
    runs = tmp / "runs" / name
    argv = ddpctl.argv("up", str(job), "--grace", "3", "--runs-dir", str(runs),
                       "--ssh-config", str(cluster.ssh_config), *flags)
    return Child(argv, tmp / f"{name}.out", tmp / f"{name}.err", env=ddpctl.env(), cwd=ddpctl.tree), runs


def start_manual(cluster: Cluster, tmp: Path, name: str, job_id: str, port: int, args: Sequence[str], *,
                 script: Path = CHATTY, nproc: int = 2) -> list[Child]:
    """The recipe by hand: `ssh host torchrun ...` on every host at once, the same torchrun command
    line as ddpctl's (--max-restarts 0 --tee 3), each ssh's output to <tmp>/<name>.<host>.out."""
    n = len(cluster.hosts)
    children = []
    for i, h in enumerate(cluster.hosts):
        remote = ["env", f"DDPCTL_JOB_ID={job_id}", "GLOO_SOCKET_IFNAME=eth0", sys.executable, "-m",
                  "torch.distributed.run", "--nnodes", str(n), "--nproc-per-node", str(nproc),
                  "--node-rank", str(i), "--master-addr", cluster.hosts[0].address, "--master-port", str(port),
                  "--max-restarts", "0", "--tee", "3", str(script), *args]
        children.append(Child(["ssh", "-F", str(cluster.ssh_config), h.name, shlex.join(remote)],
                              tmp / f"{name}.{h.name}.out"))
    return children


def wait_until(pred: Callable[[], bool], timeout: float, every: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(every)


def job_id_of(runs: Path, child: Child, timeout: float) -> str | None:
    """The job id ddpctl chose: the name of its run directory (None: it never made one)."""
    wait_until(lambda: (runs.exists() and any(runs.iterdir())) or child.done, timeout, 0.02)
    found = sorted(p.name for p in runs.iterdir()) if runs.exists() else []
    return found[0] if found else None


def job_pids(cluster: Cluster, hosts: Sequence[int], job_id: str) -> set[int]:
    """Pids on these hosts whose environment holds DDPCTL_JOB_ID=<job_id>: one pass over /proc."""
    needle = f"DDPCTL_JOB_ID={job_id}".encode()
    found: set[int] = set()
    spaces = all_netns_pids([cluster.hosts[i].netns for i in hosts])
    for pids in spaces.values():
        for pid in pids:
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if needle in environ:
                found.add(pid)
    return found


class GoneWatch:
    """Watches a job's processes on some hosts: `poll()` is True once none is left, and `at` says
    when (time.time()). Polls the known pids (cheap), searches /proc for new ones every RESCAN_S
    and once more before saying gone."""

    def __init__(self, cluster: Cluster, hosts: Sequence[int], job_id: str, known: set[int] | None = None) -> None:
        self.cluster, self.hosts, self.job_id = cluster, list(hosts), job_id
        self.pids = set(known or ()) | job_pids(cluster, self.hosts, job_id)
        self.next_scan = time.monotonic() + RESCAN_S
        self.at: float | None = None

    def poll(self) -> bool:
        if self.at is not None:
            return True
        self.pids = {p for p in self.pids if pid_alive(p)}
        if not self.pids:
            gone = time.time()
            self.pids = job_pids(self.cluster, self.hosts, self.job_id)
            if not self.pids:
                self.at = gone
                return True
        if time.monotonic() >= self.next_scan:
            self.pids |= job_pids(self.cluster, self.hosts, self.job_id)
            self.next_scan = time.monotonic() + RESCAN_S
        return False


def wait_gone(cluster: Cluster, hosts: Sequence[int], job_id: str, timeout: float,
              known: set[int] | None = None) -> float | None:
    """time.time() when no job process is left on these hosts (None: some still ran after `timeout`)."""
    watch = GoneWatch(cluster, hosts, job_id, known)
    deadline = time.monotonic() + timeout
    while not watch.poll():
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_S)
    return watch.at


def kill_job(cluster: Cluster, children: Sequence[Child], job_id: str | None) -> None:
    """End what a run left: its launcher processes (their sessions) and its job's processes."""
    for c in children:
        c.kill()
    if job_id is not None:
        for pid in job_pids(cluster, range(len(cluster.hosts)), job_id):
            kill(pid, signal.SIGKILL)


def median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def secs(v: float | None, cap: float | None = None) -> str:
    if v is None:
        return f">{cap:.0f}s" if cap is not None else "?"
    return f"{v:.2f}s"
