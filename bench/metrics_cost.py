"""What the Prometheus series cost, on this machine, no cluster. A host's textfile for a node of
--ranks ranks and as many GPUs: the time to build and atomically write it (node_agent's stdlib
writer) beside prometheus-client's generate_latest for the same series, its size, and its share of
one core at the default 5 s interval. `up --metrics-port`'s page for a synthetic run of --days
days (bench/time_account.py's week: a progress event every 5 s): the first scrape, which computes
the account, and the next ones, which reuse it for 5 s, served over HTTP by prometheus-client.
Prints figures; asserts nothing."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from prometheus_client import generate_latest  # noqa: E402
from prometheus_client.registry import CollectorRegistry  # noqa: E402

from bench.time_account import week_of_events  # noqa: E402
from inventory import Host, Inventory, Job  # noqa: E402
from node_agent.runtime.metrics_file import JobLabels, MetricsFile, job_series, job_text  # noqa: E402
from node_agent.wire.replies_top import GpuStat  # noqa: E402
from orchestrator.account.events import EventLog  # noqa: E402
from orchestrator.hostops.prom import family  # noqa: E402
from orchestrator.watch.run_metrics import MetricsServer, RunMetrics  # noqa: E402

WINDOW = {"steps": 9, "seconds": 2.1, "p50_ms": 231.4, "p95_ms": 260.2,
          "ddp": {"n": 9, "wait_ms": 31.2, "data_ms": 4.9, "compute_ms": 190.3}}


def node(ranks: int) -> tuple[JobLabels, dict[str, dict[str, Any]], tuple[GpuStat, ...]]:
    labels = JobLabels("gpu-node-017", "llama-7b-finetune", "llama-7b-finetune-0412-1", "llama-7b-finetune-0412-1.2",
                       3, 2)
    records = {f"{r}.step": {"phase": "step", "local_rank": r, "rank": 3 * ranks + r, "time": time.time(),
                             "step": 123456, "window": WINDOW} for r in range(ranks)}
    gpus = tuple(GpuStat(r, f"GPU-{r:08x}-1111-2222-3333-444455556666", "NVIDIA H100 80GB HBM3", 97.0, 71234.0,
                         81559.0, 650.0) for r in range(ranks))
    return labels, records, gpus


def best_of(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def host_side(ranks: int, repeat: int) -> None:
    labels, records, gpus = node(ranks)
    text = job_text(labels, time.time(), records, {1}, gpus, None)
    with tempfile.TemporaryDirectory() as tmp:
        out = MetricsFile(tmp, "job", 3)
        ours = best_of(lambda: out.write(job_text(labels, time.time(), records, {1}, gpus, None)), repeat)
    series = job_series(labels, time.time(), records, {1}, gpus, None)

    class Families:
        def collect(self) -> Any:
            return [family(name, samples) for name, samples in series]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families())  # type: ignore[arg-type]
    theirs = best_of(lambda: generate_latest(registry), repeat)
    print(f"host textfile, {ranks} ranks and {ranks} GPUs: {len(text.splitlines())} lines, {len(text) / 1024:.1f} KiB")
    print(f"  build + atomic write (node_agent, stdlib): {ours * 1e3:.2f} ms; prometheus-client's generate_latest "
          f"alone for the same series: {theirs * 1e3:.2f} ms (ratio {ours / theirs:.2f})")
    print(f"  one core's share at the default 5 s interval: {ours / 5 * 100:.3f} %")


def up_side(days: float, repeat: int) -> None:
    hosts = tuple(Host(f"node{i}", f"198.18.0.{10 + i}") for i in range(8))
    job = Job(name="week", inventory=Inventory(hosts), hosts=hosts, script="train.py")
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "week"
        count = week_of_events(run_dir, days)
        log = EventLog(run_dir)
        metrics = RunMetrics(job, "ssh")
        metrics.attach(log, "week")
        server = MetricsServer(metrics, 0)
        port = server.port
        try:
            def scrape() -> bytes:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as reply:
                    return bytes(reply.read())

            started = time.perf_counter()
            page = scrape()
            first = time.perf_counter() - started
            cached = best_of(scrape, repeat)
        finally:
            server.close()
    print(f"up's page, a {days:g}-day run ({count} events): {len(page) / 1024:.1f} KiB")
    print(f"  first scrape (reads the events, computes the account): {first:.2f} s; the next ones within 5 s: "
          f"{cached * 1e3:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    host_side(args.ranks, args.repeat)
    up_side(args.days, max(args.repeat // 5, 3))


if __name__ == "__main__":
    main()
