"""One running job, seen from its ranks' step records: progress (step, steps/s, step time, ETA),
stragglers (each from when it slowed to when it is back to pace), a stall (no rank stepped for
max(hang_after, 5 x the p95 step time)), and the findings, kept for summary.json and the report at
the end (report.json, report.html).

Its monitor (orchestrator/watch/progress.py) feeds it the core's events and asks it on the core's
timer; it decides nothing about the job's fate."""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from inventory.model import WatchSpec
from orchestrator.launch.progress import Status, duration
from orchestrator.launch.result import Finding, Span
from orchestrator.remote.wire import HostSample, RankPhase, StepWindow
from orchestrator.watch.straggler import BackToPace, RankWindow, Slowed, StragglerWatch

STALL_P95_FACTOR = 5.0  # a stall is max(hang_after, this x the p95 step time) without a step
POINTS = 4000  # throughput points, per-rank windows and host samples kept (then thinned, halving the resolution)
IDLE_UTIL_PCT = 5.0  # a job's GPU at or below this, for [watch] gpu_idle_after, is idle
CREEP_SAMPLES = 12  # memory creeping: risen in all but one of the last this many samples...
CREEP_FRACTION = 0.10  # ...by this much of where it started...
CREEP_MIB = 64.0  # ...and by at least this many MiB


@dataclass
class RankHistory:
    host: str
    local_rank: int
    rank: int | None = None
    step: int = 0
    windows: list[StepWindow] = field(default_factory=list)  # thinned past POINTS

    def add(self, window: StepWindow) -> None:
        self.windows.append(window)
        if len(self.windows) > POINTS:
            self.windows = self.windows[::2]

    def to_json(self) -> dict[str, Any]:
        p50s = sorted(w.p50_ms for w in self.windows)
        out: dict[str, Any] = {"rank": self.rank, "host": self.host, "local_rank": self.local_rank,
                               "steps": self.step, "step_ms": None, "hist": None}
        if p50s:
            out["step_ms"] = {"min": p50s[0], "p50": _quantile(p50s, 0.5),
                              "p95": max(_quantile(p50s, 0.95), _quantile(sorted(w.p95_ms for w in self.windows), 0.5)),
                              "max": max(w.p95_ms for w in self.windows)}
            out["hist"] = _histogram(p50s)
        for key in ("wait_ms", "data_ms", "compute_ms"):
            values = sorted(v for v in (getattr(w, key) for w in self.windows) if v is not None)
            out[key] = round(_quantile(values, 0.5), 3) if values else None
        return out


