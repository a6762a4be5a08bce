"""`ddpctl up --metrics-port PORT`: the run's Prometheus series while `up` runs (goodput so far, lost
seconds by kind, cause and host, restarts, the hosts by state, the attempt, steps, stragglers),
served by prometheus-client. The live part comes from the feed (orchestrator/watch/metrics.py);
the rest from the run's events (orchestrator/account) and the host ledger. The names are declared
once in node_agent/wire/metrics.py (docs/metrics.md). Imported only where a port is served:
prometheus-client takes ~0.1 s to import."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from prometheus_client import start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from inventory import ConfigError, Job
from orchestrator.account import events as ev
from orchestrator.account.compute import Account, account
from orchestrator.account.events import EventLog
from orchestrator.hostops.hostbook import screen
from orchestrator.hostops.prom import family
from orchestrator.watch.metrics import Live

ACCOUNT_EVERY = 5.0  # the account is computed again at most this often...
ACCOUNT_SHARE = 0.1  # ...and at most this share of the time (a week's run takes ~1 s: every 10 s)
FINAL_SCRAPE_MAX = 30.0  # after the run, `up` waits for Prometheus' next scrape at most this long
HOST_STATES = ("running", "lost", "out", "spare", "suspect", "quarantined")


@dataclass(frozen=True)
class Reading:
    """What the run's events and the host ledger say as of `at` (read again at most every
    ACCOUNT_EVERY seconds, and at most ACCOUNT_SHARE of the time: a week's account takes a second;
    outside the lock)."""

    at: float
    account: Account | None = None
    attempt: int = 0
    attempt_hosts: tuple[str, ...] | None = None  # None: the events do not say (the job's hosts)
    restarts: dict[str, int] = field(default_factory=dict)  # cause -> restarts charged to it
    ledger: dict[str, set[str]] = field(default_factory=dict)  # host -> suspect / quarantined
    took: float = 0.0  # seconds it took to read


def read_run(events: Sequence[ev.Event], job: Job, now: float) -> Reading:
    attempts = [e for e in events if e.kind == ev.ATTEMPT_START]
    hosts = attempts[-1].get("hosts") if attempts else None
    return Reading(now, account(events, now) if events else None, (attempts[-1].attempt or 0) if attempts else 0,
                   tuple(str(h) for h in hosts) if isinstance(hosts, list) else None,
                   dict(Counter(e.cause or "unknown" for e in events if e.kind == ev.RESTART)), _ledger(job))


class RunMetrics(Collector):
    """One run's series, computed when Prometheus scrapes: the account from the run's events file
    (orchestrator/account), the live state from the current attempt's monitor, the hosts' ledger
    states. Thread-safe: scrapes come on the server's threads, updates on the core's."""

    def __init__(self, job: Job, backend: str, clock: Callable[[], float] = time.time) -> None:
        self.job = job
        self.backend = backend
        self.clock = clock
        self.lock = threading.Lock()
        self.events: EventLog | None = None
        self.run_id = ""
        self.live = Live()
        self.running = True
        self.reading: Reading | None = None
        self.scrapes: list[float] = []  # when the last few scrapes came (the final wait reads them)
        self.scraped = threading.Condition(self.lock)

    def attach(self, events: EventLog, run_id: str) -> None:
        """The run's events log (one per run, shared by its attempts)."""
        with self.lock:
            self.events, self.run_id = events, run_id

    def update(self, live: Live) -> None:
        with self.lock:
            self.live = live

    def ended(self) -> None:
        with self.lock:
            self.running = False
            self.reading = None

    # -- the scrape --------------------------------------------------------------------------
    def collect(self) -> Iterable[Metric]:
        with self.lock:
            now, log, reading = self.clock(), self.events, self.reading
            live, running, run = self.live, self.running, [self.job.name, self.run_id]
        if reading is None or now - reading.at >= max(ACCOUNT_EVERY, reading.took / ACCOUNT_SHARE) or not running:
            started = time.perf_counter()
            reading = read_run(log.events() if log is not None else [], self.job, now)
            reading = replace(reading, took=time.perf_counter() - started)
            with self.lock:
                self.reading = reading
        families = self._families(run, reading, live, running)
        with self.lock:
            self.scrapes = [*self.scrapes[-3:], now]
            self.scraped.notify_all()
        return families

    def _families(self, run: list[str], reading: Reading, live: Live, running: bool) -> list[Metric]:
        out = [_one("ddpctl_run_info", [*run, self.backend], 1.0),
               _one("ddpctl_run_running", run, 1.0 if running else 0.0),
               _one("ddpctl_run_attempt", run, float(reading.attempt))]
        if live.steps is not None:
            out.append(_one("ddpctl_run_steps", run, float(live.steps)))
        if live.last_step is not None:
            out.append(_one("ddpctl_run_last_step_timestamp_seconds", run, live.last_step))
        if reading.account is not None:
            out += self._account(run, reading.account)
        restarts = family("ddpctl_run_restarts")
        for reason, count in reading.restarts.items():
            restarts.add_metric([*run, reason], float(count))
        hosts = _host_states(self.job, reading.attempt_hosts, live.lost, reading.ledger)
        counted = family("ddpctl_run_hosts")
        for state in HOST_STATES:
            counted.add_metric([*run, state], float(sum(1 for s in hosts.values() if state in s)))
        lost = family("ddpctl_run_host_lost")
        for host in sorted(live.lost):
            lost.add_metric([*run, host], 1.0)
        stragglers = family("ddpctl_run_straggler")
        for (host, local), rank in sorted(live.stragglers.items()):
            stragglers.add_metric([*run, host, str(rank if rank is not None else f"local {local}")], 1.0)
        return [*out, restarts, counted, lost, stragglers]

    @staticmethod
    def _account(run: list[str], found: Account) -> list[Metric]:
        out = [_one("ddpctl_run_wall_seconds", run, found.wall_s),
               _one("ddpctl_run_productive_seconds", run, found.productive_s)]
        if found.goodput is not None:
            out.append(_one("ddpctl_run_goodput_ratio", run, found.goodput))
        lost = family("ddpctl_run_lost_seconds")
        summed: dict[tuple[str, str, str], float] = {}
        for part in found.parts:
            key = (part.kind, part.cause, part.host or "")
            summed[key] = summed.get(key, 0.0) + part.seconds
        for (kind, cause, host), seconds in sorted(summed.items()):
            lost.add_metric([*run, kind, cause, host], seconds)
        return [*out, lost]

    def final_wait(self) -> float:
        """How long to wait for Prometheus' next scrape after the run: twice the interval it has
        been scraping at, at most FINAL_SCRAPE_MAX (0: it has not scraped twice)."""
        with self.lock:
            if len(self.scrapes) < 2:
                return 0.0
            return min(2 * (self.scrapes[-1] - self.scrapes[-2]), FINAL_SCRAPE_MAX)

    def wait_final_scrape(self, limit: float) -> bool:
        """Wait up to `limit` seconds for one more scrape; False: none came."""
        with self.lock:
            seen = len(self.scrapes), self.scrapes[-1] if self.scrapes else None
            return self.scraped.wait_for(
                lambda: (len(self.scrapes), self.scrapes[-1] if self.scrapes else None) != seen, timeout=limit)


