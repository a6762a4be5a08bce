"""Wall time of `ddpctl doctor` beside `pdsh -R ssh -f 64 -w ... true` on the same cluster hosts.

For each kind of host (--homes) and size (--sizes, default 1 8 16 32 hosts; up to 244), --repeat
runs, pdsh and doctor interleaved (the order alternates): the median of each, the median of the
per-run ratio doctor / pdsh (target <= 1.0 at 16 hosts), doctor's own phases, and the CPU each
tool's runs took (its own processes; every process of this machine, the hosts' included; idle
core-seconds; and the busy share: all processes' CPU seconds / (wall x cores). The hosts share
this machine's cores, so near 1.0 the cores are the limit, not the tool's waits).
doctor runs every check, torch facts cached on the hosts (--cold adds a column with --no-cache:
every host imports torch). Per doctor run, on this healthy cluster: its false findings (fail or
warn, from --json: how many, and on which checks and hosts), and, sampled every 50 ms while it
runs, its peak RSS (VmHWM of the ddpctl process) and the most SSH connections it held at once
(established TCP to port 22 among its file descriptors). Then a growth table (markdown): each
figure's exponent b of figure ~ a*N^b, least squares on log-log over the sizes. Then where
doctor's seconds go at the largest size, each cost alone (bench/breakdown.py; --no-costs skips).
Prints figures; asserts nothing. A cluster of more than 8 hosts raises the kernel's shared ARP
table limits while it is up (tests/cluster.py).

--homes: `private` hosts have their own home (root's is empty there: no rc file, as on a node
with a local home); `shared` hosts log in to this machine's /root, whose .bashrc runs `pyenv
init`: its `pyenv rehash` takes a lock file in the shared home, so logins on all hosts queue for
it, 0.1 s apiece, for pdsh and doctor alike (16 hosts: about 1.6 s of either tool's wall time).
The hosts' interpreter has this machine's packages but not ddpctl (bench/breakdown.host_python).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.breakdown import fixed_costs, host_python, print_costs, user_env  # noqa: E402
from bench.jobwatch import high_water_mib, median  # noqa: E402
from inventory import load_inventory  # noqa: E402
from orchestrator.checks.context import from_inventory  # noqa: E402
from orchestrator.doctor import run_doctor  # noqa: E402
from tests.cluster import Cluster, start_cluster  # noqa: E402
from tests.ddpctl_run import ddpctl_argv  # noqa: E402

CORES = os.cpu_count() or 1
SAMPLE_S = 0.05  # how often a running ddpctl's VmHWM and connections are read
NOTES = 5  # false findings shown per size (grouped by status and check)


@dataclass(frozen=True)
class Cpu:
    """CPU seconds one run used: the tool's own processes (pdsh's ssh clients, ddpctl), and every
    process of this machine (the hosts' sshds, shells and agents too: they share its cores)."""

    own: float
    machine: float
    idle: float  # core-seconds no process used while it ran
    busy: float = 0.0  # machine / (wall x cores): near 1.0, the cores are the limit


@dataclass(frozen=True)
class Run:
    """One run of a tool; peak RSS and SSH connections only where sampled (doctor's)."""

    wall: float
    code: int
    out: bytes
    cpu: Cpu
    peak_rss_mib: float | None = None
    max_ssh: int | None = None


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
    false_findings: tuple[int, ...]  # fail + warn findings of each doctor run (healthy cluster)
    finding_notes: tuple[str, ...]  # the first few of them, grouped by status and check
    rss_mib: float | None  # doctor's peak RSS (median over runs)
    ssh_conns: float | None  # doctor's most SSH connections open at once (median over runs)


def machine_cpu() -> tuple[float, float]:
    """(busy, idle) core-seconds since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / ticks, idle / ticks


def ssh_connections(pid: int) -> int | None:
    """Established TCP connections to port 22 among the process's file descriptors (None: gone)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    sockets = set()
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            sockets.add(target[8:-1])
    count = 0
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:  # sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            f = line.split()
            if len(f) > 9 and f[3] == "01" and f[2].endswith(":0016") and f[9] in sockets:
                count += 1
    return count


class Sampler:
    """Reads a running process's VmHWM and SSH connections every SAMPLE_S, in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_rss_mib: float | None = None
        self.max_ssh: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while True:
            rss, conns = high_water_mib(self.pid), ssh_connections(self.pid)
            if self._stop.is_set():  # the process may be gone or a zombie: keep what was seen
                return
            if rss is not None:
                self.peak_rss_mib = max(self.peak_rss_mib or 0.0, rss)
            if conns is not None:
                self.max_ssh = max(self.max_ssh or 0, conns)
            self._stop.wait(SAMPLE_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["1", "8", "16", "32"],
                        help="host counts, spaces or commas (default 1 8 16 32)")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved runs per size (median)")
    parser.add_argument("--homes", default="private,shared",
                        help="kinds of host, in order: private (own home), shared (this /root)")
    parser.add_argument("--cold", action="store_true", help="also time doctor --no-cache")
    parser.add_argument("--no-costs", action="store_true",
                        help="skip where doctor's seconds go at the largest size (bench/breakdown.py)")
    parser.add_argument("--workdir", type=Path, help="cluster files (default: a temp dir)")
    return parser.parse_args(argv)


def write_inventory(cluster: Cluster, n: int, path: Path, python: Path) -> Path:
    lines = ["[defaults]", 'user = "root"', f"python = {json.dumps(str(python))}"]
    for h in cluster.hosts[:n]:
        lines += ["", "[[hosts]]", f"name = {json.dumps(h.name)}",
                  f"address = {json.dumps(h.address)}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def timed(argv: list[str], env: dict[str, str] | None = None, sample: bool = False) -> Run:
    """Run argv to its end: wall, CPU (its process tree's, from RUSAGE_CHILDREN; the machine's),
    and with `sample` its own peak RSS and SSH connections, read while it runs."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy, idle = machine_cpu()
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sampler = Sampler(proc.pid) if sample else None
    out, err = proc.communicate()
    elapsed = time.perf_counter() - started
    if sampler is not None:
        sampler.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy_after, idle_after = machine_cpu()
    own = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    if proc.returncode not in (0, 1):
        sys.stderr.write(err.decode(errors="replace")[-2000:])
        raise SystemExit(f"{argv[0]} exited {proc.returncode}")
    cpu = Cpu(own, busy_after - busy, idle_after - idle, (busy_after - busy) / (elapsed * CORES))
    if sampler is None:
        return Run(elapsed, proc.returncode, out, cpu)
    return Run(elapsed, proc.returncode, out, cpu, sampler.peak_rss_mib, sampler.max_ssh)


def pdsh_argv(cluster: Cluster, n: int) -> list[str]:
    return ["pdsh", "-R", "ssh", "-f", "64", "-w", ",".join(h.name for h in cluster.hosts[:n]),
            "true"]


def doctor_phases(wall: float, report: dict[str, Any]) -> dict[str, float]:
    """doctor's own account (--json): its checks' time by phase; the rest of the wall time is
    start-up (imports, parsing the command line and inventory), output and exit. The SSH
    handshakes start during start-up (HostPool.connect_ahead, once the inventory is read) and end
    within the facts phase."""
    return {"start-up, output, exit": wall - report["elapsed_s"],
            "facts (handshakes' rest, exec, agent)": report["phases"]["facts_s"],
            "TCP probe between hosts": report["phases"]["probe_s"]}


def false_findings(reports: Sequence[dict[str, Any]]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Fail and warn findings (a healthy cluster should have none): how many in each report, and
    the first NOTES of them over all reports, one line per status and check with its hosts."""
    counts = []
    groups: dict[tuple[str, str], tuple[list[str], str]] = {}
    for report in reports:
        bad = [f for f in report["findings"] if f["status"] in ("fail", "warn")]
        counts.append(len(bad))
        for f in bad:
            hosts, message = groups.setdefault((f["status"], f["check"]), ([], f["message"]))
            host = f["host"] or "(cluster)"
            if host not in hosts:
                hosts.append(host)
    notes = []
    for (status, check), (hosts, message) in list(groups.items())[:NOTES]:
        shown = ", ".join(hosts[:6]) + (f" and {len(hosts) - 6} more" if len(hosts) > 6 else "")
        notes.append(f"{status} {check} on {shown}: {message[:160]}")
    return tuple(counts), tuple(notes)


def measure(cluster: Cluster, homes: str, n: int, repeat: int, cold: bool, tmp: Path,
            python: Path) -> Row:
    inventory = write_inventory(cluster, n, tmp / f"hosts{n}.toml", python)
    doctor = ddpctl_argv("doctor", "-i", str(inventory), "--ssh-config", str(cluster.ssh_config), "--json")
    pdsh_env = {**user_env(), "PDSH_SSH_ARGS_APPEND": f"-F {cluster.ssh_config}"}
    runs: dict[str, list[Run]] = {"pdsh": [], "doctor": []}
    colds: list[float] = []
    timed(doctor, user_env())  # torch facts cached on every host, bytecode written
    for i in range(repeat):
        for tool in (("pdsh", "doctor") if i % 2 == 0 else ("doctor", "pdsh")):
            if tool == "pdsh":
                runs[tool].append(timed(pdsh_argv(cluster, n), pdsh_env))
            else:
                runs[tool].append(timed(doctor, user_env(), sample=True))
        if cold:
            colds.append(timed([*doctor, "--no-cache"], user_env()).wall)
    pdsh, warm = runs["pdsh"], runs["doctor"]
    reports = [json.loads(r.out) for r in warm]
    phases = [doctor_phases(r.wall, report) for r, report in zip(warm, reports, strict=True)]
    ratios = tuple(d.wall / p.wall for d, p in zip(warm, pdsh, strict=True))
    counts, notes = false_findings(reports)
    return Row(homes, n, statistics.median(r.wall for r in pdsh), statistics.median(r.wall for r in warm),
               statistics.median(ratios), ratios, statistics.median(colds) if colds else None, warm[-1].code,
               {k: statistics.median(p[k] for p in phases) for k in phases[0]},
               {tool: Cpu(*(statistics.median(getattr(r.cpu, f) for r in tool_runs)
                            for f in ("own", "machine", "idle", "busy")))
                for tool, tool_runs in runs.items()},
               counts, notes, median([r.peak_rss_mib for r in warm]),
               median([None if r.max_ssh is None else float(r.max_ssh) for r in warm]))


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
          "(the hosts' sshds, shells, agents) | cores left idle while it ran | busy share: every "
          f"process's CPU / (wall x {CORES} cores)")
    for r in rows:
        limit = max(c.busy for c in r.cpu.values()) >= 0.9
        print(f"{r.homes:>7}  {r.hosts:>5}  " + "   ".join(
            f"{tool} {c.own:5.2f} | {c.machine:5.2f} | {c.idle:5.2f} | {c.busy:4.2f}" for tool, c in r.cpu.items())
            + (f"   <- the {CORES} cores are the limit" if limit else ""))
    print("\nddpctl doctor on this machine (medians): peak RSS (VmHWM) | most SSH connections open at once")
    for r in rows:
        print(f"{r.homes:>7}  {r.hosts:>5}  {fmt(r.rss_mib, '7.1f')} MiB | {fmt(r.ssh_conns, '5.0f')}")
    print("\nfalse findings on this healthy cluster: fail + warn findings of each doctor run "
          "(the first few, by status and check)")
    for r in rows:
        print(f"{r.homes:>7}  {r.hosts:>5}  runs: {', '.join(str(c) for c in r.false_findings)}")
        for note in r.finding_notes:
            print(f"{'':>16}{note}")


def fmt(value: float | None, spec: str) -> str:
    return "?".rjust(len(format(0.0, spec))) if value is None else format(value, spec)


def exponent(sizes: Sequence[int], values: Sequence[float | None]) -> float | None:
    """b of value ~ a*N^b: least squares on log-log (None: fewer than two positive points)."""
    points = [(math.log(n), math.log(v)) for n, v in zip(sizes, values, strict=True) if v is not None and v > 0]
    if len(points) < 2 or len({x for x, _ in points}) < 2:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    return (sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points))


def growth(rows: list[Row]) -> None:
    """Per kind of host, a markdown table: each figure by size and its fitted exponent."""
    for homes in dict.fromkeys(r.homes for r in rows):
        mine = [r for r in rows if r.homes == homes]
        sizes = [r.hosts for r in mine]
        figures: dict[str, list[float | None]] = {
            "doctor wall (s)": [r.doctor_s for r in mine],
            "pdsh wall (s)": [r.pdsh_s for r in mine],
            "doctor CPU, ddpctl's process tree (s)": [r.cpu["doctor"].own for r in mine],
            "pdsh CPU, its ssh clients (s)": [r.cpu["pdsh"].own for r in mine],
            "machine CPU during doctor, hosts too (s)": [r.cpu["doctor"].machine for r in mine],
            "doctor peak RSS (MiB)": [r.rss_mib for r in mine],
            "doctor SSH connections at once": [r.ssh_conns for r in mine],
        }
        print(f"\ngrowth, {homes} homes: figure ~ a*N^b, b fitted on log-log over N = "
              f"{', '.join(map(str, sizes))} (medians)\n")
        print("| figure | " + " | ".join(f"N={n}" for n in sizes) + " | b |")
        print("|---|" + "---:|" * (len(sizes) + 1))
        for name, values in figures.items():
            b = exponent(sizes, values)
            cells = " | ".join("?" if v is None else f"{v:.3g}" for v in values)
            print(f"| {name} | {cells} | {'?' if b is None else f'{b:.2f}'} |")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("pdsh") is None:
        print("pdsh is not installed (apt-get install pdsh)", file=sys.stderr)
        return 2
    sizes = sorted({int(s) for arg in args.sizes for s in arg.split(",") if s.strip()})
    kinds = [k.strip() for k in args.homes.split(",") if k.strip()]
    if not kinds or set(kinds) - {"private", "shared"}:
        print(f"--homes {args.homes}: use private, shared or both", file=sys.stderr)
        return 2
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
                if args.no_costs:
                    continue
                inventory = load_inventory(write_inventory(cluster, max(sizes), tmp / "all.toml", python))
                costs[homes] = fixed_costs(cluster.ssh_config, inventory.hosts, 3,
                                           ("doctor's round trip (facts, probe, checks)",
                                            lambda pool, inv=inventory: run_doctor(from_inventory(inv), pool)))
    report(rows)
    growth(rows)
    for homes, figures in costs.items():
        print_costs(f"\nwhere doctor's seconds go at {max(sizes)} hosts, {homes} homes (medians, each alone)",
                    figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