def _quantile(ordered: Sequence[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _histogram(ordered: Sequence[float], bins: int = 20) -> dict[str, list[float] | list[int]]:
    low, high = ordered[0], ordered[-1]
    width = (high - low) / bins if high > low else 1.0
    counts = [0] * bins
    for v in ordered:
        counts[min(bins - 1, int((v - low) / width))] += 1
    return {"edges_ms": [round(low + i * width, 3) for i in range(bins + 1)], "counts": counts}


class Watch:
    """Fed by the supervision (its own thread only); asked for findings, stalls and the status."""

    def __init__(self, spec: WatchSpec) -> None:
        self.spec = spec
        self.started = time.time()
        self.wall_offset = self.started - time.monotonic()  # time.monotonic() + this: time.time()
        self.ranks: dict[tuple[str, int], RankHistory] = {}
        self.stragglers = StragglerWatch(spec.straggler_threshold, spec.straggler_warmup, spec.straggler_recovery)
        self.episodes: dict[tuple[str, int], Span] = {}  # (host, local rank) -> its straggler finding's span
        self.findings: list[Finding] = []
        self.throughput: list[dict[str, float]] = []
        self.last_step_at: float | None = None  # time.monotonic() a rank's count last grew
        self.stall_said = False
        self.total: int | None = spec.total_steps
        self.samples: list[dict[str, Any]] = []
        self.memory: dict[tuple[str, str], list[float]] = {}  # (host, "RSS" / "GPU memory") -> MiB
        self.idle_since: dict[tuple[str, str], float] = {}  # (host, GPU label) -> time.monotonic()
        self.said: set[tuple[str, str, str]] = set()  # (kind, host, what): each said once

    # -- input ------------------------------------------------------------------------------
    def on_step(self, host: str, phase: RankPhase, now: float | None = None) -> None:
        if phase.step is None or phase.local_rank is None:
            return
        now = time.monotonic() if now is None else now
        key = (host, phase.local_rank)
        history = self.ranks.setdefault(key, RankHistory(host, phase.local_rank))
        history.rank = phase.rank if phase.rank is not None else history.rank
        if phase.step > history.step:
            history.step = phase.step
            self.last_step_at = now
            self.stall_said = False
        if phase.total is not None:
            self.total = phase.total
        if phase.window is not None:
            history.add(phase.window)
            self.stragglers.observe(RankWindow(host, phase.local_rank, history.rank, phase.window), now)

    def on_sample(self, host: str, sample: HostSample, now: float | None = None) -> list[Finding]:
        """A node's sample: kept for the report; an idle GPU or creeping memory is a finding."""
        now = time.monotonic() if now is None else now
        gpus = sample.job_gpus
        self.samples.append({
            "t": round(time.time() - self.started, 3), "host": host,
            "gpu_util": [g.util_pct for g in gpus], "gpu_mem_used_mib": [g.memory_used_mib for g in gpus],
            "gpu_mem_total_mib": [g.memory_total_mib for g in gpus], "power_w": [g.power_w for g in gpus],
            "cpu_percent": sample.cpu_percent,
            "rss_mib": round(sample.rss_bytes / 2**20, 1) if sample.rss_bytes is not None else None})
        if len(self.samples) > POINTS * 4:
            self.samples = self.samples[::2]
        found = [*self._idle(host, sample, now), *self._creep(host, sample)]
        self.findings.extend(found)
        return found

    def _once(self, kind: str, host: str, what: str) -> bool:
        key = (kind, host, what)
        if key in self.said:
            return False
        self.said.add(key)
        return True

    def _idle(self, host: str, sample: HostSample, now: float) -> list[Finding]:
        found = []
        for gpu in sample.job_gpus:
            key = (host, gpu.label)
            if gpu.util_pct is None or gpu.util_pct > IDLE_UTIL_PCT or self.last_step_at is None:
                self.idle_since.pop(key, None)
                continue
            since = self.idle_since.setdefault(key, now)
            if now - since >= self.spec.gpu_idle_after and self._once("gpu idle", host, gpu.label):
                found.append(Finding("gpu idle", f"gpu idle: {host} {gpu.label} of the job at {gpu.util_pct:.0f} % "
                                     f"for {duration(now - since)} while the job runs (a rank on the CPU, or "
                                     "starved of input)", time.time(), host=host, step=self.step))
        return found

    def _creep(self, host: str, sample: HostSample) -> list[Finding]:
        if self.last_step_at is None:
            return []  # start-up (imports, data loading, caches) is not a leak
        used = [g.memory_used_mib for g in sample.job_gpus if g.memory_used_mib is not None]
        found = []
        for what, mib in (("RSS", sample.rss_bytes / 2**20 if sample.rss_bytes is not None else None),
                          ("GPU memory", sum(used) if used else None)):
            if mib is None:
                continue
            series = self.memory.setdefault((host, what), [])
            series.append(mib)
            del series[:-CREEP_SAMPLES]
            if len(series) < CREEP_SAMPLES:
                continue
            rises = sum(b > a for a, b in itertools.pairwise(series))
            grown = series[-1] - series[0]
            if rises >= CREEP_SAMPLES - 2 and grown >= max(CREEP_MIB, CREEP_FRACTION * series[0]) and \
                    self._once("memory creeping", host, what):
                found.append(Finding("memory creeping", f"memory creeping: the job's {what} on {host} rose in "
                                     f"{rises} of its last {CREEP_SAMPLES - 1} samples, {series[0]:.0f} → "
                                     f"{series[-1]:.0f} MiB (+{grown:.0f} MiB): a leak, or a cache without a bound",
                                     time.time(), host=host, step=self.step))
        return found

    def host_lost(self, host: str, why: str) -> None:
        """A host the job lost: a finding, and no longer part of the straggler's rounds (a straggler
        on it stays unended)."""
        self.stragglers.forget(host)
        for key in [k for k in self.episodes if k[0] == host]:
            del self.episodes[key]
        self.add(Finding("host lost", f"host lost: {host}: {why}", time.time(), host=host))

    def add(self, finding: Finding) -> None:
        self.findings.append(replace(finding, step=self.step) if finding.step is None else finding)

    @property
    def step(self) -> int | None:
        return max((h.step for h in self.ranks.values()), default=None)

    # -- on the supervision's timer ---------------------------------------------------------
    def check(self, now: float | None = None) -> list[str]:
        """What to say now: a straggler named (a new finding), or one back to pace (its finding's
        end); and a throughput point."""
        now = time.monotonic() if now is None else now
        self._point()
        said = []
        for change in self.stragglers.check(now):
            said.append(self._slowed(change, now) if isinstance(change, Slowed) else self._back(change))
        return said

    def _slowed(self, slowed: Slowed, now: float) -> str:
        found = slowed.comparison
        span = Span(slowed.since + self.wall_offset)
        self.episodes[found.slow.key] = span
        self.findings.append(Finding("straggler", found.text(), now + self.wall_offset, found.slow.rank,
                                     found.slow.host, self.step, span, found.slower))
        return found.text()

    def _back(self, back: BackToPace) -> str:
        span = self.episodes.pop(back.slow.key, None)
        if span is not None:
            span.end = back.until + self.wall_offset
        return back.text()

    def stall_limit(self) -> float:
        p95s = [h.windows[-1].p95_ms for h in self.ranks.values() if h.windows]
        return max(self.spec.hang_after, STALL_P95_FACTOR * max(p95s, default=0.0) / 1000)

    def stalled(self, now: float | None = None) -> float | None:
        """Seconds without a step, once they pass the limit (said once per stall; armed by the first
        step: a script with no optimizer is never stalled)."""
        now = time.monotonic() if now is None else now
        if self.last_step_at is None or self.stall_said:
            return None
        quiet = now - self.last_step_at
        if quiet < self.stall_limit():
            return None
        self.stall_said = True
        return quiet

    def status(self, now: float | None = None) -> Status | None:
        if not self.ranks or self.last_step_at is None:
            return None
        now = time.monotonic() if now is None else now
        latest = [h.windows[-1] for h in self.ranks.values() if h.windows]
        rate = _median_or_none([w.rate for w in latest])
        current = self.stragglers.current
        slowest = current.short() if current is not None and current.slower >= self.spec.straggler_threshold / 2 \
            else None
        return Status(max(h.step for h in self.ranks.values()), self.total, rate,
                      _median_or_none([w.p50_ms for w in latest]), max((w.p95_ms for w in latest), default=None),
                      slowest, now - self.last_step_at)

    def _point(self) -> None:
        status = self.status()
        if status is None or status.rate is None:
            return
        if self.throughput and self.throughput[-1]["step"] == status.step:
            return
        self.throughput.append({"t": round(time.time() - self.started, 3), "steps_per_s": round(status.rate, 4),
                                "step": status.step})
        if len(self.throughput) > POINTS:
            self.throughput = self.throughput[::2]

    # -- the end ----------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """What report.json holds of the run's progress (the launch adds its hosts and times)."""
        ranks = sorted(self.ranks.values(), key=lambda h: (h.rank if h.rank is not None else math.inf, h.host))
        return {"ranks": [h.to_json() for h in ranks], "throughput": list(self.throughput), "samples": self.samples,
                "findings": [f.to_json(self.started) for f in self.findings]}


def _median_or_none(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None
