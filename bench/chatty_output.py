"""A chatty job: `ddpctl up` beside the same torchrun started by hand over ssh, on a real namespace cluster.

2 hosts x 2 ranks (--hosts, --nproc), each rank printing --lines lines (default 100,000) of
--width bytes (train_jobs/chatty.py: print(), no sleep) and exiting. --runs times, interleaved:
(a) `ddpctl up job.toml`, its stdout redirected to a file; (b) the manual recipe, the same torchrun
command line (`--max-restarts 0 --tee 3`) started on every host at once by `ssh host torchrun ...`,
each ssh's output redirected to a file. Prints each run's wall times and ratio ddpctl / manual
(target <= 1.3, the median of the per-run ratios), ddpctl's peak RSS and CPU seconds (its own
process, from wait4) beside the ssh clients', and checks ddpctl's output: every rank's lines present
exactly once, in order and intact (missing / duplicate / out-of-order / corrupt counts), in its
stdout and in runs/<job id>/<host>.log, and the manual recipe's output the same way. torchrun's
--tee itself can cut a line (its tail thread reads a rank's log file while the rank is mid-write and
prints the two halves as two lines, another rank's line between them; the manual recipe's output
shows it too): so ddpctl's stdout is also compared with its host logs, which hold each host's
output as it reached ddpctl (0 = the controller relayed exactly what it got).
A missed target is a figure, not a failure: the exit code
is non-zero only when a measurement broke (a launcher failed or a run passed --cap).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.jobwatch import (  # noqa: E402
    DDPCTL_HELP,
    Ddpctl,
    job_id_of,
    kill_job,
    median,
    scratch,
    secs,
    start_ddpctl,
    start_manual,
)
from tests.cluster import Cluster, start_cluster  # noqa: E402
from train_jobs.chatty import line_text  # noqa: E402

TARGET = 1.3
DDPCTL_LABEL = re.compile(r"^\[(?P<host>[^\]:\s]+)(?::(?P<rank>\d+))?\]")  # `[node0:1]  text`, `[node0]  text`
TORCHRUN_LINE = re.compile(r"^\[(?P<role>[A-Za-z_]*?)(?P<local>\d+)\]:(?P<text>.*)$")  # `[default1]:text`
CHATTY_TEXT = re.compile(r"^rank (?P<rank>\d+) line (?P<i>\d+) ")


@dataclass
class Tally:
    """Which lines of which ranks a stream held: each rank's lines 0..n-1 once, in order, intact."""

    ranks: list[int]
    n: int
    width: int
    counts: dict[int, list[int]] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)
    out_of_order: int = 0
    corrupt: int = 0  # a chatty line whose text differs from what the rank printed
    misattributed: int = 0  # shown under another rank (or host) than the one that printed it
    foreign: int = 0  # a line of a rank this stream should not hold

    def __post_init__(self) -> None:
        self.counts = {r: [0] * self.n for r in self.ranks}
        self.last = {r: -1 for r in self.ranks}

    def add(self, shown_rank: int | None, text: str) -> None:
        m = CHATTY_TEXT.match(text)
        if m is None:
            if "line " in text and "rank " in text:
                self.corrupt += 1  # a chatty line cut or merged with another
            return
        rank, i = int(m.group("rank")), int(m.group("i"))
        if shown_rank is not None and shown_rank != rank:
            self.misattributed += 1
        if rank not in self.counts or not 0 <= i < self.n:
            self.foreign += 1
            return
        if text != line_text(rank, i, self.n, self.width):
            self.corrupt += 1
            return
        self.counts[rank][i] += 1
        if i < self.last[rank]:
            self.out_of_order += 1
        self.last[rank] = max(self.last[rank], i)

    @property
    def missing(self) -> int:
        return sum(c.count(0) for c in self.counts.values())

    @property
    def duplicates(self) -> int:
        return sum(x - 1 for c in self.counts.values() for x in c if x > 1)

    @property
    def clean(self) -> bool:
        return not (self.missing or self.duplicates or self.out_of_order or self.corrupt or self.misattributed
                    or self.foreign)

    def per_rank_missing(self) -> dict[int, int]:
        return {r: c.count(0) for r, c in self.counts.items()}

    def report(self) -> str:
        return (f"missing {self.missing}, duplicate {self.duplicates}, out of order {self.out_of_order}, "
                f"corrupt {self.corrupt}, misattributed {self.misattributed}, foreign {self.foreign}")


