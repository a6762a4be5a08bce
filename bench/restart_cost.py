"""What a restart costs: a host's death to the resumed job's first step, against its parts, on a namespace cluster.

3 hosts: node0 and node1 run the job, node2 is a spare (inventory `spare = true`); --nproc ranks
per host; the job's [restart] is max_restarts = 1, backoff = 0 (no wait: the figure is ddpctl's
own cost) and a checkpoint_dir. The job, train_jobs/resumable.py --stamp, prints one line per
optimizer step carrying the rank's time.time() (the hosts share this clock), saves a checkpoint
every --every steps and resumes from it; attempt 0 trains until it is killed, a later attempt runs
--steps steps and ends.
`ddpctl up` runs with its stdout and stderr in one file; a thread times each of its lines as it
appears there. --runs times, on one cluster:
(a) restart: once attempt 0 has checkpointed, every process of node1's namespace is SIGKILLed
    (kill_netns; node1 is not the master; its sshd goes too, as in a power cut). Measured from the
    kill: detection, until `up` prints "attempt 0 failed" (the best case: the kernel resets the dead
    host's connections at once; a silent host is called lost only after lost_after); the pre-launch checks of attempt 1,
    ddpctl's own figure ("pre-launch checks passed on N host(s) in X.XXs") and the span from its
    "attempt 1 on ..." notice to attempt 1's plan line ("job <run>.1: ..."), which also holds the
    connections to the hosts and the master port; launch, from that plan line to attempt 1's first
    step (the step line's own time); total, from the kill to that first step. node1's sshd is
    started again afterwards.
(b) fresh launch, right after (a): the same job on node1's replacement set (hosts = ["node0",
    "node2"], max_restarts = 0, resuming from a copy of (a)'s checkpoint), measured from the start
    of `ddpctl up` to its first step line, and its own plan line -> first step.
Prints each run and the medians over runs: detection, checks, launch, total, fresh launch, and the
ratio total / (detection + fencing + checks + 1.1 x fresh launch), fencing being the wait from
`up`'s "fencing node1 before attempt 1" line to its "attempt 1 on" line (the dead host, never
reached again, is waited out: its ranks' grace, docs/restarts.md), checks ddpctl's own figure (target
<= 1.0; the ratio of the medians, and per run). A fresh launch holds its own pre-launch checks, so
the target counts the checks twice; "restart - detection" beside "fresh launch" compares the
relaunch alone with a launch from scratch. A missed target is a figure, not a failure: the exit code
is non-zero only when a measurement broke (the job never trained, no attempt 1, a wait passed --cap).
With --keep, <dir>/<job>.lines holds each line of `up`'s output with the time it appeared (and the
kill), to see where the time went.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import sys
import textwrap
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.jobwatch import DDPCTL_HELP, Child, Ddpctl, kill_job, median, scratch, secs  # noqa: E402
from tests.cluster import Cluster, start_cluster  # noqa: E402
from tests.cluster_files import write_hosts_toml  # noqa: E402
from tests.cluster_sys import kill_netns  # noqa: E402

MASTER, VICTIM, SPARE = 0, 1, 2  # node0 stays, node1 dies, node2 is the spare that takes its place
TARGET = 1.0
FRESH_FACTOR = 1.1
TICK_S = 0.005  # how often the output file is read for new lines

RESUMABLE = ROOT / "train_jobs" / "resumable.py"  # stamped lines, a checkpoint every --every steps

STEP = r"attempt {n} rank (\d+) step (\d+) t=(\d+\.\d+)"
CHECKS = re.compile(r"pre-launch checks passed on \d+ host\(s\) in (\d+\.\d+)s")
PLAN = r"job (\S+\.{n}): \d+ host\(s\)"  # an attempt's plan line
FRESH_PLAN = r"job (\S+): \d+ host\(s\)"  # a job with no restart: its id has no attempt number


class Lines:
    """A file's lines, each timed (time.time()) when a thread reading the file saw it complete."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._tail, daemon=True)
        self.thread.start()

    def _tail(self) -> None:
        buf = b""
        with self.path.open("rb") as f:
            while True:
                last = self.stopped.is_set()
                chunk = f.read()
                if chunk:
                    now = time.time()
                    *done, buf = (buf + chunk).split(b"\n")
                    with self.lock:
                        self.lines += [(now, raw.decode(errors="replace")) for raw in done]
                elif last:
                    return
                else:
                    time.sleep(TICK_S)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(5)

    def find(self, pattern: str | re.Pattern[str], start: int = 0) -> tuple[int, float, re.Match[str]] | None:
        """The first line from `start` on that `pattern` matches: its index, its time, the match."""
        with self.lock:
            lines = self.lines[start:]
        for i, (t, text) in enumerate(lines, start):
            m = re.search(pattern, text)
            if m:
                return i, t, m
        return None

    def wait(self, pattern: str | re.Pattern[str], child: Child, timeout: float,
             start: int = 0) -> tuple[int, float, re.Match[str]] | None:
        """find(), waiting up to `timeout` for it; None when `child` ended (or the time ran out) first."""
        deadline = time.monotonic() + timeout
        while True:
            ended = child.done
            found = self.find(pattern, start)
            if found or ended or time.monotonic() >= deadline:
                return found
            time.sleep(0.02)

    def note(self, text: str, when: float) -> None:
        """A line of this benchmark's own among the file's (saved, never matched: it starts with '#')."""
        with self.lock:
            self.lines.append((when, f"# {text}"))

    def save(self, path: Path) -> None:
        """Every line with the time it appeared (kept with --keep, to see where the time goes)."""
        with self.lock:
            path.write_text("".join(f"{t:.3f} {text}\n" for t, text in self.lines))

    def tail(self, n: int = 25) -> str:
        with self.lock:
            return "\n".join(text for _, text in self.lines[-n:])


