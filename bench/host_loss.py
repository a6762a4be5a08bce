"""A host's death and a partition: how fast `ddpctl up` ends a job when a host goes, on a real namespace cluster.

3 hosts (--hosts), a long toy training job (train_jobs/toy/train.py --epochs 100000 --steps-delay
0.1, --nproc ranks per host) started by `ddpctl up --grace 3`; once it trains, the last host
(node2) goes, --runs times each way:
(a) death: every process of node2's namespace is SIGKILLed, its sshd included (as a power cut: the
    kernel still answers for its addresses, so the peers' TCP connections are reset, not silent).
    Measured from the kill: every job process on the other hosts gone, and `ddpctl up` exited
    (target: both <= 2 s). node2's sshd is started again for the next run.
(b) partition: node2's link is cut (Cluster.link_down: packets vanish). Measured from the cut:
    `ddpctl up` exited (target <= lost_after + 5 s), every job process on the other hosts gone, and,
    the link still down, node2's own supervisor stopping its ranks (its job processes gone). Meanwhile
    `ddpctl top JOB --once --connect-timeout 2`, started at the cut, answers naming node2 unreachable:
    its wall time (tests/integration/test_top_cluster.py asserts the answer, not how soon). The
    link comes back for the next run.
lost_after is the silence after which the controller calls a host lost: `--lost-after` (default
10) is passed where ddpctl accepts it; where it does not (exit 2, "No such option"), ddpctl runs
with its fixed limit, which is printed. A missed target is a figure, not a failure: the exit code
is non-zero only when a measurement broke (the job never trained, ddpctl refused to start).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.jobwatch import (  # noqa: E402
    DDPCTL_HELP,
    POLL_S,
    Child,
    Ddpctl,
    GoneWatch,
    job_id_of,
    kill_job,
    median,
    scratch,
    secs,
    start_ddpctl,
    wait_until,
)
from tests.cluster import Cluster, start_cluster  # noqa: E402
from tests.cluster_sys import kill_netns  # noqa: E402
from tests.ddpctl_run import TOY, write_job  # noqa: E402

TOY_ARGS = ["--epochs", "100000", "--steps-delay", "0.1"]
DEATH_TARGET_S = 2.0
PARTITION_SLACK_S = 5.0


def lost_after_in_effect(ddpctl: Ddpctl, cluster: Cluster, tmp: Path, wanted: float) -> tuple[list[str], float, str]:
    """The flags to pass, the limit that applies and how it was chosen: `--lost-after` where this
    ddpctl takes it (a dry run tells), else its fixed LOST_AFTER."""
    job = write_job(tmp, cluster, "probe-lost-after", TOY_ARGS, script=TOY, nproc=1, port=29990)
    probe = ddpctl.run("up", str(job), "--lost-after", f"{wanted:g}", "--dry-run", "--runs-dir", str(tmp / "probe"),
                       "--ssh-config", str(cluster.ssh_config))
    if not (probe.returncode == 2 and "No such option" in probe.stdout + probe.stderr):
        return ["--lost-after", f"{wanted:g}"], wanted, f"--lost-after {wanted:g} (accepted)"
    read = subprocess.run([sys.executable, "-c", "from orchestrator.launch.backends.base import LOST_AFTER; "
                           "print(LOST_AFTER)"], capture_output=True, text=True, cwd=ddpctl.tree, env=ddpctl.env(),
                          check=False)
    try:
        limit = float(read.stdout.strip())
    except ValueError:
        limit = 15.0
    return [], limit, f"ddpctl has no --lost-after (exit 2, No such option): its fixed limit {limit:g}s applies"


@dataclass
class Started:
    child: Child
    job_id: str | None
    runs: Path
    out: Path
    broken: str = ""


def start_training(ddpctl: Ddpctl, cluster: Cluster, tmp: Path, name: str, port: int, flags: list[str],
                   opts: argparse.Namespace) -> Started:
    child, runs = start_ddpctl(ddpctl, cluster, tmp, name, port, TOY_ARGS, script=TOY, nproc=opts.nproc, flags=flags)
    out = tmp / f"{name}.out"
    job_id = job_id_of(runs, child, opts.cap)
    s = Started(child, job_id, runs, out)
    if job_id is None or not wait_until(lambda: "epoch=" in out.read_text(errors="replace") or child.done,
                                        opts.cap, 0.1) or child.done:
        err = (tmp / f"{name}.err").read_text(errors="replace")[-1500:]
        s.broken = f"the job never trained (ddpctl exit {child.code}): {err}"
    return s


def first_failure(s: Started) -> str | None:
    summary = s.runs / (s.job_id or "?") / "summary.json"
    return json.loads(summary.read_text()).get("first_failure") if summary.exists() else None


@dataclass
class Death:
    others_gone: float | None = None
    exited: float | None = None
    code: int | None = None
    first: str | None = None
    broken: str = ""

    @property
    def both(self) -> float | None:
        return None if self.others_gone is None or self.exited is None else max(self.others_gone, self.exited)


def death(ddpctl: Ddpctl, cluster: Cluster, tmp: Path, serial: int, flags: list[str],
          opts: argparse.Namespace) -> Death:
    victim = len(cluster.hosts) - 1
    others = list(range(victim))
    s = start_training(ddpctl, cluster, tmp, f"death-{serial}", 29700 + serial, flags, opts)
    try:
        if s.broken or s.job_id is None:
            return Death(broken=s.broken)
        watch = GoneWatch(cluster, others, s.job_id)
        t0 = time.time()
        kill_netns([cluster.hosts[victim].netns])  # this namespace's pids only, until none is left
        deadline = time.monotonic() + opts.cap
        while not (watch.poll() and s.child.done) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return Death(None if watch.at is None else watch.at - t0,
                     None if s.child.ended is None else s.child.ended - t0, s.child.code, first_failure(s))
    finally:
        kill_job(cluster, [s.child], s.job_id)
        cluster.start_sshd(victim)


@dataclass
class Partition:
    exited: float | None = None
    others_gone: float | None = None
    victim_gone: float | None = None
    code: int | None = None
    first: str | None = None
    broken: str = ""
    top: float | None = None  # `ddpctl top --once`, started at the cut: its wall time


def timed_top(ddpctl: Ddpctl, cluster: Cluster, job_id: str, into: list[float]) -> threading.Thread:
    """`ddpctl top JOB --once` in a thread, its wall time appended to `into` once it answers."""
    def run() -> None:
        started = time.monotonic()
        ddpctl.run("top", job_id, "-i", str(cluster.hosts_toml), "--once", "--json", "--interval", "0.5",
                   "--connect-timeout", "2", "--ssh-config", str(cluster.ssh_config), timeout=120)
        into.append(time.monotonic() - started)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def partition(ddpctl: Ddpctl, cluster: Cluster, tmp: Path, serial: int, flags: list[str], lost_after: float,
              opts: argparse.Namespace) -> Partition:
    victim = len(cluster.hosts) - 1
    others = list(range(victim))
    s = start_training(ddpctl, cluster, tmp, f"partition-{serial}", 29800 + serial, flags, opts)
    cut = False
    try:
        if s.broken or s.job_id is None:
            return Partition(broken=s.broken)
        watch_others = GoneWatch(cluster, others, s.job_id)
        watch_victim = GoneWatch(cluster, [victim], s.job_id)
        t0 = time.time()
        cluster.link_down(victim)
        cut = True
        top: list[float] = []
        topping = timed_top(ddpctl, cluster, s.job_id, top)
        deadline = time.monotonic() + lost_after + opts.cap
        while time.monotonic() < deadline:
            done = [watch_others.poll(), watch_victim.poll(), s.child.done]
            if all(done):
                break
            time.sleep(POLL_S)
        topping.join(opts.cap)
        return Partition(None if s.child.ended is None else s.child.ended - t0,
                         None if watch_others.at is None else watch_others.at - t0,
                         None if watch_victim.at is None else watch_victim.at - t0, s.child.code, first_failure(s),
                         top=top[0] if top else None)
    finally:
        kill_job(cluster, [s.child], s.job_id)
        if cut:
            cluster.link_up(victim)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="runs of each scenario")
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=1, help="ranks per host")
    parser.add_argument("--lost-after", type=float, default=10.0, help="passed to ddpctl where it takes it")
    parser.add_argument("--only", choices=["death", "partition"], default=None, help="run one scenario only")
    parser.add_argument("--cap", type=float, default=60.0,
                        help="seconds before a wait is called a hang (the partition: lost_after + this)")
    parser.add_argument("--keep", type=Path, default=None, help="keep the outputs in this directory")
    parser.add_argument("--ddpctl", default=None, metavar="TREE_OR_REV", help=DDPCTL_HELP)
    opts = parser.parse_args(argv)
    if opts.hosts < 2:
        parser.error("--hosts: at least 2 (one goes, the others are watched)")
    deaths: list[Death] = []
    parts: list[Partition] = []
    with contextlib.ExitStack() as stack:
        ddpctl = Ddpctl(opts.ddpctl, stack)
        d, tmp = scratch(stack, opts.keep)
        with start_cluster(opts.hosts, Path(d) / "cluster") as cluster:
            flags, lost_after, how = lost_after_in_effect(ddpctl, cluster, tmp, opts.lost_after)
            victim = cluster.hosts[-1].name
            print(f"host loss: {opts.hosts} hosts x {opts.nproc} rank(s), the toy job training; {victim} goes; "
                  f"{opts.runs} runs each\nddpctl: {ddpctl.label}\nlost_after: {how}", flush=True)
            for i in range(opts.runs):
                if opts.only in (None, "death"):
                    a = death(ddpctl, cluster, tmp, i + 1, flags, opts)
                    deaths.append(a)
                    print(f"death {i + 1}: " + (f"broken: {a.broken}" if a.broken else
                          f"kill -> other hosts' job processes gone {secs(a.others_gone, opts.cap)}, -> ddpctl "
                          f"exited {secs(a.exited, opts.cap)} (exit {a.code}, first failure {a.first})"), flush=True)
                if opts.only in (None, "partition"):
                    b = partition(ddpctl, cluster, tmp, i + 1, flags, lost_after, opts)
                    parts.append(b)
                    cap = lost_after + opts.cap
                    print(f"partition {i + 1}: " + (f"broken: {b.broken}" if b.broken else
                          f"cut -> ddpctl exited {secs(b.exited, cap)} (exit {b.code}, first failure {b.first}), "
                          f"-> other hosts' job processes gone {secs(b.others_gone, cap)}, -> {victim} stopped its "
                          f"own ranks {secs(b.victim_gone, cap)}; `ddpctl top --once` answered in "
                          f"{secs(b.top, opts.cap)}"), flush=True)
    good_a = [a for a in deaths if not a.broken]
    good_b = [b for b in parts if not b.broken]
    print(f"\nsummary (medians over runs; lost_after {lost_after:g}s: {how})")
    if good_a:
        both = median([a.both for a in good_a])
        met = both is not None and both <= DEATH_TARGET_S and all(a.both is not None for a in good_a)
        print(f"  death: kill -> other hosts' job processes gone {secs(median([a.others_gone for a in good_a]))}, "
              f"-> ddpctl exited {secs(median([a.exited for a in good_a]))}; both {secs(both)} "
              f"(target <= {DEATH_TARGET_S:.0f}s; {'met' if met else 'missed'}) per run: "
              f"{', '.join(secs(a.both, opts.cap) for a in good_a)}")
    if good_b:
        cap = lost_after + opts.cap
        exited = median([b.exited for b in good_b])
        target = lost_after + PARTITION_SLACK_S
        met = exited is not None and exited <= target and all(b.exited is not None for b in good_b)
        print(f"  partition: cut -> ddpctl exited {secs(exited, cap)} (target <= lost_after + "
              f"{PARTITION_SLACK_S:.0f}s = {target:g}s; {'met' if met else 'missed'}) per run: "
              f"{', '.join(secs(b.exited, cap) for b in good_b)}")
        others = median([b.others_gone for b in good_b])
        print(f"             cut -> other hosts' job processes gone {secs(others, cap)}"
              f", -> the cut-off host stopped its own ranks {secs(median([b.victim_gone for b in good_b]), cap)}"
              f"; `ddpctl top --once` (the cut-off host unreachable) answered in "
              f"{secs(median([b.top for b in good_b]), opts.cap)}")
    broken = len(deaths) - len(good_a) + len(parts) - len(good_b)
    return 1 if broken or not (good_a or good_b) else 0


if __name__ == "__main__":
    sys.exit(main())
