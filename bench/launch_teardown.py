"""Launch overhead and teardown time of `ddpctl up` beside the same launch done by hand over ssh.

For 2 and 8 cluster hosts (1 process each, the toy job):
- launch: from start to every rank's first line (`ARGS` from --echo-args), ddpctl vs parallel
  `ssh host python -m torch.distributed.run ...`;
- teardown after a failure: from the failing rank's error line to the last job process gone;
- teardown after Ctrl-C (SIGINT to ddpctl / to the local ssh clients).
The manual launch is given --cap seconds before it is called a hang (it waits for the gloo
collective timeout, 30 minutes by default). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.cluster import Cluster, start_cluster  # noqa: E402
from tests.ddpctl_run import TOY, ddpctl_argv, write_job  # noqa: E402


class Watch:
    """Reads the merged output of some processes, timestamping the lines that matter."""

    def __init__(self, procs: list[subprocess.Popen[str]]) -> None:
        self.started = time.monotonic()
        self.args_lines = 0
        self.first_all: float | None = None
        self.failed_at: float | None = None
        self.world = 0
        for p in procs:
            threading.Thread(target=self._pump, args=(p,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.monotonic()
            if "ARGS [" in line:
                self.args_lines += 1
                if self.args_lines == self.world:
                    self.first_all = now
            if "injected failure" in line and self.failed_at is None:
                self.failed_at = now


def wait(pred: Callable[[], bool], timeout: float) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return time.monotonic()
        time.sleep(0.02)
    return None


def all_gone(cluster: Cluster, job_id: str) -> bool:
    return all(not cluster.job_pids(i, job_id) for i in range(len(cluster.hosts)))


def manual(cluster: Cluster, job_id: str, args: list[str]) -> list[subprocess.Popen[str]]:
    n = len(cluster.hosts)
    procs = []
    for i, h in enumerate(cluster.hosts):
        remote = ["env", f"DDPCTL_JOB_ID={job_id}", "GLOO_SOCKET_IFNAME=eth0", sys.executable, "-m",
                  "torch.distributed.run", "--nnodes", str(n), "--nproc-per-node", "1", "--node-rank", str(i),
                  "--master-addr", cluster.hosts[0].address, "--master-port", "29660", str(TOY), *args]
        procs.append(subprocess.Popen(["ssh", "-F", str(cluster.ssh_config), h.name, shlex.join(remote)],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    return procs


def via_ddpctl(cluster: Cluster, tmp: Path, name: str, args: list[str]) -> tuple[subprocess.Popen[str], Path]:
    job = write_job(tmp, cluster, name, args, nproc=1, port=29661)
    runs = tmp / "runs" / name
    proc = subprocess.Popen(ddpctl_argv("up", str(job), "--grace", "3", "--runs-dir", str(runs),
                                        "--ssh-config", str(cluster.ssh_config)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return proc, runs


def ddpctl_job_id(runs: Path) -> str:
    wait(lambda: runs.exists() and any(runs.iterdir()), 60)
    return next(runs.iterdir()).name


def kill_manual(cluster: Cluster, procs: list[subprocess.Popen[str]], job_id: str) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    for i in range(len(cluster.hosts)):
        for pid in cluster.job_pids(i, job_id):
            os.kill(pid, signal.SIGKILL)


def run_case(cluster: Cluster, tmp: Path, mode: str, scenario: str, cap: float) -> tuple[float | None, float | None]:
    """(seconds to every rank's first line, seconds from failure/Ctrl-C to the last process gone)."""
    n = len(cluster.hosts)
    args = ["--epochs", "100000", "--steps-delay", "0.2", "--echo-args"]
    if scenario == "failure":
        args += ["--fail-rank", str(n - 1), "--fail-at-step", "3"]
    name = f"{mode}-{scenario}-{n}"
    if mode == "ddpctl":
        proc, runs = via_ddpctl(cluster, tmp, name, args)
        procs = [proc]
    else:
        job_id = f"manual-{name}-{time.time_ns()}"
        procs = manual(cluster, job_id, args)
    watch = Watch(procs)
    watch.world = n
    if mode == "ddpctl":
        job_id = ddpctl_job_id(runs)
    try:
        wait(lambda: watch.first_all is not None, cap)
        launch = None if watch.first_all is None else watch.first_all - watch.started
        if scenario == "failure":
            wait(lambda: watch.failed_at is not None, cap)
            t0 = watch.failed_at
        else:
            t0 = time.monotonic()
            for p in procs:
                p.send_signal(signal.SIGINT)
        gone = wait(lambda: all_gone(cluster, job_id), cap) if t0 is not None else None
        return launch, (gone - t0) if gone is not None and t0 is not None else None
    finally:
        kill_manual(cluster, procs, job_id)


def fmt(v: float | None, cap: float) -> str:
    return f"{v:7.2f}s" if v is not None else f" >{cap:.0f}s (hang)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,8")
    parser.add_argument("--cap", type=float, default=60.0, help="seconds before a wait is called a hang")
    opts = parser.parse_args(argv)
    print(f"{'hosts':>5} {'scenario':>8} {'ddpctl launch':>14} {'manual launch':>14} "
          f"{'overhead':>9} {'ddpctl teardown':>16} {'manual teardown':>16}")
    for n in (int(x) for x in opts.sizes.split(",")):
        with tempfile.TemporaryDirectory() as d, start_cluster(n, Path(d) / "cluster") as cluster:
            for scenario in ("failure", "sigint"):
                d_launch, d_down = run_case(cluster, Path(d), "ddpctl", scenario, opts.cap)
                m_launch, m_down = run_case(cluster, Path(d), "manual", scenario, opts.cap)
                over = f"{(d_launch / m_launch - 1) * 100:+7.1f}%" if d_launch and m_launch else "      ?"
                print(f"{n:>5} {scenario:>8} {fmt(d_launch, opts.cap):>14} {fmt(m_launch, opts.cap):>14} "
                      f"{over:>9} {fmt(d_down, opts.cap):>16} {fmt(m_down, opts.cap):>16}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