def write_inventory(cluster: Cluster, path: Path) -> Path:
    write_hosts_toml(path, [(h.name, h.address) for h in cluster.hosts], sys.executable, [cluster.hosts[SPARE].name])
    return path


def train_args(opts: argparse.Namespace, *, forever_first: bool) -> list[str]:
    """Every attempt runs opts.steps steps from where it resumed, but the first, when
    `forever_first`, which trains until it is killed."""
    args = ["--delay", str(opts.delay), "--every", str(opts.every), "--steps-per-attempt", str(opts.steps), "--stamp"]
    return args + (["--forever-on-attempt", "0"] if forever_first else [])


def write_job(tmp: Path, inventory: Path, script: Path, name: str, args: Sequence[str], nproc: int,
              max_restarts: int, hosts: Sequence[str] | None = None) -> tuple[Path, Path]:
    """job.toml and its (empty) checkpoint directory."""
    ckpt = tmp / f"{name}.ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)
    text = textwrap.dedent(f"""\
        inventory = {json.dumps(str(inventory))}
        [job]
        name = {json.dumps(name)}
        script = {json.dumps(str(script))}
        args = {json.dumps([str(a) for a in args])}
        nproc_per_node = {nproc}
        """) + (f"hosts = {json.dumps(list(hosts))}\n" if hosts is not None else "") + textwrap.dedent(f"""\
        [rendezvous]
        master_port = "auto"
        [env]
        GLOO_SOCKET_IFNAME = "eth0"
        [restart]
        max_restarts = {max_restarts}
        backoff = 0
        checkpoint_dir = {json.dumps(str(ckpt))}
        """)
    path = tmp / f"{name}.toml"
    path.write_text(text)
    return path, ckpt


def start_up(ddpctl: Ddpctl, cluster: Cluster, tmp: Path, job: Path, name: str) -> tuple[Child, Lines]:
    argv = ddpctl.argv("up", str(job), "--grace", "3", "--runs-dir", str(tmp / "runs" / name),
                       "--ssh-config", str(cluster.ssh_config))
    child = Child(argv, tmp / f"{name}.out", env=ddpctl.env(), cwd=ddpctl.tree)  # stderr into the same file
    return child, Lines(tmp / f"{name}.out")


def finish(cluster: Cluster, child: Child, lines: Lines, cap: float) -> None:
    """Let `up` end on its own (the last attempt runs a few steps), then end what is left."""
    child.wait(cap)
    lines.stop()
    lines.save(lines.path.with_suffix(".lines"))
    with lines.lock:
        ids = {m.group(1) for _, text in lines.lines if (m := re.search(r"job (\S+): \d+ host\(s\)", text))}
    kill_job(cluster, [child], None)
    for job_id in sorted(ids):
        kill_job(cluster, [], job_id)


