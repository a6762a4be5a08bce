"""Wall time of `ddpctl doctor` beside `pdsh -R ssh -w ... true` on the same cluster hosts.

For each size (default 1, 8, 16, 32 hosts), --repeat runs, pdsh and doctor interleaved (the order
alternates): the median of each, and the median of the per-run ratio doctor / pdsh (target <= 1.0
at 16 hosts). doctor runs every check, torch facts cached on the hosts (--cold adds a column
with --no-cache: every host imports torch). Then where doctor's seconds go at the largest size
(bench/breakdown.py). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.breakdown import fixed_costs, print_costs, user_env  # noqa: E402
from inventory import load_inventory  # noqa: E402
from orchestrator.doctor import run_doctor  # noqa: E402
from orchestrator.doctor.context import from_inventory  # noqa: E402
from tests.cluster import Cluster, start_cluster  # noqa: E402
from tests.ddpctl_run import ddpctl_argv  # noqa: E402


@dataclass(frozen=True)
class Row:
    hosts: int
    pdsh_s: float
    doctor_s: float
    ratio: float  # median of the per-run ratios
    ratios: tuple[float, ...]
    doctor_cold_s: float | None
    doctor_exit: int


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,8,16,32", help="host counts (default 1,8,16,32)")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved runs per size (median)")
    parser.add_argument("--cold", action="store_true", help="also time doctor --no-cache")
    parser.add_argument("--workdir", type=Path, help="cluster files (default: a temp dir)")
    return parser.parse_args(argv)


def write_inventory(cluster: Cluster, n: int, path: Path) -> Path:
    lines = ["[defaults]", 'user = "root"', f"python = {json.dumps(sys.executable)}"]
    for h in cluster.hosts[:n]:
        lines += ["", "[[hosts]]", f"name = {json.dumps(h.name)}",
                  f"address = {json.dumps(h.address)}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int]:
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        sys.stderr.write(proc.stderr.decode(errors="replace")[-2000:])
        raise SystemExit(f"{argv[0]} exited {proc.returncode}")
    return elapsed, proc.returncode


def pdsh_argv(cluster: Cluster, n: int) -> list[str]:
    return ["pdsh", "-R", "ssh", "-f", "64", "-w", ",".join(h.name for h in cluster.hosts[:n]),
            "true"]


def measure(cluster: Cluster, n: int, repeat: int, cold: bool, tmp: Path) -> Row:
    inventory = write_inventory(cluster, n, tmp / f"hosts{n}.toml")
    doctor = ddpctl_argv("doctor", "-i", str(inventory), "--ssh-config", str(cluster.ssh_config), "--json")
    pdsh_env = {**os.environ, "PDSH_SSH_ARGS_APPEND": f"-F {cluster.ssh_config}"}
    pdsh: list[float] = []
    warm: list[float] = []
    colds: list[float] = []
    code = 0
    timed(doctor, user_env())  # torch facts cached on every host, bytecode written
    for i in range(repeat):
        for tool in (("pdsh", "doctor") if i % 2 == 0 else ("doctor", "pdsh")):
            if tool == "pdsh":
                pdsh.append(timed(pdsh_argv(cluster, n), pdsh_env)[0])
            else:
                elapsed, code = timed(doctor, user_env())
                warm.append(elapsed)
        if cold:
            colds.append(timed([*doctor, "--no-cache"], user_env())[0])
    ratios = tuple(d / p for d, p in zip(warm, pdsh, strict=True))
    return Row(n, statistics.median(pdsh), statistics.median(warm), statistics.median(ratios), ratios,
               statistics.median(colds) if colds else None, code)


def report(rows: list[Row]) -> None:
    print(f"{'hosts':>5}  {'pdsh true':>10}  {'doctor':>8}  {'doctor/pdsh':>11}  {'(target)':>8}  "
          f"{'doctor cold':>11}  exit  ratios")
    for r in rows:
        cold = f"{r.doctor_cold_s:10.2f}s" if r.doctor_cold_s is not None else f"{'-':>11}"
        target = "<= 1.0" if r.hosts >= 16 else ""
        print(f"{r.hosts:>5}  {r.pdsh_s:>9.2f}s  {r.doctor_s:>7.2f}s  {r.ratio:>11.2f}  {target:>8}  {cold}  "
              f"{r.doctor_exit:>4}  {', '.join(f'{x:.2f}' for x in r.ratios)}")
    print("doctor: every check, torch facts cached on the hosts; ddpctl runs without "
          "PYTHONDONTWRITEBYTECODE, which this machine sets (bench/breakdown.py)")


NEIGH = Path("/proc/sys/net/ipv4/neigh/default")


def raise_neighbor_limits(minimum: int = 16384) -> None:
    """All namespaces share one ARP table: 32 hosts x 31 peers overflows the default gc_thresh3
    (1024), the kernel logs "neighbor table overflow" and drops SYNs between random pairs."""
    current = int((NEIGH / "gc_thresh3").read_text())
    if current >= minimum:
        return
    (NEIGH / "gc_thresh2").write_text(str(minimum // 2))
    (NEIGH / "gc_thresh3").write_text(str(minimum))
    print(f"raised net.ipv4.neigh.default.gc_thresh3 {current} -> {minimum} (shared ARP table)",
          file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("pdsh") is None:
        print("pdsh is not installed (apt-get install pdsh)", file=sys.stderr)
        return 2
    sizes = sorted(int(s) for s in args.sizes.split(","))
    if max(sizes) > 16:
        raise_neighbor_limits()
    with tempfile.TemporaryDirectory(prefix="doctor-fanout-") as tmp_name:
        tmp = Path(tmp_name)
        with start_cluster(max(sizes), args.workdir or tmp / "cluster") as cluster:
            rows = []
            for n in sizes:
                rows.append(measure(cluster, n, args.repeat, args.cold, tmp))
                print(f"measured {n} host(s)", file=sys.stderr, flush=True)
            inventory = load_inventory(write_inventory(cluster, max(sizes), tmp / "all.toml"))
            costs = fixed_costs(cluster.ssh_config, inventory.hosts, 3,
                                ("doctor's round trip (facts, probe, checks)",
                                 lambda pool: run_doctor(from_inventory(inventory), pool)))
    report(rows)
    print_costs(f"\nwhere doctor's seconds go at {max(sizes)} hosts (medians, each alone)", costs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
