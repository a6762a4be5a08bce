"""Wall time of `ddpctl doctor --deep` at 8 / 16 / 32 hosts, healthy and with one slow link, and
its false findings per run (target 0); then what the link rounds do at 64 and 128 hosts.

For each size (--sizes): a namespace cluster, --repeat runs healthy, then --repeat runs with host
1's link limited to 40 Mbit/s both ways (tbf, tests/cluster_faults.py). Per run: the wall time of
the whole command (every usual check, then the deep job), the deep phase alone, the rounds run,
pairs measured of all, and the findings: on a healthy cluster every warning or error of `links` /
`compute` is false; with the slow link, any but `links` on host 1 is false, and a run that does
not name host 1 is a miss. Budget: the whole run at 16 hosts within 60 s on a healthy cluster.

At 64 and 128 hosts (not started here: 128 torch ranks do not fit this 2-core, 23 GiB machine),
the schedule is worked out from the round time measured at the largest size: the tournament needs
n - 1 rounds; past the 20 s budget the run stops after the rounds that fit (at least 3) and re-pairs
the suspects (at most MAX_RECHECK_ROUNDS rounds more). On real hosts a round's pairs use separate links and cores,
so a round takes about as long at any size; here every pair shares two cores, so it grows with n.
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

from orchestrator.doctor.deep import LINKS_BUDGET_S  # noqa: E402
from tests.cluster import Cluster, start_cluster  # noqa: E402
from tests.cluster_faults import slow_link  # noqa: E402
from tests.ddpctl_run import ddpctl_argv, ssh_args, write_job  # noqa: E402
from train_jobs.hostcheck.schedule import MAX_RECHECK_ROUNDS, MIN_ROUNDS  # noqa: E402

DEEP = ("links", "compute")
ENV = {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1"}


def one_run(cluster: Cluster, work: Path, slow: str | None) -> dict[str, Any]:
    job = write_job(work, cluster, "deep", nproc=1, env=ENV)
    started = time.monotonic()
    out = subprocess.run(ddpctl_argv("doctor", str(job), "--deep", "--json", "--runs-dir", str(work / "runs"),
                                     *ssh_args(cluster)), capture_output=True, text=True, timeout=900, check=False)
    wall = time.monotonic() - started
    report = json.loads(out.stdout)
    figures = report.get("deep") or {}
    named = {(f["check"], f["host"]) for f in report["findings"]
             if f["check"] in DEEP and f["status"] in ("warn", "fail")}
    expected = {("links", slow)} if slow else set()
    n = len(cluster.hosts)
    return {"wall": wall, "deep": report["phases"].get("launch_checks_s", 0.0), "rounds": figures.get("rounds", 0),
            "pairs": len(figures.get("links", [])), "all": n * (n - 1) // 2, "false": sorted(named - expected),
            "missed": bool(expected - named), "links_s": figures.get("links_s", 0.0),
            "compute_s": figures.get("compute_s", 0.0)}


def schedule_at(n: int, round_s: float) -> str:
    """What the link rounds do at n hosts when a round takes `round_s` seconds."""
    need = n - 1 if n % 2 == 0 else n
    fit = max(MIN_ROUNDS, min(need, int(LINKS_BUDGET_S / max(round_s, 1e-6))))
    if fit >= need:
        return f"all {n * (n - 1) // 2} pairs in {need} rounds, ~{need * round_s:.0f} s of rounds"
    pairs = fit * (n // 2)
    return (f"a covering schedule: {fit} of {need} tournament rounds ({pairs} of {n * (n - 1) // 2} pairs, each "
            f"host meets {fit} others) + at most {MAX_RECHECK_ROUNDS} small recheck rounds, "
            f"~{LINKS_BUDGET_S + MAX_RECHECK_ROUNDS * round_s:.0f} s of rounds at most")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[8, 16, 32])
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    rows: list[tuple[int, str, list[dict[str, Any]]]] = []
    round_s = 0.0
    for n in args.sizes:
        with tempfile.TemporaryDirectory(prefix=f"deep{n}-") as tmp, start_cluster(n, Path(tmp)) as cluster:
            for state in ("healthy", "slow link"):
                runs = []
                for i in range(args.repeat):
                    work = Path(tmp) / f"{state.replace(' ', '')}{i}"
                    work.mkdir()
                    if state == "healthy":
                        runs.append(one_run(cluster, work, None))
                    else:
                        with slow_link(cluster, 1):
                            runs.append(one_run(cluster, work, cluster.hosts[1].name))
                    print(f"  {n} hosts, {state}, run {i}: {runs[-1]}", flush=True)
                rows.append((n, state, runs))
                if state == "healthy":
                    round_s = statistics.median(r["links_s"] / max(r["rounds"], 1) for r in runs)
    print("\n| hosts | cluster | wall (median) | deep phase | compute | links | rounds | pairs measured "
          "| false findings | missed |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for n, state, runs in rows:
        wall = statistics.median(r["wall"] for r in runs)
        deep = statistics.median(r["deep"] for r in runs)
        false = sum(len(r["false"]) for r in runs) / len(runs)
        missed = sum(r["missed"] for r in runs) if state != "healthy" else "—"
        compute = statistics.median(r["compute_s"] for r in runs)
        links = statistics.median(r["links_s"] for r in runs)
        print(f"| {n} | {state} | {wall:.1f} s | {deep:.1f} s | {compute:.1f} s | {links:.1f} s | {runs[0]['rounds']} "
              f"| {runs[0]['pairs']} of "
              f"{runs[0]['all']} | {false:g} per run | {missed} |")
    size = args.sizes[-1]
    print(f"\nround time at {size} hosts (healthy): {round_s:.2f} s on this machine")
    for n in (64, 128):
        print(f"  {n} hosts, each on its own machine (a round as long as at {size}): {schedule_at(n, round_s)}")
        print(f"  {n} hosts here (a round's pairs share 2 cores: {round_s * n / size:.2f} s): "
              f"{schedule_at(n, round_s * n / size)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
