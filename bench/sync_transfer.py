"""What `[sync]` costs: `ddpctl sync` (a fresh process, as a user runs it) against the manual
recipe (`tar c | ssh host tar x`, every host in parallel) on hosts that share no filesystem.

On a real namespace cluster of private hosts (each sshd in its own mount namespace, /srv a tmpfs
of its own), for a project of --files small files plus --mb MiB in 4 larger ones: the first copy,
a sync with nothing changed, and a sync after one file changed (median of --runs each). The
manual recipe copies everything every time: it has no "only what changed". Prints figures;
asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.cluster import Cluster, start_cluster  # noqa: E402

DEST = "/srv/bench"


def make_project(root: Path, files: int, mib: int) -> None:
    for i in range(files):
        sub = root / f"pkg{i % 20}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"mod{i}.py").write_text(f"X = {i}\n" + "# padding\n" * 100)
    for i in range(4):
        (root / f"weights{i}.bin").write_bytes(os.urandom(mib * (1 << 20) // 4))
    (root / "train.py").write_text("print('hi')\n")
    (root / "job.toml").write_text('inventory = "hosts.toml"\n[job]\nscript = "train.py"\n'
                                   f'[sync]\ndest = "{DEST}"\n')


def ddpctl_sync(cluster: Cluster, job: Path) -> float:
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "orchestrator", "sync", str(job), "--json", "--ssh-config",
                          str(cluster.ssh_config)], capture_output=True, text=True, check=False)
    took = time.monotonic() - t0
    if out.returncode != 0 or not json.loads(out.stdout)["ok"]:
        raise SystemExit(f"ddpctl sync failed: {out.stderr}")
    return took


def tar_over_ssh(cluster: Cluster, src: Path) -> float:
    """The recipe: `tar c . | ssh host 'mkdir -p DEST && tar x -C DEST'` to every host at once."""
    t0 = time.monotonic()
    procs = []
    for i in range(len(cluster.hosts)):
        tar = subprocess.Popen(["tar", "c", "-C", str(src), "."], stdout=subprocess.PIPE)
        ssh = subprocess.Popen(cluster.ssh_argv(i, f"mkdir -p {DEST}-manual && tar x -C {DEST}-manual"),
                               stdin=tar.stdout)
        assert tar.stdout is not None
        tar.stdout.close()
        procs += [tar, ssh]
    if any(p.wait() != 0 for p in procs):
        raise SystemExit("tar over ssh failed")
    return time.monotonic() - t0


def median(runs: int, before: Callable[[], None], timed: Callable[[], float]) -> float:
    times = []
    for _ in range(runs):
        before()
        times.append(timed())
    return statistics.median(times)


def measure(n: int, files: int, mib: int, runs: int) -> tuple[float, float, float, float]:
    """first copy, tar over ssh, nothing changed, one file changed: medians, on n private hosts."""
    with tempfile.TemporaryDirectory() as d, start_cluster(n, Path(d) / "cluster", private=True) as cluster:
        src = Path(d) / "proj"
        src.mkdir()
        make_project(src, files, mib)
        (src / "hosts.toml").write_text(cluster.hosts_toml.read_text())
        job = src / "job.toml"

        def wipe() -> None:
            for i in range(n):
                cluster.run_in(i, ["rm", "-rf", DEST, f"{DEST}-manual"])

        first = median(runs, wipe, lambda: ddpctl_sync(cluster, job))
        manual = median(runs, wipe, lambda: tar_over_ssh(cluster, src))
        ddpctl_sync(cluster, job)
        same = median(runs, lambda: None, lambda: ddpctl_sync(cluster, job))
        counter = iter(range(10**6))

        def touch_one() -> None:
            (src / "pkg0" / "mod0.py").write_text(f"X = {next(counter)}\n")

        one = median(runs, touch_one, lambda: ddpctl_sync(cluster, job))
    return first, manual, same, one


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4")
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--mb", type=int, default=20)
    parser.add_argument("--runs", type=int, default=5)
    opts = parser.parse_args(argv)
    print(f"project: {opts.files} small files + {opts.mb} MiB in 4 files; median of {opts.runs}")
    print(f"{'hosts':>5} {'first copy':>11} {'tar|ssh':>9} {'no change':>10} {'1 changed':>10}")
    for n in (int(x) for x in opts.sizes.split(",")):
        first, manual, same, one = measure(n, opts.files, opts.mb, opts.runs)
        print(f"{n:>5} {first:>10.2f}s {manual:>8.2f}s {same:>9.2f}s {one:>9.2f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
