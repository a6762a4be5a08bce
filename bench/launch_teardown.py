"""`ddpctl up` beside the same torchrun started by hand over ssh, on a real namespace cluster.

For each size (default 2, 4, 8 hosts; one process per host, the toy job), --runs times, ddpctl and
the manual recipe interleaved:
- a short job's wall time (the toy's 2 epochs): `ddpctl up job.toml` vs parallel
  `ssh host python -m torch.distributed.run --node-rank i ...`, the ratio per run (target <= 1.10
  up to 8 hosts, <= 0.90 at 16 and 32);
- teardown after a failure: from the instant the failing rank raises (the toy prints it, on the
  rank's own clock) to the last job process gone on every host (target <= 1.0 s at 4 hosts,
  <= 2.0 s at 8, <= 1.5 s at 16, <= 2.5 s at 32). The manual recipe is given --cap seconds before
  it is called a hang (gloo waits 30 minutes by default). At 32 hosts the manual teardown alone
  takes about 35 s a run: pass --cap 240 so its short job is not called a hang.

Then where a launch's seconds go, measured on the same cluster: ddpctl's own start-up, the SSH
handshakes, one exec over an open connection (the login shell's rc files), one node-agent round
trip, the pre-launch round trip, and the phases of the ddpctl runs above (from its output).
Prints figures (medians); asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.breakdown import fixed_costs, print_costs, user_env  # noqa: E402
from inventory import load_job  # noqa: E402
from orchestrator.launch.preflight import gather  # noqa: E402
from tests.cluster import Cluster, start_cluster  # noqa: E402
from tests.ddpctl_run import TOY, ddpctl_argv, write_job  # noqa: E402

FAIL_ARGS = ["--epochs", "100000", "--steps-delay", "0.2"]
RAISED = "raising the injected failure at unix time "  # the toy's line, on the failing rank's clock
MARKS = {  # ddpctl's own lines that end a phase of its launch
    "checked": "pre-launch checks passed",
    "running": " running",
}


@dataclass
class Watch:
    """The merged output of some processes, each line timestamped from `started`."""

    procs: list[subprocess.Popen[str]]
    started: float = field(default_factory=time.monotonic)
    lines: list[tuple[float, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.pumps = [threading.Thread(target=self._pump, args=(p,), daemon=True) for p in self.procs]
        for t in self.pumps:
            t.start()

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self.lock:
                self.lines.append((time.monotonic() - self.started, line.rstrip("\n")))

    def first(self, text: str) -> float | None:
        with self.lock:
            return next((t for t, line in self.lines if text in line), None)

    def last(self, text: str) -> float | None:
        with self.lock:
            return max((t for t, line in self.lines if text in line), default=None)

    def count(self, text: str) -> int:
        with self.lock:
            return sum(text in line for _, line in self.lines)


def wait(pred: Callable[[], bool], timeout: float) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return time.monotonic()
        time.sleep(0.005)
    return None


def alive(pid: int) -> bool:
    """Running (a zombie is gone: it only waits for its parent to read its exit status)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def all_gone(cluster: Cluster, job_id: str) -> bool:
    return all(not cluster.job_pids(i, job_id) for i in range(len(cluster.hosts)))


