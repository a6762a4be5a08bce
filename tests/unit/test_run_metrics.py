"""`up --metrics-port`'s series (orchestrator/watch/metrics.py): the account so far, restarts, the
hosts by state, the live steps and stragglers; the page passes promtool; a port in use is a clear
error before anything starts; the monitor tells a host with a textfile of its stragglers."""

from __future__ import annotations

import socket
import threading
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from inventory import ConfigError, Host, Inventory, Job
from orchestrator.account.events import EventLog
from orchestrator.launch.monitor_api import Flag
from orchestrator.launch.plan import HostLaunch, LaunchPlan
from orchestrator.launch.result import Span
from orchestrator.watch.job_state import Watch
from orchestrator.watch.metrics import Live, MetricsFeed
from orchestrator.watch.run_metrics import MetricsServer, RunMetrics
from tests.unit.test_account import LOST_HOST, T0
from tests.unit.test_metrics_file import promtool_ok, samples, value

NODE0, NODE1, SPARE = Host("node0", "198.18.0.10"), Host("node1", "198.18.0.11"), Host("node2", "198.18.0.12",
                                                                                     spare=True)


def job() -> Job:
    return Job(name="train", inventory=Inventory((NODE0, NODE1, SPARE)), hosts=(NODE0, NODE1), script="t.py")


def scraped(metrics: RunMetrics) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    return generate_latest(registry).decode()


def test_the_run_so_far_from_its_events_and_the_live_state(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    for e in LOST_HOST[:14]:  # to attempt 1's first step: the run goes on
        log.add(e.kind, e.t, attempt=e.attempt, host=e.host, cause=e.cause, step=e.step,
                **({**e.extra, "hosts": ["node1", "node2"]} if e.kind == "attempt start" and e.attempt == 1
                   else e.extra))
    metrics = RunMetrics(job(), "ssh", clock=lambda: T0 + 150)
    metrics.attach(log, "train-r1")
    metrics.update(Live(steps=88, last_step=T0 + 149.5, stragglers={("node1", 1): 3}, lost=set()))
    text = scraped(metrics)
    parsed = samples(text)
    run = {"job_name": "train", "run": "train-r1"}
    assert value(parsed, "ddpctl_run_info", backend="ssh", **run) == 1
    assert value(parsed, "ddpctl_run_running", **run) == 1
    assert value(parsed, "ddpctl_run_attempt", **run) == 1
    assert value(parsed, "ddpctl_run_steps", **run) == 88
    assert value(parsed, "ddpctl_run_last_step_timestamp_seconds", **run) == T0 + 149.5
    assert value(parsed, "ddpctl_run_wall_seconds", **run) == pytest.approx(150)
    productive = value(parsed, "ddpctl_run_productive_seconds", **run)
    assert value(parsed, "ddpctl_run_goodput_ratio", **run) == pytest.approx(productive / 150)
    assert value(parsed, "ddpctl_run_lost_seconds", kind="detection", Hostname="node0") == pytest.approx(60.1, abs=0.2)
    assert value(parsed, "ddpctl_run_lost_seconds", kind="start-up", Hostname="") > 0
    assert value(parsed, "ddpctl_run_restarts_total", reason="lost", **run) == 1
    # node2, the spare, runs attempt 1 in node0's place
    assert value(parsed, "ddpctl_run_hosts", state="running") == 2
    assert value(parsed, "ddpctl_run_hosts", state="out") == 1  # node0, lost in attempt 0
    assert value(parsed, "ddpctl_run_hosts", state="spare") == 0
    assert value(parsed, "ddpctl_run_straggler", Hostname="node1", rank="3") == 1
    promtool_ok(text)
    metrics.ended()
    assert value(samples(scraped(metrics)), "ddpctl_run_running") == 0


def test_a_run_without_events_yet_says_only_that_it_runs() -> None:
    parsed = samples(scraped(RunMetrics(job(), "slurm")))
    assert value(parsed, "ddpctl_run_running") == 1 and value(parsed, "ddpctl_run_attempt") == 0
    assert not [k for k in parsed if k[0] in ("ddpctl_run_goodput_ratio", "ddpctl_run_wall_seconds")]


def test_the_server_serves_the_page_and_a_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ConfigError) as raised:
            MetricsServer(RunMetrics(job(), "ssh"), port)
        assert f"--metrics-port {port}" in str(raised.value) and "in use" in str(raised.value).lower()
    server = MetricsServer(RunMetrics(job(), "ssh"), _free())
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as reply:
            page = reply.read().decode()
        assert 'ddpctl_run_running{job_name="train",run=""} 1.0' in page
    finally:
        server.close()


def _free() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def test_the_final_values_wait_for_one_more_scrape_at_most_twice_the_interval() -> None:
    times = iter([100.0, 100.2, 100.4])  # Prometheus scrapes every 0.2 s
    metrics = RunMetrics(job(), "ssh", clock=lambda: next(times))
    assert metrics.final_wait() == 0  # never scraped: nobody to wait for
    scraped(metrics)
    scraped(metrics)
    assert metrics.final_wait() == pytest.approx(0.4)
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(metrics.wait_final_scrape(0.4)))
    waiter.start()
    scraped(metrics)
    waiter.join(5)
    assert got == [True]
    assert metrics.wait_final_scrape(0.4) is False  # no scrape comes: given up


def test_the_feed_flags_stragglers_on_hosts_with_a_textfile_only() -> None:
    textfile = Host("node0", "198.18.0.10", metrics_dir="/var/lib/prometheus/node-exporter")
    plan = LaunchPlan(job(), "train-1", "127.0.0.1", 29500, tuple(
        HostLaunch(h, i, 2, ("python",), ("t.py",), {}, "/w") for i, h in enumerate((textfile, NODE1))))
    watch = Watch(job().watch)
    feed = MetricsFeed(plan, watch, None)
    watch.episodes[("node0", 1)] = Span(T0)
    watch.episodes[("node1", 0)] = Span(T0)
    assert list(feed.on_tick(None)) == [Flag("node0", 1, True)]  # type: ignore[arg-type]
    assert list(feed.on_tick(None)) == []  # type: ignore[arg-type]
    del watch.episodes[("node0", 1)]
    assert list(feed.on_tick(None)) == [Flag("node0", 1, False)]  # type: ignore[arg-type]


def test_a_slow_account_is_read_again_at_most_a_tenth_of_the_time(tmp_path: Path) -> None:
    """A week's account takes about a second: scrapes meanwhile reuse the last reading."""
    log = EventLog(tmp_path)
    for e in LOST_HOST[:3]:
        log.add(e.kind, e.t, attempt=e.attempt, host=e.host, cause=e.cause, step=e.step, **e.extra)
    now = [T0 + 10.0]
    metrics = RunMetrics(job(), "ssh", clock=lambda: now[0])
    metrics.attach(log, "r1")
    scraped(metrics)
    assert metrics.reading is not None
    metrics.reading = replace(metrics.reading, took=2.0)  # as if it had taken 2 s
    log.add("restart", T0 + 11, attempt=1, cause="lost")
    now[0] = T0 + 25.0  # 15 s later: past ACCOUNT_EVERY, within 10 x 2 s
    assert not [k for k in samples(scraped(metrics)) if k[0] == "ddpctl_run_restarts_total"]
    now[0] = T0 + 31.0
    assert value(samples(scraped(metrics)), "ddpctl_run_restarts_total", reason="lost") == 1
