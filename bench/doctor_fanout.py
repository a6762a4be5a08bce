"""Wall time of `ddpctl doctor` beside `pdsh -R ssh -w ... true` on the same cluster hosts.

For each kind of host (--homes) and size (default 1, 8, 16, 32 hosts), --repeat runs, pdsh and
doctor interleaved (the order alternates): the median of each, the median of the per-run ratio
doctor / pdsh (target <= 1.0 at 16 hosts), doctor's own phases, and the CPU each tool's runs took
(its own processes; every process of this machine, the hosts' included; idle core-seconds: the
hosts share this machine's cores, so a tool is as fast as its CPU and its serial stretches allow).
doctor runs every check, torch facts cached on the hosts (--cold adds a column with --no-cache:
every host imports torch). Then where doctor's seconds go at the largest size, each cost alone
(bench/breakdown.py). Prints figures; asserts nothing.

--homes: `private` hosts have their own home (root's is empty there: no rc file, as on a node
with a local home); `shared` hosts log in to this machine's /root, whose .bashrc runs `pyenv
init`: its `pyenv rehash` takes a lock file in the shared home, so logins on all hosts queue for
it, 0.1 s apiece, for pdsh and doctor alike (16 hosts: about 1.6 s of either tool's wall time).
The hosts' interpreter has this machine's packages but not ddpctl (bench/breakdown.host_python).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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

from bench.breakdown import fixed_costs, host_python, print_costs, user_env  # noqa: E402
from inventory import load_inventory  # noqa: E402
from orchestrator.doctor import run_doctor  # noqa: E402
from orchestrator.doctor.context import from_inventory  # noqa: E402
from tests.cluster import Cluster, start_cluster  # noqa: E402
from tests.ddpctl_run import ddpctl_argv  # noqa: E402


@dataclass(frozen=True)
class Row:
    homes: str
    hosts: int
    pdsh_s: float
    doctor_s: float
    ratio: float  # median of the per-run ratios
    ratios: tuple[float, ...]
    doctor_cold_s: float | None
    doctor_exit: int
    phases: dict[str, float]  # doctor's own: outside the checks, facts, probe (medians)
    cpu: dict[str, Cpu]  # per tool: CPU seconds (medians)


@dataclass(frozen=True)
class Cpu:
    """CPU seconds one run used: the tool's own processes (pdsh's ssh clients, ddpctl), and every
    process of this machine (the hosts' sshds, shells and agents too: they share its cores)."""

    own: float
    machine: float
    idle: float  # core-seconds no process used while it ran


def machine_cpu() -> tuple[float, float]:
    """(busy, idle) core-seconds since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / ticks, idle / ticks


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,8,16,32", help="host counts (default 1,8,16,32)")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved runs per size (median)")
    parser.add_argument("--homes", default="private,shared",
                        help="kinds of host, in order: private (own home), shared (this /root)")
    parser.add_argument("--cold", action="store_true", help="also time doctor --no-cache")
    parser.add_argument("--workdir", type=Path, help="cluster files (default: a temp dir)")
    return parser.parse_args(argv)


def write_inventory(cluster: Cluster, n: int, path: Path, python: Path) -> Path:
    lines = ["[defaults]", 'user = "root"', f"python = {json.dumps(str(python))}"]
    for h in cluster.hosts[:n]:
        lines += ["", "[[hosts]]", f"name = {json.dumps(h.name)}",
                  f"address = {json.dumps(h.address)}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int, bytes, Cpu]:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy, idle = machine_cpu()
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy_after, idle_after = machine_cpu()
    own = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    if proc.returncode not in (0, 1):
        sys.stderr.write(proc.stderr.decode(errors="replace")[-2000:])
        raise SystemExit(f"{argv[0]} exited {proc.returncode}")
    return elapsed, proc.returncode, proc.stdout, Cpu(own, busy_after - busy, idle_after - idle)


def pdsh_argv(cluster: Cluster, n: int) -> list[str]:
    return ["pdsh", "-R", "ssh", "-f", "64", "-w", ",".join(h.name for h in cluster.hosts[:n]),
            "true"]


def doctor_phases(wall: float, out: bytes) -> dict[str, float]:
    """doctor's own account (--json): its checks' time by phase; the rest of the wall time is
    start-up (imports, parsing the command line and inventory), output and exit. The SSH
    handshakes start during start-up (HostPool.connect_ahead, once the inventory is read) and end
    within the facts phase."""
    report = json.loads(out)
    return {"start-up, output, exit": wall - report["elapsed_s"],
            "facts (handshakes' rest, exec, agent)": report["phases"]["facts_s"],
            "TCP probe between hosts": report["phases"]["probe_s"]}


def measure(cluster: Cluster, homes: str, n: int, repeat: int, cold: bool, tmp: Path,
            python: Path) -> Row:
    inventory = write_inventory(cluster, n, tmp / f"hosts{n}.toml", python)
    doctor = ddpctl_argv("doctor", "-i", str(inventory), "--ssh-config", str(cluster.ssh_config), "--json")
    pdsh_env = {**user_env(), "PDSH_SSH_ARGS_APPEND": f"-F {cluster.ssh_config}"}
    pdsh: list[float] = []
    warm: list[float] = []
    colds: list[float] = []
    phases: list[dict[str, float]] = []
    cpu: dict[str, list[Cpu]] = {"pdsh": [], "doctor": []}
    code = 0
    timed(doctor, user_env())  # torch facts cached on every host, bytecode written
    for i in range(repeat):
        for tool in (("pdsh", "doctor") if i % 2 == 0 else ("doctor", "pdsh")):
            if tool == "pdsh":
                elapsed, _, _, used = timed(pdsh_argv(cluster, n), pdsh_env)
                pdsh.append(elapsed)
            else:
                elapsed, code, out, used = timed(doctor, user_env())
                warm.append(elapsed)
                phases.append(doctor_phases(elapsed, out))
            cpu[tool].append(used)
        if cold:
            colds.append(timed([*doctor, "--no-cache"], user_env())[0])
    ratios = tuple(d / p for d, p in zip(warm, pdsh, strict=True))
    return Row(homes, n, statistics.median(pdsh), statistics.median(warm), statistics.median(ratios),
               ratios, statistics.median(colds) if colds else None, code,
               {k: statistics.median(p[k] for p in phases) for k in phases[0]},
               {tool: Cpu(*(statistics.median(getattr(c, f) for c in runs) for f in ("own", "machine", "idle")))
                for tool, runs in cpu.items()})


def report(rows: list[Row]) -> None:
    print(f"{'homes':>7}  {'hosts':>5}  {'pdsh true':>10}  {'doctor':>8}  {'doctor/pdsh':>11}  "
          f"{'(target)':>8}  {'doctor cold':>11}  exit  ratios")
    for r in rows:
        cold = f"{r.doctor_cold_s:10.2f}s" if r.doctor_cold_s is not None else f"{'-':>11}"
        target = "<= 1.0" if r.hosts >= 16 else ""
        print(f"{r.homes:>7}  {r.hosts:>5}  {r.pdsh_s:>9.2f}s  {r.doctor_s:>7.2f}s  {r.ratio:>11.2f}  "
              f"{target:>8}  {cold}  {r.doctor_exit:>4}  {', '.join(f'{x:.2f}' for x in r.ratios)}")
    print("doctor: every check, torch facts cached on the hosts; ddpctl runs without "
          "PYTHONDONTWRITEBYTECODE, which this machine sets (bench/breakdown.py)")
    names = list(rows[0].phases) if rows else []
    print(f"\ndoctor's phases (medians, from its --json): {' | '.join(names)}")
    for r in rows:
        print(f"{r.homes:>7}  {r.hosts:>5}  " + "  ".join(f"{r.phases[k]:6.2f}s" for k in names))
    print("\nCPU seconds per run (medians): the tool's own processes | every process on this machine "
          "(the hosts' sshds, shells, agents) | cores left idle while it ran")
    for r in rows:
        print(f"{r.homes:>7}  {r.hosts:>5}  " + "   ".join(
            f"{tool} {c.own:5.2f} | {c.machine:5.2f} | {c.idle:5.2f}" for tool, c in r.cpu.items()))


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
    kinds = [k.strip() for k in args.homes.split(",") if k.strip()]
    if not kinds or set(kinds) - {"private", "shared"}:
        print(f"--homes {args.homes}: use private, shared or both", file=sys.stderr)
        return 2
    if max(sizes) > 16:
        raise_neighbor_limits()
    rows: list[Row] = []
    costs: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="doctor-fanout-") as tmp_name:
        tmp = Path(tmp_name)
        python = host_python(tmp / "host-python")
        for homes in kinds:
            workdir = (args.workdir or tmp) / f"cluster-{homes}"
            with start_cluster(max(sizes), workdir, private=homes == "private") as cluster:
                for n in sizes:
                    rows.append(measure(cluster, homes, n, args.repeat, args.cold, tmp, python))
                    print(f"measured {n} host(s), {homes} homes", file=sys.stderr, flush=True)
                inventory = load_inventory(write_inventory(cluster, max(sizes), tmp / "all.toml", python))
                costs[homes] = fixed_costs(cluster.ssh_config, inventory.hosts, 3,
                                           ("doctor's round trip (facts, probe, checks)",
                                            lambda pool, inv=inventory: run_doctor(from_inventory(inv), pool)))
    report(rows)
    for homes, figures in costs.items():
        print_costs(f"\nwhere doctor's seconds go at {max(sizes)} hosts, {homes} homes (medians, each alone)",
                    figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
