"""Wall time of `ddpctl doctor --deep` at 8 / 16 / 32 hosts, healthy, with one slow link, with a link
that barely moves plus a starved host, and with a start that fails, and its false findings per run
(target 0).

For each size (--sizes): a namespace cluster whose hostnames resolve nowhere (tests/cluster.py's
default; the job leaves GLOO_SOCKET_IFNAME to ddpctl), --repeat runs healthy, then --repeat runs with
host 1's link limited to 40 Mbit/s both ways (tbf, tests/cluster_faults.py), then --repeat runs with
host 1 at 2 Mbit/s and host 3's sessions at 4 % of a core (a cgroup quota); then (--starts) host 2's
packets to the master port dropped once its check runs (it starts and never reaches node 0's store),
and node 0 at 4 % of a core (no coordinator: doctor's own start deadline). Per run: the wall time of the
whole command (every usual check, then the deep job), the deep phase alone, the rounds run, pairs
measured of all, and the findings: on a healthy cluster every warning or error of `links` /
`compute` is false; with faults, any but the expected ones (`links` on host 1, `compute` on host 3)
is false, and a run that does not name one is a miss. The faulty runs' wall time is also given as a
multiple of the healthy one (target: about 2, whatever one host does; a start that fails: named
within the join deadline, never torch's 300 s store timeout). Budget: the whole run at 16 hosts
within 60 s on a healthy cluster. tests/integration/test_doctor_deep.py asserts the verdicts, and
these figures are how long they take. What the rounds do at 64 and 128 hosts: bench/deep_scale.py.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.cluster import Cluster, start_cluster  # noqa: E402
from tests.cluster_faults import cpu_quota, slow_link, store_cut_once_started  # noqa: E402
from tests.ddpctl_run import ddpctl_argv, ssh_args, write_job  # noqa: E402

DEEP = ("links", "compute")
ENV = {"NCCL_IB_DISABLE": "1"}  # no GLOO_SOCKET_IFNAME: ddpctl sets it where a host's name resolves nowhere


def one_run(cluster: Cluster, work: Path, expected: set[tuple[str, str]]) -> dict[str, Any]:
    job = write_job(work, cluster, "deep", nproc=1, env=ENV, pin_gloo=False)
    started = time.monotonic()
    out = subprocess.run(ddpctl_argv("doctor", str(job), "--deep", "--json", "--runs-dir", str(work / "runs"),
                                     *ssh_args(cluster)), capture_output=True, text=True, timeout=900, check=False)
    wall = time.monotonic() - started
    report = json.loads(out.stdout)
    figures = report.get("deep") or {}
    named = {(f["check"], f["host"]) for f in report["findings"]
             if f["check"] in DEEP and f["status"] in ("warn", "fail")}
    n = len(cluster.hosts)
    return {"wall": wall, "deep": report["phases"].get("launch_checks_s", 0.0), "rounds": figures.get("rounds", 0),
            "pairs": len(figures.get("links", [])), "all": n * (n - 1) // 2, "false": sorted(named - expected),
            "missed": bool(expected - named), "links_s": figures.get("phases", {}).get("links_s", 0.0),
            "compute_s": figures.get("phases", {}).get("compute_s", 0.0)}


STATES = ("healthy", "slow link", "crawl + starved", "store cut", "node 0 starved")


def case(cluster: Cluster, work: Path, state: str) -> dict[str, Any]:
    """One run of `state`, with its fault on while it runs, and the findings it should give."""
    name = [h.name for h in cluster.hosts]
    if state == "slow link":
        with slow_link(cluster, 1):
            return one_run(cluster, work, {("links", name[1])})
    if state == "crawl + starved":
        with slow_link(cluster, 1, "2mbit"), cpu_quota(cluster, 3, 4):
            return one_run(cluster, work, {("links", name[1]), ("compute", name[3])})
    if state == "store cut":
        with store_cut_once_started(cluster, 2):
            return one_run(cluster, work, {("compute", name[2])})
    if state == "node 0 starved":
        with cpu_quota(cluster, 0, 4):
            return one_run(cluster, work, {("compute", name[0]), ("links", name[0])})
    return one_run(cluster, work, set())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[8, 16, 32])
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--states", nargs="+", choices=STATES, default=list(STATES[:3]),
                   help="which cases (default: the first three; the start failures are extra)")
    args = p.parse_args()
    rows: list[tuple[int, str, list[dict[str, Any]]]] = []
    for n in args.sizes:
        with tempfile.TemporaryDirectory(prefix=f"deep{n}-") as tmp, start_cluster(n, Path(tmp)) as cluster:
            for state in ["healthy", *(s for s in args.states if s != "healthy")]:
                runs = []
                for i in range(args.repeat):
                    work = Path(tmp) / f"{state.replace(' ', '').replace('+', '')}{i}"
                    work.mkdir()
                    runs.append(case(cluster, work, state))
                    print(f"  {n} hosts, {state}, run {i}: {runs[-1]}", flush=True)
                rows.append((n, state, runs))
    print("\n| hosts | cluster | wall (median) | × healthy | deep phase | compute | links | rounds | pairs measured "
          "| false findings | missed |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    healthy = {n: statistics.median(r["wall"] for r in runs) for n, state, runs in rows if state == "healthy"}
    for n, state, runs in rows:
        wall = statistics.median(r["wall"] for r in runs)
        deep = statistics.median(r["deep"] for r in runs)
        false = sum(len(r["false"]) for r in runs) / len(runs)
        missed = sum(r["missed"] for r in runs) if state != "healthy" else "—"
        compute = statistics.median(r["compute_s"] for r in runs)
        links = statistics.median(r["links_s"] for r in runs)
        print(f"| {n} | {state} | {wall:.1f} s | {wall / healthy[n]:.2f} | {deep:.1f} s | {compute:.1f} s "
              f"| {links:.1f} s | {runs[0]['rounds']} | {runs[0]['pairs']} of {runs[0]['all']} | {false:g} per run "
              f"| {missed} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
