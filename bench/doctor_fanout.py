"""Wall time of `ddpctl doctor` on 1, 8 and 32 cluster hosts beside `pdsh -R ssh ... true`."""

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

from tests.cluster import Cluster, start_cluster  # noqa: E402

DDPCTL = [sys.executable, "-c", "from orchestrator.cli import main; main()"]


@dataclass(frozen=True)
class Row:
    hosts: int
    pdsh_s: float
    doctor_cold_s: float
    doctor_warm_s: float
    doctor_exit: int


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1,8,32", help="host counts (default 1,8,32)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (median)")
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


def measure(cluster: Cluster, n: int, repeat: int, tmp: Path) -> Row:
    inventory = write_inventory(cluster, n, tmp / f"hosts{n}.toml")
    doctor = [*DDPCTL, "doctor", "-i", str(inventory), "--ssh-config", str(cluster.ssh_config),
              "--json"]
    pdsh_env = {**os.environ, "PDSH_SSH_ARGS_APPEND": f"-F {cluster.ssh_config}"}
    pdsh, cold, warm, code = [], [], [], 0
    for _ in range(repeat):
        pdsh.append(timed(pdsh_argv(cluster, n), pdsh_env)[0])
        cold.append(timed([*doctor, "--no-cache"])[0])
        elapsed, code = timed(doctor)
        warm.append(elapsed)
    return Row(n, statistics.median(pdsh), statistics.median(cold), statistics.median(warm), code)


def report(rows: list[Row]) -> None:
    print(f"{'hosts':>5}  {'pdsh true':>10}  {'doctor cold':>12}  {'doctor warm':>12}  "
          f"{'warm/pdsh':>9}  exit")
    for r in rows:
        print(f"{r.hosts:>5}  {r.pdsh_s:>9.2f}s  {r.doctor_cold_s:>11.2f}s  "
              f"{r.doctor_warm_s:>11.2f}s  {r.doctor_warm_s / r.pdsh_s:>9.2f}  {r.doctor_exit}")
    first, last = rows[0], rows[-1]
    print(f"\ndoctor {last.hosts} hosts / pdsh {last.hosts} hosts (warm): "
          f"{last.doctor_warm_s / last.pdsh_s:.2f} (target <= 1.0)")
    print(f"doctor {last.hosts} hosts / doctor {first.hosts} host (warm): "
          f"{last.doctor_warm_s / first.doctor_warm_s:.2f} (target <= 3.0)")
    print("cold = --no-cache: every host imports torch (all hosts share this machine's cores)")


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
            rows = [measure(cluster, n, args.repeat, tmp) for n in sizes]
    report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