@dataclass
class Run:
    detection: float | None = None
    fence: float | None = None  # 'fencing' -> 'attempt 1 on': the dead host waited out (0: no fencing line)
    checks: float | None = None  # ddpctl's own figure for attempt 1
    to_plan: float | None = None  # "attempt 1 on" -> attempt 1's plan line
    launch: float | None = None  # attempt 1's plan line -> its first step
    total: float | None = None
    fresh: float | None = None
    fresh_checks: float | None = None
    fresh_launch: float | None = None  # the fresh job's plan line -> its first step
    code: int | None = None
    broken: str = ""

    @property
    def ratio(self) -> float | None:
        return ratio(self.total, self.detection, self.fence, self.checks, self.fresh)

    @property
    def relaunch(self) -> float | None:
        return None if self.total is None or self.detection is None else self.total - self.detection


def ratio(total: float | None, detection: float | None, fence: float | None, checks: float | None,
          fresh: float | None) -> float | None:
    if total is None or detection is None or fence is None or checks is None or fresh is None:
        return None
    return total / (detection + fence + checks + FRESH_FACTOR * fresh)


def restart(ddpctl: Ddpctl, cluster: Cluster, tmp: Path, inventory: Path, script: Path, serial: int,
            opts: argparse.Namespace) -> tuple[Run, Path]:
    name = f"restart-{serial}"
    job, ckpt = write_job(tmp, inventory, script, name, train_args(opts, forever_first=True), opts.nproc, 1)
    child, lines = start_up(ddpctl, cluster, tmp, job, name)
    r = Run()
    killed = False
    try:
        trains = lines.wait(rf"attempt 0 rank \d+ step {opts.every} ", child, opts.cap)  # checkpointed
        if trains is None or not (ckpt / "ckpt.pt").exists():
            r.broken = f"attempt 0 never trained to its first checkpoint (ddpctl exit {child.code}):\n{lines.tail()}"
            return r, ckpt
        t_kill = time.time()
        kill_netns([cluster.hosts[VICTIM].netns])
        killed = True
        lines.note(f"kill_netns {cluster.hosts[VICTIM].name} (done at {time.time():.3f})", t_kill)
        after = trains[0] + 1
        failed = lines.wait(r"attempt 0 failed", child, opts.cap, after)
        step = lines.wait(STEP.format(n=1), child, opts.cap, after)
        if failed is None or step is None:
            r.broken = f"no step of attempt 1 (ddpctl exit {child.code}):\n{lines.tail()}"
            return r, ckpt
        r.detection = failed[1] - t_kill
        r.total = float(step[2].group(3)) - t_kill
        on = lines.find(r"attempt 1 on ", failed[0])
        fencing = lines.find(r"fencing \S+ before attempt 1", failed[0])
        r.fence = 0.0 if fencing is None else (on[1] if on else failed[1]) - fencing[1]
        plan = lines.find(PLAN.format(n=1), failed[0])
        checks = lines.find(CHECKS, on[0] if on else failed[0])
        if checks is not None and (plan is None or checks[0] < plan[0]):
            r.checks = float(checks[2].group(1))
        if on is not None and plan is not None:
            r.to_plan = plan[1] - on[1]
        if plan is not None:
            r.launch = float(step[2].group(3)) - plan[1]
        return r, ckpt
    finally:
        finish(cluster, child, lines, opts.cap)
        r.code = child.code
        if killed:
            cluster.start_sshd(VICTIM)


def fresh(ddpctl: Ddpctl, cluster: Cluster, tmp: Path, inventory: Path, script: Path, serial: int, ckpt_from: Path,
          r: Run, opts: argparse.Namespace) -> None:
    name = f"fresh-{serial}"
    hosts = [cluster.hosts[MASTER].name, cluster.hosts[SPARE].name]
    job, ckpt = write_job(tmp, inventory, script, name, train_args(opts, forever_first=False), opts.nproc, 0,
                          hosts)
    if (ckpt_from / "ckpt.pt").exists():
        shutil.copy(ckpt_from / "ckpt.pt", ckpt / "ckpt.pt")  # it resumes, as attempt 1 did
    child, lines = start_up(ddpctl, cluster, tmp, job, name)
    try:
        step = lines.wait(STEP.format(n=0), child, opts.cap)
        if step is None:
            r.broken = f"the fresh launch never stepped (ddpctl exit {child.code}):\n{lines.tail()}"
            return
        r.fresh = float(step[2].group(3)) - child.started
        plan = lines.find(FRESH_PLAN)
        checks = lines.find(CHECKS)
        if plan is not None:
            r.fresh_launch = float(step[2].group(3)) - plan[1]
        if checks is not None:
            r.fresh_checks = float(checks[2].group(1))
    finally:
        finish(cluster, child, lines, opts.cap)