def manual(cluster: Cluster, job_id: str, port: int, args: list[str]) -> list[subprocess.Popen[str]]:
    """The recipe by hand: one `ssh host torchrun ...` per host, all at once."""
    n = len(cluster.hosts)
    procs = []
    for i, h in enumerate(cluster.hosts):
        remote = ["env", f"DDPCTL_JOB_ID={job_id}", "GLOO_SOCKET_IFNAME=eth0", sys.executable, "-m",
                  "torch.distributed.run", "--nnodes", str(n), "--nproc-per-node", "1", "--node-rank", str(i),
                  "--master-addr", cluster.hosts[0].address, "--master-port", str(port), str(TOY), *args]
        procs.append(subprocess.Popen(["ssh", "-F", str(cluster.ssh_config), h.name, shlex.join(remote)],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    return procs


def via_ddpctl(cluster: Cluster, tmp: Path, name: str, port: int, args: list[str],
               tree: Path | None = None) -> tuple[subprocess.Popen[str], Path]:
    """`ddpctl up` of the toy job; `tree`: run that ddpctl source tree's (default: this one's)."""
    job = write_job(tmp, cluster, name, args, nproc=1, port=port)
    runs = tmp / "runs" / name
    argv = ddpctl_argv("up", str(job), "--grace", "3", "--runs-dir", str(runs), "--ssh-config", str(cluster.ssh_config))
    env = user_env()
    if tree is not None:  # -P: the tree on PYTHONPATH comes first, not the working directory
        argv, env = [argv[0], "-P", *argv[1:]], {**env, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=env)
    return proc, runs


def ddpctl_job_id(runs: Path, cap: float) -> str:
    wait(lambda: runs.exists() and any(runs.iterdir()), cap)
    return next(runs.iterdir()).name


def kill_all(cluster: Cluster, procs: list[subprocess.Popen[str]], job_id: str) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    for i in range(len(cluster.hosts)):
        for pid in cluster.job_pids(i, job_id):
            os.kill(pid, signal.SIGKILL)


class Runner:
    """One cluster, runs of either launcher; every run gets its own job id and master port."""

    def __init__(self, cluster: Cluster, tmp: Path, cap: float, trees: dict[str, Path] | None = None) -> None:
        self.cluster, self.tmp, self.cap = cluster, tmp, cap
        self.trees = trees or {}  # another mode than "ddpctl" and "manual": `ddpctl up` of that tree
        self.serial = 0

    def _start(self, mode: str, args: list[str]) -> tuple[list[subprocess.Popen[str]], Callable[[], str]]:
        self.serial += 1
        port = 29700 + self.serial
        name = f"{mode}-{len(self.cluster.hosts)}-{self.serial}"
        if mode == "ddpctl" or mode in self.trees:
            proc, runs = via_ddpctl(self.cluster, self.tmp, name, port, args, self.trees.get(mode))
            return [proc], lambda: ddpctl_job_id(runs, self.cap)
        job_id = f"manual-{name}-{time.time_ns()}"
        return manual(self.cluster, job_id, port, args), lambda: job_id

    def short(self, mode: str) -> tuple[float | None, Watch]:
        """Wall time of the toy job run to its end (None: it failed or ran past the cap)."""
        procs, job_id = self._start(mode, [])
        watch = Watch(procs)
        ids = job_id()
        try:
            done = wait(lambda: all(p.poll() is not None for p in procs), self.cap)
            ok = done is not None and all(p.returncode == 0 for p in procs)
            return (done - watch.started if ok and done is not None else None), watch
        finally:
            kill_all(self.cluster, procs, ids)

    def failure(self, mode: str) -> float | None:
        """Seconds from the failing rank's raise to the last job process gone (None: a hang)."""
        n = len(self.cluster.hosts)
        procs, job_id = self._start(mode, [*FAIL_ARGS, "--fail-rank", str(n - 1), "--fail-at-step", "3"])
        watch = Watch(procs)
        ids = job_id()
        try:
            if wait(lambda: watch.first(RAISED) is not None, self.cap) is None:
                return None
            pids = [p for i in range(n) for p in self.cluster.job_pids(i, ids)]  # polled cheaply below
            if wait(lambda: not any(alive(p) for p in pids), self.cap) is None:
                return None
            gone = time.time()
            if not all_gone(self.cluster, ids):
                return None  # one started after the snapshot still runs: count it as a hang
            with watch.lock:
                line = next(text for _, text in watch.lines if RAISED in text)
            return gone - float(line.rsplit(RAISED, 1)[1].split()[0])
        finally:
            kill_all(self.cluster, procs, ids)


def phases(watch: Watch, n: int) -> dict[str, float]:
    """Where a ddpctl launch's wall time went, from its own output lines."""
    checked, running = watch.first(MARKS["checked"]), watch.last(MARKS["running"])
    first_rank, last_line = watch.first("epoch=0"), watch.last("params_identical")
    end = max((t for t, _ in watch.lines), default=None)
    if None in (checked, running, first_rank, last_line, end) or watch.count(MARKS["running"]) < n:
        return {}
    assert checked is not None and running is not None and first_rank is not None
    assert last_line is not None and end is not None
    return {"start-up, connect, pre-launch checks": checked, "checks -> torchrun on every host": running - checked,
            "torchrun -> first step": first_rank - running, "training": last_line - first_rank,
            "last line -> exit": end - last_line}


def fmt(v: float | None, cap: float) -> str:
    return f"{v:6.2f}s" if v is not None else f">{cap:.0f}s"


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def targets(n: int) -> tuple[str, str]:
    """The job ratio's and the teardown's targets at n hosts (issue 15 up to 8 hosts, 26 beyond)."""
    if n <= 8:
        return "<= 1.10", "<= 1.0s" if n <= 4 else "<= 2.0s"
    return "<= 0.90", "<= 1.5s" if n <= 16 else "<= 2.5s"


def front(cluster: Cluster, tmp: Path, runs: int) -> dict[str, float]:
    """The launch's fixed costs, each alone (bench/breakdown.py), the pre-launch round trip last."""
    job = load_job(write_job(tmp, cluster, "front", nproc=1, port=29699))
    return fixed_costs(cluster.ssh_config, job.hosts, runs,
                       ("pre-launch round trip (facts, probe, checks)", lambda pool: gather(job, pool, checks=True)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,4,8")
    parser.add_argument("--runs", type=int, default=3, help="interleaved runs per figure (median)")
    parser.add_argument("--cap", type=float, default=60.0, help="seconds before a wait is called a hang")
    opts = parser.parse_args(argv)
    print(f"{'hosts':>5} {'ddpctl job':>10} {'manual job':>10} {'ratio':>6} {'(target)':>8}   "
          f"{'ddpctl teardown':>15} {'manual teardown':>15} {'(target)':>8}", flush=True)
    breakdowns: dict[int, tuple[dict[str, float], dict[str, float]]] = {}
    for n in (int(x) for x in opts.sizes.split(",")):
        with tempfile.TemporaryDirectory() as d, start_cluster(n, Path(d) / "cluster") as cluster:
            runner = Runner(cluster, Path(d), opts.cap)
            jobs: dict[str, list[float | None]] = {"ddpctl": [], "manual": []}
            downs: dict[str, list[float | None]] = {"ddpctl": [], "manual": []}
            ratios: list[float] = []
            split: dict[str, list[float]] = {}
            for i in range(opts.runs):
                order = ("ddpctl", "manual") if i % 2 == 0 else ("manual", "ddpctl")
                took: dict[str, float | None] = {}
                for mode in order:
                    took[mode], watch = runner.short(mode)
                    jobs[mode].append(took[mode])
                    if mode == "ddpctl":
                        for k, v in phases(watch, n).items():
                            split.setdefault(k, []).append(v)
                d_took, m_took = took["ddpctl"], took["manual"]
                if d_took is not None and m_took is not None:
                    ratios.append(d_took / m_took)
                for mode in order:
                    downs[mode].append(runner.failure(mode))
            ratio = statistics.median(ratios) if ratios else None
            job_target, target = targets(n)
            print(f"{n:>5} {fmt(median(jobs['ddpctl']), opts.cap):>10} {fmt(median(jobs['manual']), opts.cap):>10} "
                  f"{(f'{ratio:.2f}' if ratio else '?'):>6} {job_target:>8}   "
                  f"{fmt(median(downs['ddpctl']), opts.cap):>15} {fmt(median(downs['manual']), opts.cap):>15} "
                  f"{target:>8}", flush=True)
            print(f"      ratios {', '.join(f'{r:.2f}' for r in ratios)}; ddpctl teardowns "
                  f"{', '.join(fmt(v, opts.cap) for v in downs['ddpctl'])}", flush=True)
            breakdowns[n] = ({k: statistics.median(v) for k, v in split.items()}, front(cluster, Path(d), opts.runs))
    for n, (split_n, front_n) in breakdowns.items():
        print_costs(f"\nwhere the seconds of `ddpctl up` go at {n} hosts (medians, from its output)", split_n)
        print_costs("and each fixed cost alone", front_n)
    print("\nddpctl runs without PYTHONDONTWRITEBYTECODE, which this machine sets (bench/breakdown.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
