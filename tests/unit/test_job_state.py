"""The running job's watch (orchestrator/watch/job_state.py), fed the ranks' step records as the
supervision parses them (orchestrator/remote/wire.py RankPhase), with explicit clock values; and
the pulse that prints its progress where there is no status line (orchestrator/launch/observer.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from inventory.model import WatchSpec
from orchestrator.launch import observer
from orchestrator.launch.observer import Pulse
from orchestrator.launch.progress import Status, duration
from orchestrator.launch.result import Finding
from orchestrator.remote.wire import RankPhase, StepWindow
from orchestrator.watch.job_state import POINTS, STALL_P95_FACTOR, Watch
from orchestrator.watch.straggler import MIN_ROUNDS, WINDOW_SAMPLES

FILL = max(MIN_ROUNDS, -(-WINDOW_SAMPLES // 10))  # rounds of window()'s 10 samples that fill a rank's window


def window(p50: float = 60.0, p95: float = 66.0, steps: int = 10, wait: float | None = 20.0,
           data: float | None = 10.0, compute: float | None = 24.0, samples: int = 10) -> StepWindow:
    return StepWindow(steps, steps * p50 / 1000, p50, p95, wait, data, compute, samples)


def step(n: int, w: StepWindow | None = None, local_rank: int = 0, rank: int | None = 0,
         total: int | None = None) -> RankPhase:
    return RankPhase(local_rank, rank, "step", None, None, step=n, window=w, total=total)


# -- duration and Status ----------------------------------------------------------------------------


@pytest.mark.parametrize(("seconds", "text"), [(-3, "0s"), (0, "0s"), (59.9, "59s"), (60, "1m00s"),
                                               (3599, "59m59s"), (3600, "1h00m"), (7322, "2h02m")])
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_the_status_text_has_progress_rate_step_time_and_eta() -> None:
    watch = Watch(WatchSpec(total_steps=100))
    watch.on_step("node0", step(10, window()), now=50.0)
    status = watch.status(now=50.0)
    assert status is not None
    assert (status.step, status.total) == (10, 100)
    assert status.rate == pytest.approx(10 / 0.6)
    assert status.eta_s == pytest.approx(90 * 0.06)
    assert status.text() == "step 10/100 · 16.7 steps/s · step 60 ms (p95 66 ms) · ETA 5s"


def test_the_total_may_come_from_a_record() -> None:
    watch = Watch(WatchSpec())
    watch.on_step("node0", step(1, window(steps=1)), now=0.0)
    status = watch.status(now=0.0)
    assert status is not None and status.total is None and "ETA" not in status.text()
    assert status.text().startswith("step 1 · ")
    watch.on_step("node0", step(600, window(p50=1000, p95=1200, steps=599), total=3600), now=1.0)
    status = watch.status(now=1.0)
    assert status is not None and status.total == 3600
    assert "step 600/3600" in status.text() and "ETA 50m00s" in status.text()
    assert "step 1000 ms (p95 1200 ms)" in status.text()


def test_the_status_takes_the_ranks_median_rate_and_their_worst_p95() -> None:
    watch = Watch(WatchSpec(total_steps=1000))
    for r, (p50, p95) in enumerate([(50.0, 55.0), (60.0, 90.0), (70.0, 75.0)]):
        watch.on_step(f"node{r}", step(20 + r, window(p50=p50, p95=p95), rank=r), now=10.0)
    status = watch.status(now=10.0)
    assert status is not None
    assert status.step == 22
    assert status.rate == pytest.approx(1000 / 60.0)
    assert (status.p50_ms, status.p95_ms) == (60.0, 90.0)


def test_there_is_no_status_before_the_first_step() -> None:
    watch = Watch(WatchSpec(total_steps=10))
    assert watch.status(now=0.0) is None
    watch.on_step("node0", RankPhase(0, 0, "started", None, None), now=1.0)  # no step count
    assert watch.status(now=1.0) is None and watch.step is None


def test_a_long_quiet_and_a_slow_rank_are_in_the_status() -> None:
    watch = Watch(WatchSpec(total_steps=100, straggler_threshold=0.10, straggler_warmup=0.0))
    works = {0: 40.0, 1: 40.0, 2: 60.0}  # rank 2 is 50 % slower, all of it on its input
    for _ in range(MIN_ROUNDS):
        for r, w in works.items():
            slow = w - 40.0
            watch.on_step(f"node{r}", step(5, window(p50=80.0, wait=20.0 + 20.0 - slow, data=10.0 + slow), rank=r),
                          now=0.0)
        watch.check(now=0.0)
    status = watch.status(now=12.5)
    assert status is not None
    assert "slowest rank 2 on node2 +50% (input)" in status.text()
    assert "no step for 12s" in status.text()
    assert Status(5, 100, 1.0, 60.0, 66.0, None, 9.9).text().count("no step") == 0


def test_no_eta_once_the_total_is_reached_or_without_a_rate() -> None:
    assert Status(100, 100, 10.0, 60.0, 66.0, None, 0.0).eta_s is None
    assert Status(10, 100, None, None, None, None, 0.0).eta_s is None
    assert Status(10, 100, 0.0, None, None, None, 0.0).eta_s is None
    assert Status(10, None, 10.0, None, None, None, 0.0).eta_s is None


# -- stalls -----------------------------------------------------------------------------------------


def test_a_script_that_never_steps_is_never_stalled() -> None:
    watch = Watch(WatchSpec(hang_after=1.0))
    assert watch.stalled(now=1e9) is None
    watch.on_step("node0", step(0), now=0.0)  # a record at step 0 is no step yet
    assert watch.stalled(now=1e9) is None


def test_a_stall_fires_once_after_hang_after_then_rearms_after_a_step() -> None:
    watch = Watch(WatchSpec(hang_after=2.0))
    watch.on_step("node0", step(1, window(p95=66.0)), now=100.0)
    assert watch.stall_limit() == 2.0  # 5 x 66 ms is less
    assert watch.stalled(now=101.9) is None
    assert watch.stalled(now=102.5) == pytest.approx(2.5)
    assert watch.stalled(now=103.0) is None  # said once
    assert watch.stalled(now=500.0) is None
    watch.on_step("node0", step(1, window()), now=501.0)  # the same count again: not a step
    assert watch.stalled(now=600.0) is None
    watch.on_step("node0", step(2, window()), now=601.0)
    assert watch.stalled(now=602.0) is None
    assert watch.stalled(now=603.5) == pytest.approx(2.5)


def test_a_step_of_any_rank_rearms() -> None:
    watch = Watch(WatchSpec(hang_after=1.0))
    watch.on_step("node0", step(5, window(), rank=0), now=0.0)
    watch.on_step("node1", step(5, window(), rank=1), now=0.0)
    assert watch.stalled(now=1.0) == pytest.approx(1.0)
    watch.on_step("node1", step(6, window(), rank=1), now=3.0)
    assert watch.stalled(now=3.5) is None
    assert watch.stalled(now=4.0) == pytest.approx(1.0)


def test_the_stall_limit_follows_the_p95_step_time() -> None:
    watch = Watch(WatchSpec(hang_after=1.0))
    watch.on_step("node0", step(3, window(p50=1500.0, p95=2000.0, steps=2), rank=0), now=0.0)
    watch.on_step("node1", step(3, window(p50=1500.0, p95=1800.0, steps=2), rank=1), now=0.0)
    assert watch.stall_limit() == pytest.approx(STALL_P95_FACTOR * 2.0)
    assert watch.stalled(now=9.9) is None
    assert watch.stalled(now=10.0) == pytest.approx(10.0)


def test_the_stall_limit_uses_each_ranks_latest_window() -> None:
    watch = Watch(WatchSpec(hang_after=1.0))
    watch.on_step("node0", step(3, window(p95=4000.0)), now=0.0)
    watch.on_step("node0", step(9, window(p95=400.0)), now=1.0)
    assert watch.stall_limit() == pytest.approx(2.0)


# -- findings ---------------------------------------------------------------------------------------


def test_host_lost_is_a_finding_at_the_current_step() -> None:
    watch = Watch(WatchSpec())
    watch.on_step("node1", step(42, window()), now=0.0)
    watch.host_lost("node1", "ssh connection closed")
    (finding,) = watch.findings
    assert (finding.kind, finding.host, finding.step) == ("host lost", "node1", 42)
    assert finding.text == "host lost: node1: ssh connection closed"


def test_a_lost_host_no_longer_holds_the_straggler_rounds() -> None:
    watch = Watch(WatchSpec(straggler_threshold=0.10, straggler_warmup=0.0))

    def rounds(hosts: list[str]) -> list[str]:
        said: list[str] = []
        for n in range(FILL + 1):
            for r, host in enumerate(hosts):
                slow = 20.0 if host == "node2" else 0.0
                w = window(p50=80.0, wait=40.0 - slow, data=10.0 + slow)
                watch.on_step(host, step(10 + n, w, rank=r if host != "node2" else 2), now=float(n))
            said += watch.check(now=float(n))
        return said

    # node1 sent once and went silent: no round completes while it is part of them
    watch.on_step("node1", step(1, window(), rank=1), now=0.0)
    assert rounds(["node0", "node2"]) == []
    watch.host_lost("node1", "no heartbeat for 30 s")
    said = rounds(["node0", "node2"])
    assert [text.split(" is ")[0] for text in said] == ["straggler: rank 2 on node2"]
    assert [f.kind for f in watch.findings] == ["host lost", "straggler"]
    straggler = watch.findings[1]
    assert (straggler.rank, straggler.host) == (2, "node2")
    assert straggler.step is not None and straggler.step >= 10


def test_add_keeps_a_findings_own_step_and_fills_a_missing_one() -> None:
    watch = Watch(WatchSpec())
    watch.on_step("node0", step(7, window()), now=0.0)
    watch.add(Finding("hang", "stuck", 1.0))
    watch.add(Finding("gpu idle", "idle", 2.0, step=3))
    assert [f.step for f in watch.findings] == [7, 3]


# -- report -----------------------------------------------------------------------------------------


def test_the_report_has_the_ranks_sorted_by_rank_with_their_timings() -> None:
    watch = Watch(WatchSpec())
    for host, local, r in [("node1", 0, 2), ("node0", 1, 1), ("node0", 0, 0), ("node1", 1, None)]:
        for n, p50 in enumerate([58.0, 60.0, 62.0, 80.0]):
            watch.on_step(host, step(n + 1, window(p50=p50, p95=p50 + 5, wait=20.0 + n), local_rank=local, rank=r),
                          now=float(n))
    report = watch.report()
    assert [(x["rank"], x["host"], x["local_rank"]) for x in report["ranks"]] == [
        (0, "node0", 0), (1, "node0", 1), (2, "node1", 0), (None, "node1", 1)]
    first = report["ranks"][0]
    assert first["steps"] == 4
    assert first["step_ms"]["min"] == 58.0 and first["step_ms"]["max"] == 85.0
    assert first["step_ms"]["p50"] == 62.0
    assert first["step_ms"]["p50"] <= first["step_ms"]["p95"] <= first["step_ms"]["max"]
    assert len(first["hist"]["edges_ms"]) == len(first["hist"]["counts"]) + 1
    assert sum(first["hist"]["counts"]) == 4
    assert first["hist"]["edges_ms"][0] == 58.0 and first["hist"]["edges_ms"][-1] == pytest.approx(80.0)
    assert first["wait_ms"] == 22.0 and first["data_ms"] == 10.0 and first["compute_ms"] == 24.0


def test_a_rank_without_windows_or_ddp_reports_none() -> None:
    watch = Watch(WatchSpec())
    watch.on_step("node0", step(1), now=0.0)
    watch.on_step("node1", step(3, window(wait=None, data=None, compute=None), rank=1), now=0.0)
    bare, no_ddp = watch.report()["ranks"]
    assert bare["step_ms"] is None and bare["hist"] is None and bare["wait_ms"] is None
    assert no_ddp["step_ms"] is not None and no_ddp["wait_ms"] is None and no_ddp["compute_ms"] is None


def test_throughput_points_and_windows_stay_bounded() -> None:
    watch = Watch(WatchSpec())
    for n in range(1, POINTS + 500):
        watch.on_step("node0", step(n, window(steps=1)), now=float(n))
        watch.check()
    points = watch.report()["throughput"]
    assert 0 < len(points) <= POINTS
    assert len(watch.ranks[("node0", 0)].windows) <= POINTS
    assert [p["step"] for p in points] == sorted({p["step"] for p in points})  # one point per step, in order
    assert points[-1]["step"] == POINTS + 499
    assert set(points[-1]) == {"t", "steps_per_s", "step"}


def test_no_new_point_while_the_step_does_not_move() -> None:
    watch = Watch(WatchSpec())
    watch.on_step("node0", step(5, window()), now=0.0)
    watch.check()
    watch.check()
    assert [p["step"] for p in watch.throughput] == [5]
    watch.on_step("node0", step(6, window()), now=1.0)
    watch.check()
    assert [p["step"] for p in watch.throughput] == [5, 6]


def test_report_findings_have_their_time_since_the_start_and_step() -> None:
    watch = Watch(WatchSpec())
    watch.on_step("node0", step(12, window()), now=0.0)
    watch.host_lost("node3", "gone")
    (finding,) = watch.report()["findings"]
    assert finding["kind"] == "host lost" and finding["host"] == "node3" and finding["step"] == 12
    assert finding["t"] == round(watch.findings[0].at - watch.started, 3)
    assert 0 <= finding["t"] < 60
    assert Finding("hang", "x", 5.0).to_json(None)["t"] is None


# -- the pulse --------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    fake = Clock()
    monkeypatch.setattr(observer.time, "monotonic", fake)
    yield fake


def status_at(n: int, quiet: float = 0.0) -> Status:
    return Status(n, 1000, 10.0, 60.0, 66.0, None, quiet)


def test_a_pulse_line_at_most_every_period(clock: Clock) -> None:
    pulse = Pulse(30.0)
    said = []
    for t in range(0, 301):
        clock.now = float(t)
        line = pulse.due(status_at(t * 10))
        if line is not None:
            said.append((t, line))
    assert [t for t, _ in said] == list(range(30, 301, 30))
    assert said[0][1] == "progress: " + status_at(300).text()


def test_a_pulse_says_a_stall_once_then_keeps_quiet_until_a_step(clock: Clock) -> None:
    pulse = Pulse(30.0)
    said: list[tuple[int, str]] = []
    last_step = 60
    for t in range(0, 4001):
        clock.now = float(t)
        n = min(t, last_step)
        line = pulse.due(status_at(n, quiet=max(0, t - last_step)))
        if line is not None:
            said.append((t, line))
    stalled = [(t, line) for t, line in said if t > last_step]
    assert len(stalled) == 1
    assert "no step for 30s" in stalled[0][1]
    clock.now = 4001.0
    line = pulse.due(status_at(61))
    assert line is not None and "step 61/1000" in line


def test_a_short_pulse_still_says_the_stall(clock: Clock) -> None:
    pulse = Pulse(5.0)
    said: list[tuple[int, str]] = []
    last_step = 20
    for t in range(0, 200):
        clock.now = float(t)
        line = pulse.due(status_at(min(t, last_step), quiet=max(0, t - last_step)))
        if line is not None:
            said.append((t, line))
    assert any("no step for" in line for t, line in said if t > last_step)


# -- stragglers over time ---------------------------------------------------------------------------


def straggler_round(watch: Watch, n: int, now: float, slow_ms: float) -> list[str]:
    """One round of 3 ranks on node0..node2 at step n; rank 1 slow_ms slower on its input."""
    for r in range(3):
        slow = slow_ms if r == 1 else 0.0
        w = window(p50=60.0 + slow_ms, wait=20.0 + slow_ms - slow, data=10.0 + slow)
        watch.on_step(f"node{r}", step(n, w, rank=r), now=now)
    return watch.check(now=now)


def test_a_straggler_finding_has_a_start_and_an_end_and_the_end_is_said() -> None:
    """Rank 1 20 ms slower from 10 s to 30 s: its finding starts at its first slow round and ends at
    its first round back, said once it has stayed back for [watch] straggler_recovery."""
    watch = Watch(WatchSpec(straggler_warmup=5.0, straggler_recovery=4.0))
    said: list[tuple[float, str]] = []
    for n in range(120):
        now = n * 0.5
        said += [(now, text) for text in straggler_round(watch, n + 1, now, 20.0 if 10.0 <= now < 30.0 else 0.0)]
    assert [text.split(" is ")[0] for _, text in said] == [
        "straggler: rank 1 on node1", "rank 1 on node1 back to pace after 20 s"]
    assert said[1][0] >= 30.0 + 4.0
    (finding,) = watch.findings
    assert finding.span is not None and finding.span.end is not None
    assert finding.span.end - finding.span.start == pytest.approx(20.0, abs=0.6)
    assert finding.span.start < finding.at < finding.span.end
    (reported,) = watch.report()["findings"]
    assert reported["kind"] == "straggler" and reported["rank"] == 1
    assert (reported["start"], reported["end"]) == (finding.span.start, finding.span.end)
    assert reported["duration_s"] == pytest.approx(20.0, abs=0.6)


def test_a_straggler_still_slow_at_the_end_has_no_end_and_lasts_to_the_report() -> None:
    watch = Watch(WatchSpec(straggler_warmup=0.0))
    for n in range(20):
        straggler_round(watch, n + 1, n * 0.5, 20.0)
    (reported,) = watch.report()["findings"]
    assert reported["end"] is None
    assert reported["duration_s"] >= 0.0 and reported["start"] <= reported["at"]


def test_a_rank_that_slows_again_is_a_new_finding() -> None:
    watch = Watch(WatchSpec(straggler_warmup=0.0, straggler_recovery=2.0))
    slow = [(0.0, 10.0), (20.0, 30.0)]
    said = []
    for n in range(100):
        now = n * 0.5
        said += straggler_round(watch, n + 1, now, 20.0 if any(a <= now < b for a, b in slow) else 0.0)
    assert [t.split(" is ")[0].split(" after ")[0] for t in said] == [
        "straggler: rank 1 on node1", "rank 1 on node1 back to pace"] * 2
    assert [f.kind for f in watch.findings] == ["straggler", "straggler"]
    assert all(f.span is not None and f.span.end is not None for f in watch.findings)


def test_no_straggler_is_named_in_the_warm_up() -> None:
    watch = Watch(WatchSpec(straggler_warmup=30.0))
    said = [text for n in range(50) for text in straggler_round(watch, n + 1, n * 0.5, 20.0)]
    assert said == [] and watch.findings == []
    status = watch.status(now=25.0)
    assert status is not None and "slowest rank 1 on node1" in status.text()  # the status shows it all the same
