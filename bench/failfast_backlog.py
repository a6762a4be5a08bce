"""A rank raising behind a backlog: how fast `ddpctl up` tears a chatty job down, on a real namespace cluster.

2 hosts x 2 ranks (--hosts, --nproc); every rank prints --lines lines (default 50,000) as fast as
it can (train_jobs/chatty.py), then the last rank (rank 3, on node1) writes the unix time to a
stamp file and raises, while the other ranks sleep --hold seconds as if blocked in a collective.
Measured per run: from the raise (the stamp; every host shares this machine's clock) to every job
process on every host gone (DDPCTL_JOB_ID in /proc/<pid>/environ, polled every 20 ms; target
<= 2 s), and to `ddpctl up` exiting; and how many of each rank's lines ddpctl showed. A missed
target is a figure, not a failure: the exit code is non-zero only when a measurement broke (ddpctl
never started the job, the failing rank never raised).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.chatty_output import tally_ddpctl  # noqa: E402
from bench.jobwatch import (  # noqa: E402
    DDPCTL_HELP,
    Ddpctl,
    job_id_of,
    job_pids,
    kill_job,
    median,
    scratch,
    secs,
    start_ddpctl,
    wait_gone,
    wait_until,
)
from tests.cluster import Cluster, start_cluster  # noqa: E402

TARGET_S = 2.0


@dataclass
class Outcome:
    gone: float | None  # raise -> the last job process gone (None: still there at the cap)
    exited: float | None  # raise -> `ddpctl up` exited
    code: int | None
    shown: dict[int, int]  # lines of each rank that ddpctl's stdout showed
    first_failure: str | None
    broken: str = ""


def one_run(ddpctl: Ddpctl, cluster: Cluster, tmp: Path, serial: int, opts: argparse.Namespace) -> Outcome:
    name, port = f"failfast-{serial}", 29900 + serial
    stamp = tmp / f"{name}.stamp"
    fail_rank = len(cluster.hosts) * opts.nproc - 1
    args = ["--lines", str(opts.lines), "--width", str(opts.width), "--fail-rank", str(fail_rank),
            "--stamp", str(stamp), "--hold", str(opts.hold)]
    child, runs = start_ddpctl(ddpctl, cluster, tmp, name, port, args, nproc=opts.nproc)
    job_id = job_id_of(runs, child, opts.cap)
    hosts = range(len(cluster.hosts))
    try:
        if job_id is None:
            return Outcome(None, None, child.code, {}, None, "ddpctl made no run directory")
        if not wait_until(lambda: stamp.exists() or child.done, opts.cap, 0.005) or not stamp.exists():
            err = (tmp / f"{name}.err").read_text(errors="replace")[-1500:]
            return Outcome(None, None, child.code, {}, None,
                           f"rank {fail_rank} never raised (ddpctl exit {child.code}): {err}")
        known = job_pids(cluster, hosts, job_id)
        gone_at = wait_gone(cluster, hosts, job_id, opts.cap, known)
        raised = float(stamp.read_text())
        child.wait(opts.cap)
    finally:
        kill_job(cluster, [child], job_id)
    nproc = opts.nproc
    ranks = list(range(len(cluster.hosts) * nproc))
    where = {r: cluster.hosts[r // nproc].name for r in ranks}
    label = max(len(h.name) for h in cluster.hosts) + 6
    tally = tally_ddpctl(tmp / f"{name}.out", ranks, opts.lines, opts.width, where, label)
    summary = runs / job_id / "summary.json"
    first = json.loads(summary.read_text()).get("first_failure") if summary.exists() else None
    return Outcome(None if gone_at is None else gone_at - raised,
                   None if child.ended is None else child.ended - raised, child.code,
                   {r: opts.lines - m for r, m in tally.per_rank_missing().items()}, first)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--nproc", type=int, default=2, help="ranks per host")
    parser.add_argument("--lines", type=int, default=50_000, help="lines each rank prints before the raise")
    parser.add_argument("--width", type=int, default=72, help="bytes per line (newline excluded)")
    parser.add_argument("--hold", type=float, default=300.0, help="seconds the other ranks go on (sleeping)")
    parser.add_argument("--cap", type=float, default=60.0, help="seconds before a teardown is called a hang")
    parser.add_argument("--keep", type=Path, default=None, help="keep the outputs in this directory")
    parser.add_argument("--ddpctl", default=None, metavar="TREE_OR_REV", help=DDPCTL_HELP)
    opts = parser.parse_args(argv)
    last = opts.hosts * opts.nproc - 1
    print(f"fail fast behind a backlog: {opts.hosts} hosts x {opts.nproc} ranks, {opts.lines:,} lines per rank, "
          f"then rank {last} (node{opts.hosts - 1}) raises; {opts.runs} runs", flush=True)
    outcomes: list[Outcome] = []
    with contextlib.ExitStack() as stack:
        ddpctl = Ddpctl(opts.ddpctl, stack)
        print(f"ddpctl: {ddpctl.label}", flush=True)
        d, tmp = scratch(stack, opts.keep)
        with start_cluster(opts.hosts, Path(d) / "cluster") as cluster:
            for i in range(opts.runs):
                o = one_run(ddpctl, cluster, tmp, i + 1, opts)
                outcomes.append(o)
                if o.broken:
                    print(f"run {i + 1}: broken: {o.broken}", flush=True)
                    continue
                shown = ", ".join(f"{r}: {n}" for r, n in o.shown.items())
                print(f"run {i + 1}: raise -> every job process gone {secs(o.gone, opts.cap)}, -> ddpctl exited "
                      f"{secs(o.exited, opts.cap)} (exit {o.code}, first failure {o.first_failure}); lines shown "
                      f"per rank (of {opts.lines:,}): {shown}", flush=True)
    good = [o for o in outcomes if not o.broken]
    gone = median([o.gone for o in good])
    print("\nsummary (medians over runs)")
    print(f"  raise -> every job process gone   {secs(gone, opts.cap)}   (target <= {TARGET_S:.1f}s; "
          f"{'met' if gone is not None and gone <= TARGET_S and all(o.gone is not None for o in good) else 'missed'})"
          f"  per run: {', '.join(secs(o.gone, opts.cap) for o in good)}")
    print(f"  raise -> ddpctl up exited         {secs(median([o.exited for o in good]), opts.cap)}"
          f"  per run: {', '.join(secs(o.exited, opts.cap) for o in good)}")
    print(f"  rank {last}'s lines shown             "
          f"{', '.join(str(o.shown.get(last, 0)) for o in good)} of {opts.lines:,}")
    return 1 if len(good) < len(outcomes) or not good else 0


if __name__ == "__main__":
    sys.exit(main())