def report(label: str, r: Run, cap: float | None = None) -> str:
    ratio_text = "?" if r.ratio is None else f"{r.ratio:.2f}"
    return (f"{label}: kill -> detected {secs(r.detection, cap)}, fenced {secs(r.fence, cap)}, "
            f"checks {secs(r.checks, cap)} (attempt 1 on -> "
            f"plan {secs(r.to_plan, cap)}), launch (plan -> first step) {secs(r.launch, cap)}; total kill -> first "
            f"step {secs(r.total, cap)} (restart - detection {secs(r.relaunch, cap)}; up exit {r.code}) | fresh "
            f"launch (up -> first step) {secs(r.fresh, cap)} (checks {secs(r.fresh_checks, cap)}, plan -> first step "
            f"{secs(r.fresh_launch, cap)}) | ratio {ratio_text} (target <= {TARGET:.1f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--nproc", type=int, default=1, help="ranks per host")
    parser.add_argument("--delay", type=float, default=0.1, help="seconds each step sleeps")
    parser.add_argument("--every", type=int, default=5, help="a checkpoint every N steps")
    parser.add_argument("--steps", type=int, default=3, help="steps of attempt 1 and of the fresh launch")
    parser.add_argument("--cap", type=float, default=120.0, help="seconds before a wait is called a hang")
    parser.add_argument("--keep", type=Path, default=None, help="keep the outputs in this directory")
    parser.add_argument("--ddpctl", default=None, metavar="TREE_OR_REV", help=DDPCTL_HELP)
    opts = parser.parse_args(argv)
    runs: list[Run] = []
    with contextlib.ExitStack() as stack:
        ddpctl = Ddpctl(opts.ddpctl, stack)
        d, tmp = scratch(stack, opts.keep)
        script = RESUMABLE
        with start_cluster(3, Path(d) / "cluster") as cluster:
            inventory = write_inventory(cluster, tmp / "hosts.toml")
            names = [h.name for h in cluster.hosts]
            print(f"restart cost: {names[MASTER]} + {names[VICTIM]} x {opts.nproc} rank(s), {names[SPARE]} spare; "
                  f"[restart] max_restarts = 1, backoff = 0; {names[VICTIM]} is killed once attempt 0 has "
                  f"checkpointed; fresh launch on {names[MASTER]} + {names[SPARE]}; {opts.runs} run(s)\n"
                  f"ddpctl: {ddpctl.label}", flush=True)
            for i in range(1, opts.runs + 1):
                r, ckpt = restart(ddpctl, cluster, tmp, inventory, script, i, opts)
                if not r.broken:
                    fresh(ddpctl, cluster, tmp, inventory, script, i, ckpt, r, opts)
                runs.append(r)
                print(f"run {i}: broken: {r.broken}" if r.broken else report(f"run {i}", r, opts.cap), flush=True)
    good = [r for r in runs if not r.broken]
    if good:
        def med(what: str) -> float | None:
            return median([getattr(r, what) for r in good])

        m = Run(detection=med("detection"), fence=med("fence"), checks=med("checks"), to_plan=med("to_plan"),
                launch=med("launch"),
                total=med("total"), fresh=med("fresh"), fresh_checks=med("fresh_checks"),
                fresh_launch=med("fresh_launch"))
        print(f"\nmedians over {len(good)} run(s)")
        print(f"  detection (kill -> 'attempt 0 failed')        {secs(m.detection)}")
        print(f"  fencing (the dead host waited out: grace)     {secs(m.fence)}")
        print(f"  checks (ddpctl's figure, attempt 1)           {secs(m.checks)}  "
              f"('attempt 1 on' -> plan line {secs(m.to_plan)})")
        print(f"  launch (plan line -> first step, attempt 1)   {secs(m.launch)}")
        print(f"  total (kill -> first step of attempt 1)       {secs(m.total)}  "
              f"(restart - detection {secs(m.relaunch)})")
        print(f"  fresh launch (up -> first step)               {secs(m.fresh)}  "
              f"(checks {secs(m.fresh_checks)}, plan line -> first step {secs(m.fresh_launch)})")
        met = m.ratio is not None and m.ratio <= TARGET
        per_run = ", ".join("?" if r.ratio is None else f"{r.ratio:.2f}" for r in good)
        print(f"  total / (detection + fencing + checks + {FRESH_FACTOR} x fresh launch) = "
              f"{'?' if m.ratio is None else f'{m.ratio:.2f}'} (target <= {TARGET:.1f}; "
              f"{'met' if met else 'missed'}) per run: {per_run}")
    return 1 if len(good) < len(runs) or not good else 0


if __name__ == "__main__":
    sys.exit(main())