def _one(name: str, labels: list[str], value: float) -> Metric:
    """A family of one sample."""
    made = family(name)
    made.add_metric(labels, value)
    return made


def _ledger(job: Job) -> dict[str, set[str]]:
    """The job's hosts and spares the ledger holds suspect or quarantined (never fails a scrape)."""
    try:
        found = screen(job, [*job.hosts, *job.spares])
    except Exception:  # the ledger never stops a run, nor its metrics
        return {}
    out = {name: {"quarantined"} for name in found.quarantined}
    for name in found.suspect:
        out.setdefault(name, set()).add("suspect")
    return out


def _host_states(job: Job, attempt_hosts: tuple[str, ...] | None, lost: set[str],
                 ledger: dict[str, set[str]]) -> dict[str, set[str]]:
    """Each of the job's hosts and spares -> its states now: running or lost (in this attempt), out
    of it (left out) or a spare (waiting), and the ledger's suspect or quarantined."""
    current = set(attempt_hosts) if attempt_hosts is not None else {h.name for h in job.hosts}
    names = [h.name for h in (*job.hosts, *job.spares)]
    states: dict[str, set[str]] = {}
    for name in names:
        spare = any(h.name == name for h in job.spares)
        here = {"lost"} if name in lost else {"running"} if name in current else {"spare" if spare else "out"}
        states[name] = here
    for name in names:
        states[name] |= ledger.get(name, set())
    return states


# -- the server ---------------------------------------------------------------------------------
class MetricsServer:
    """prometheus-client's HTTP server for one run's RunMetrics, on `port` (all addresses)."""

    def __init__(self, metrics: RunMetrics, port: int) -> None:
        self.metrics = metrics
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(metrics)
        try:
            self.server, self.thread = start_http_server(port, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"--metrics-port {port}: cannot serve metrics there ({exc.strerror or exc})",
                              key="metrics.port", hint="give a free port (`ddpctl kill-port PORT` shows who holds "
                              "it), or leave [metrics] port out") from exc
        self.port = int(self.server.server_address[1])  # the one bound (port 0: a free one)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