def text_lines(path: Path) -> Iterator[str]:
    with path.open("rb") as f:
        for raw in f:
            yield raw.decode("utf-8", "replace").rstrip("\r\n")


def tally_ddpctl(out: Path, ranks: list[int], n: int, width: int, hosts: dict[int, str], label: int) -> Tally:
    """ddpctl's stdout: `[host:rank] text`; a line is misattributed if its rank or host is wrong."""
    t = Tally(ranks, n, width)
    for host, rank, text in ddpctl_lines(out, label):
        if rank is None:
            if CHATTY_TEXT.search(text):
                t.corrupt += 1
            continue
        if hosts.get(rank) != host:
            t.misattributed += 1
        t.add(rank, text)
    return t


def ddpctl_lines(out: Path, width: int) -> Iterator[tuple[str, int | None, str]]:
    """(host, rank or None, text) of each `[host:rank] text` / `[host] text` line of ddpctl's stdout;
    the label is padded to `width` columns (the longest host name + 6), the text follows as is."""
    for line in text_lines(out):
        m = DDPCTL_LABEL.match(line)
        if m is not None:
            rank = m.group("rank")
            yield m.group("host"), (int(rank) if rank is not None else None), line[max(m.end(), width):]


def relay_diff(out: Path, logs: dict[str, Path], width: int, nproc: int, hosts: list[str]) -> dict[str, int]:
    """Per host, lines that ddpctl's stdout and the host's log (the host's torchrun --tee output, which
    ddpctl writes as it arrives) do not share: 0 where ddpctl relayed exactly what it got, in order."""
    shown: dict[str, list[tuple[int | None, str]]] = {h: [] for h in hosts}
    for host, rank, text in ddpctl_lines(out, width):
        if host in shown:
            shown[host].append((rank, text))
    diffs: dict[str, int] = {}
    for node, host in enumerate(hosts):
        logged: list[tuple[int | None, str]] = []
        if logs[host].exists():
            for line in text_lines(logs[host]):
                m = TORCHRUN_LINE.match(line)
                logged.append((node * nproc + int(m.group("local")), m.group("text")) if m else (None, line))
        a, b = shown[host], logged
        if a == b:
            diffs[host] = 0
            continue
        ca, cb = Counter(a), Counter(b)
        diffs[host] = max(1, sum(((ca - cb) + (cb - ca)).values()))  # order alone differs: still 1
    return diffs


def tally_torchrun(lines: Iterable[str], ranks: list[int], n: int, width: int, node: int, nproc: int) -> Tally:
    """torchrun's --tee output (a host log of ddpctl's, or a manual ssh's): `[default<local>]:text`."""
    t = Tally(ranks, n, width)
    for line in lines:
        m = TORCHRUN_LINE.match(line)
        if m is None:
            if CHATTY_TEXT.search(line):
                t.corrupt += 1
            continue
        t.add(node * nproc + int(m.group("local")), m.group("text"))
    return t


@dataclass
class RunOut:
    wall: float | None
    ok: bool
    why: str = ""
    rss_mib: float | None = None
    cpu_s: float | None = None
    checks: dict[str, Tally] = field(default_factory=dict)
    relay: dict[str, int] = field(default_factory=dict)  # ddpctl: stdout vs host log, lines not shared
    host_bytes: int | None = None  # ddpctl: what the run left in the hosts' ~/.ddpctl/runs/<job id>
    here_bytes: int | None = None  # ... and in runs/<job id> here


def tree_bytes(path: Path) -> int:
    """Bytes of the files under `path` (0 where it is gone)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


class Runner:
    """One cluster; every run gets its own job name, job id and master port."""

    def __init__(self, ddpctl: Ddpctl, cluster: Cluster, tmp: Path, opts: argparse.Namespace) -> None:
        self.tool, self.cluster, self.tmp, self.opts = ddpctl, cluster, tmp, opts
        self.serial = 0
        self.hosts = len(cluster.hosts)
        self.ranks = list(range(self.hosts * opts.nproc))
        self.args = ["--lines", str(opts.lines), "--width", str(opts.width)]

    def _next(self, mode: str) -> tuple[str, int]:
        self.serial += 1
        return f"{mode}-{self.serial}", 29800 + self.serial

    def ddpctl(self) -> RunOut:
        name, port = self._next("ddpctl")
        child, runs = start_ddpctl(self.tool, self.cluster, self.tmp, name, port, self.args, nproc=self.opts.nproc)
        job_id = job_id_of(runs, child, self.opts.cap)
        try:
            if not child.wait(self.opts.cap):
                return RunOut(None, False, f"ddpctl still running after {self.opts.cap:.0f}s")
        finally:
            kill_job(self.cluster, [child], job_id)
        out = RunOut(child.wall, child.code == 0, rss_mib=child.peak_rss_mib, cpu_s=child.cpu_s)
        if child.code != 0:
            err = (self.tmp / f"{name}.err").read_text(errors="replace")[-1500:]
            out.why = f"ddpctl exited {child.code}: {err}"
        nproc, n, w = self.opts.nproc, self.opts.lines, self.opts.width
        where = {r: self.cluster.hosts[r // nproc].name for r in self.ranks}
        label = max(len(h.name) for h in self.cluster.hosts) + 6
        out.checks["stdout"] = tally_ddpctl(self.tmp / f"{name}.out", self.ranks, n, w, where, label)
        logs = {h.name: runs / (job_id or "?") / f"{h.name}.log" for h in self.cluster.hosts}
        for i, h in enumerate(self.cluster.hosts):
            log = logs[h.name]
            mine = [r for r in self.ranks if r // nproc == i]
            out.checks[f"{h.name}.log"] = (tally_torchrun(text_lines(log), mine, n, w, i, nproc) if log.exists()
                                           else Tally(mine, n, w))
        out.relay = relay_diff(self.tmp / f"{name}.out", logs, label, nproc, [h.name for h in self.cluster.hosts])
        # the hosts share this machine's home (the cluster's default): their run state is readable here
        out.host_bytes = tree_bytes(Path.home() / ".ddpctl" / "runs" / (job_id or "?"))
        out.here_bytes = tree_bytes(runs / (job_id or "?"))
        return out

    def manual(self) -> RunOut:
        name, port = self._next("manual")
        job_id = f"manual-{name}-{time.time_ns()}"
        children = start_manual(self.cluster, self.tmp, name, job_id, port, self.args, nproc=self.opts.nproc)
        try:
            deadline = time.monotonic() + self.opts.cap
            if not all(c.wait(max(0.0, deadline - time.monotonic())) for c in children):
                return RunOut(None, False, f"an ssh still running after {self.opts.cap:.0f}s")
        finally:
            kill_job(self.cluster, children, job_id)
        ended = [c.ended for c in children if c.ended is not None]
        out = RunOut(max(ended) - min(c.started for c in children), all(c.code == 0 for c in children),
                     cpu_s=sum(c.cpu_s or 0.0 for c in children))
        if not out.ok:
            out.why = f"ssh exit codes {[c.code for c in children]}"
        nproc = self.opts.nproc
        for i, h in enumerate(self.cluster.hosts):
            mine = [r for r in self.ranks if r // nproc == i]
            out.checks[h.name] = tally_torchrun(text_lines(self.tmp / f"{name}.{h.name}.out"), mine,
                                                self.opts.lines, self.opts.width, i, nproc)
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="interleaved runs of each launcher (median)")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--nproc", type=int, default=2, help="ranks per host")
    parser.add_argument("--lines", type=int, default=100_000, help="lines each rank prints")
    parser.add_argument("--width", type=int, default=72, help="bytes per line (newline excluded)")
    parser.add_argument("--cap", type=float, default=240.0, help="seconds before a run is called a hang")
    parser.add_argument("--keep", type=Path, default=None, help="keep the outputs in this directory")
    parser.add_argument("--ddpctl", default=None, metavar="TREE_OR_REV", help=DDPCTL_HELP)
    opts = parser.parse_args(argv)
    total = opts.hosts * opts.nproc
    print(f"chatty job: {opts.hosts} hosts x {opts.nproc} ranks, {opts.lines:,} lines of {opts.width} bytes "
          f"per rank ({total * opts.lines * (opts.width + 1) / 1e6:.1f} MB in all), {opts.runs} interleaved runs",
          flush=True)
    broken: list[str] = []
    results: dict[str, list[RunOut]] = {"ddpctl": [], "manual": []}
    with contextlib.ExitStack() as stack:
        ddpctl = Ddpctl(opts.ddpctl, stack)
        print(f"ddpctl: {ddpctl.label}", flush=True)
        d, tmp = scratch(stack, opts.keep)
        with start_cluster(opts.hosts, Path(d) / "cluster") as cluster:
            runner = Runner(ddpctl, cluster, tmp, opts)
            for i in range(opts.runs):
                order = ("ddpctl", "manual") if i % 2 == 0 else ("manual", "ddpctl")
                took: dict[str, RunOut] = {}
                for mode in order:
                    took[mode] = runner.ddpctl() if mode == "ddpctl" else runner.manual()
                    results[mode].append(took[mode])
                    if not took[mode].ok:
                        broken.append(f"run {i + 1} {mode}: {took[mode].why}")
                d_run, m_run = took["ddpctl"], took["manual"]
                ratio = (f"{d_run.wall / m_run.wall:.2f}" if d_run.wall and m_run.wall else "?")
                checks = "; ".join(f"{k}: {'ok' if t.clean else t.report()}" for k, t in d_run.checks.items())
                manual_checks = "; ".join(f"{k}: {'ok' if t.clean else t.report()}" for k, t in m_run.checks.items())
                print(f"run {i + 1} ({order[0]} first): ddpctl {secs(d_run.wall, opts.cap)}, manual "
                      f"{secs(m_run.wall, opts.cap)}, ratio {ratio}; ddpctl peak RSS "
                      f"{d_run.rss_mib or 0:.0f} MiB, CPU {d_run.cpu_s or 0:.1f}s (the {opts.hosts} ssh clients "
                      f"{m_run.cpu_s or 0:.1f}s)\n      ddpctl output vs the ranks' prints: {checks}\n"
                      f"      ddpctl stdout vs its host logs (each host's output as it reached ddpctl), lines not "
                      f"shared: "
                      f"{', '.join(f'{h} {v}' for h, v in d_run.relay.items())}\n"
                      f"      manual output vs the ranks' prints: {manual_checks}",
                      flush=True)
    d_runs, m_runs = results["ddpctl"], results["manual"]
    ratios = [d.wall / m.wall for d, m in zip(d_runs, m_runs, strict=True) if d.wall and m.wall]
    ratio = statistics.median(ratios) if ratios else None
    rss = [r.rss_mib for r in d_runs if r.rss_mib is not None]
    print("\nsummary (medians over runs)")
    print(f"  wall time             ddpctl {secs(median([r.wall for r in d_runs]), opts.cap)}   "
          f"manual {secs(median([r.wall for r in m_runs]), opts.cap)}")
    print(f"  ddpctl / manual       {f'{ratio:.2f}' if ratio is not None else '?'}   (target <= {TARGET}; "
          f"{'met' if ratio is not None and ratio <= TARGET else 'missed'}) per run: "
          f"{', '.join(f'{r:.2f}' for r in ratios)}")
    print(f"  ddpctl peak RSS       {statistics.median(rss) if rss else 0:.0f} MiB (max {max(rss, default=0):.0f})")
    print(f"  CPU seconds           ddpctl's process {median([r.cpu_s for r in d_runs]) or 0:.1f}s   "
          f"the ssh clients {median([r.cpu_s for r in m_runs]) or 0:.1f}s")
    keys = list(d_runs[0].checks) if d_runs else []
    for k in keys:
        ts = [r.checks[k] for r in d_runs if k in r.checks]
        bad = [t for t in ts if not t.clean]
        print(f"  ddpctl {k:<14} {len(ts) - len(bad)}/{len(ts)} runs complete and in order"
              + (f"; worst: {max(bad, key=lambda t: t.missing + t.duplicates + t.out_of_order).report()}"
                 if bad else ""))
    kept = [(r.host_bytes, r.here_bytes) for r in d_runs if r.host_bytes is not None]
    if kept:
        print(f"  bytes kept            on the hosts {median([float(h) for h, _ in kept]) or 0:,.0f} "
              f"(~/.ddpctl/runs/<job id>, all hosts), here {median([float(h or 0) for _, h in kept]) or 0:,.0f} "
              "(runs/<job id>)")
    relay_bad = sum(any(r.relay.values()) for r in d_runs)
    print(f"  ddpctl stdout = logs  {len(d_runs) - relay_bad}/{len(d_runs)} runs (stdout relays every host log line, "
          "in order)")
    manual_bad = sum(not t.clean for r in m_runs for t in r.checks.values())
    print(f"  manual outputs        {'all complete and in order' if not manual_bad else f'{manual_bad} incomplete'}")
    if broken:
        print("\nbroken measurements:\n  " + "\n  ".join(broken))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
