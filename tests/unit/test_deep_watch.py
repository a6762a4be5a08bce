"""doctor --deep's watch of the host check (orchestrator/doctor/deep_watch.py), on a simulated clock:
the hosts still at it stopped once node 0 has its figures; where node 0 cannot coordinate (it ends,
or its store does not serve by the start deadline) the job stopped within that deadline and every
host that did not start named; where node 0 does coordinate, the watch leaves the naming to it, and
doctor tells a host that could not start, or never reached node 0's store, from a late one, with
what it printed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from orchestrator.checks.model import CheckStatus
from orchestrator.doctor import deep
from orchestrator.doctor.collective_jobs import CollectiveRun
from orchestrator.doctor.deep_watch import AT_RESULT, HostCheckWatch
from orchestrator.launch.events import Exited, Output, Started
from orchestrator.launch.monitor_api import Action, MonitorEvent, Stop
from tests.unit.test_deep_figures import FIXTURES, recorded
from train_jobs.hostcheck import schedule
from train_jobs.hostcheck.coordinate import SimulatedClock
from train_jobs.hostcheck.figures import JOINED, RESULT, SERVING, STARTED

HOSTS = [f"node{i}" for i in range(4)]
TICK = 0.5  # the core's timer
Timeline = Sequence[tuple[float, MonitorEvent]]


def started(host: str, rank: int) -> Output:
    return Output(host, [f"[default0]:{STARTED} rank={rank} store=198.18.0.10:29500"])


def joined(host: str, rank: int) -> Output:
    return Output(host, [f"[default0]:{JOINED} rank={rank}"])


def serving() -> Output:
    return Output("node0", [f"[default0]:{STARTED} rank=0 store=198.18.0.10:29500",
                            f"[default0]:{SERVING} 198.18.0.10:29500"])


def launch() -> list[tuple[float, MonitorEvent]]:
    return [(0.0, Started(h)) for h in HOSTS]


def healthy(at: float = 12.0) -> list[tuple[float, MonitorEvent]]:
    """Every host's check starts `at` s after the launch and joins."""
    return [*launch(), (at, serving()), (at, joined("node0", 0)),
            *((at, started(h, r)) for r, h in enumerate(HOSTS) if r), *((at + 0.2, joined(h, r))
                                                                        for r, h in enumerate(HOSTS) if r)]


def drive(timeline: Timeline, until: float,
          stopping: bool = False) -> tuple[HostCheckWatch, list[tuple[float, Action]]]:
    """The watch fed `timeline` (seconds on its clock, event) with the core's ticks between, until
    `until`: what it asked, and when."""
    sim = SimulatedClock()
    watch = HostCheckWatch(HOSTS, sim.clock())
    job = cast(Any, SimpleNamespace(stopping=stopping))
    asked: list[tuple[float, Action]] = []
    pending = sorted(timeline, key=lambda item: item[0])
    while sim.t <= until:
        while pending and pending[0][0] <= sim.t:
            asked += [(sim.t, a) for a in watch.on_event(pending.pop(0)[1], job)]
        asked += [(sim.t, a) for a in watch.on_tick(job)]
        job.stopping = job.stopping or any(isinstance(a, Stop) for _, a in asked)  # as the core does
        sim.sleep(TICK)
    return watch, asked


def stops(asked: list[tuple[float, Action]]) -> list[tuple[float, str]]:
    return [(t, a.reason) for t, a in asked if isinstance(a, Stop)]


def test_a_healthy_start_is_left_to_the_coordinator_and_the_hosts_are_stopped_at_the_figures() -> None:
    watch, asked = drive([*healthy(), (30.0, Output("node0", [f"[default0]:{RESULT}{{}}"]))], until=200)
    assert stops(asked) == [(30.0, AT_RESULT)]
    report = watch.report()
    assert not report.no_coordinator and report.named == ()
    assert all(s.started == 12.0 and s.joined for s in report.hosts.values())


def test_node_0_that_ends_before_it_starts_stops_the_job_at_once_naming_it_with_the_hosts_not_started() -> None:
    timeline = [*launch(), (8.0, started("node1", 1)), (9.0, Exited("node0", 1))]
    watch, asked = drive(timeline, until=200)
    assert [t for t, _ in stops(asked)] == [9.0]
    assert "node 0 (node0), ended (exited with code 1)" in stops(asked)[0][1]
    named = {n.host: (n.text, n.failed) for n in watch.report().named}
    assert named == {
        "node0": ("could not start its host check (exited with code 1)", True),
        "node2": ("did not start its host check in 9 s; the others started in 8.0 s (a starved or overloaded host)",
                  False),
        "node3": ("did not start its host check in 9 s; the others started in 8.0 s (a starved or overloaded host)",
                  False)}


def test_node_0_that_never_serves_is_named_at_the_join_deadline_of_the_others_start_not_later() -> None:
    """The others started 12 s after the launch: node 0 has three times that (the join deadline's
    rule), never the 300 s of torch's own store timeout."""
    timeline = [*launch(), *((12.0, started(h, r)) for r, h in enumerate(HOSTS) if r)]
    watch, asked = drive(timeline, until=400)
    deadline = schedule.bound([12.0, 12.0, 12.0], schedule.JOIN_BOUND)
    assert deadline == 36.0 and [t for t, _ in stops(asked)] == [deadline]
    (node0,) = watch.report().named
    assert (node0.host, node0.failed) == ("node0", False)
    assert node0.text == ("did not start its host check in 36 s; the others started in 12.0 s (a starved or "
                          "overloaded host)")


def test_a_start_broken_on_every_host_is_named_at_the_floor() -> None:
    watch, asked = drive(launch(), until=400)
    assert [t for t, _ in stops(asked)] == [schedule.START_FLOOR_S]
    assert [n.host for n in watch.report().named] == HOSTS


def test_node_0_that_ends_after_it_served_but_before_its_figures_stops_the_job_at_once() -> None:
    watch, asked = drive([*healthy(), (20.0, Exited("node0", 1))], until=200)
    assert [t for t, _ in stops(asked)] == [20.0]
    (node0,) = watch.report().named
    assert node0.text == ("its host check ended before the figures (exited with code 1): node 0 coordinates "
                          "the check") and node0.failed


def test_a_worker_that_fails_or_never_starts_is_left_to_the_coordinator() -> None:
    timeline = [*launch(), (12.0, serving()), (12.0, started("node1", 1)), (12.0, joined("node1", 1)),
                (3.0, Exited("node2", 1)), (12.0, started("node3", 3))]
    watch, asked = drive(timeline, until=200)
    assert stops(asked) == []
    hosts = watch.report().hosts
    assert hosts["node2"].ended == "exited with code 1" and hosts["node2"].started is None
    assert hosts["node3"].started == 12.0 and not hosts["node3"].joined


def test_a_host_stopped_after_the_figures_did_not_end_on_its_own() -> None:
    """node3 never started; the figures came, the hosts still at it were stopped: its end is ours,
    and the coordinator's verdict (late) stands, not 'could not start'."""
    timeline = [*launch(), (12.0, serving()), *((12.0, started(h, r)) for r, h in enumerate(HOSTS[1:3], 1)),
                (30.0, Output("node0", [f"[default0]:{RESULT}{{}}"])), (31.0, Exited("node3", 1)),
                (31.0, Exited("node0", 0))]
    watch, asked = drive(timeline, until=60)
    assert stops(asked) == [(30.0, AT_RESULT)]
    assert watch.report().hosts["node3"].ended is None and watch.report().hosts["node0"].ended is None


def test_a_job_someone_else_stops_is_not_blamed_on_node_0() -> None:
    watch, asked = drive([*launch(), (5.0, Exited("node0", 143))], until=100, stopping=True)
    assert stops(asked) == [] and watch.report().named == ()


# -- doctor's findings from what the watch saw ------------------------------------------------------

def run_with(tmp_path: Path, timeline: Timeline, until: float, lines: list[str],
             tails: dict[str, list[str]]) -> CollectiveRun:
    """A finished host-check run whose watch saw `timeline`; `tails`: each host's last lines."""
    plan = SimpleNamespace(hosts=[SimpleNamespace(node_rank=r, host=SimpleNamespace(name=h))
                                  for r, h in enumerate(HOSTS)], master_addr="198.18.0.10", master_port=29500)
    result = SimpleNamespace(first_failure=None, run_dir=tmp_path / "run",
                             hosts=[SimpleNamespace(host=h, tail=tails.get(h, [])) for h in HOSTS])
    output = SimpleNamespace(lines=[("node0", "0", line) for line in lines])
    return cast(CollectiveRun, SimpleNamespace(result=result, output=output, plan=plan, timeline=timeline,
                                               until=until))


def host_check(monkeypatch: pytest.MonkeyPatch, run: Any) -> deep.DeepReport:
    def fake(*_args: object, monitors: Any, **_kwargs: object) -> CollectiveRun:
        (watch,) = [m for m in monitors(run.plan, deep.LaunchOptions()) if isinstance(m, HostCheckWatch)]
        sim = SimulatedClock()
        watch.clock = sim.clock()
        job = cast(Any, SimpleNamespace(stopping=False))
        pending = sorted(run.timeline, key=lambda item: item[0])
        while sim.t <= run.until:
            while pending and pending[0][0] <= sim.t:
                watch.on_event(pending.pop(0)[1], job)
            watch.on_tick(job)
            sim.sleep(TICK)
        return cast(CollectiveRun, run)

    monkeypatch.setattr(deep, "run_collective", fake)
    monkeypatch.setattr(deep, "standard_monitors", lambda *_a: [])
    return deep.host_check(cast(Any, None), cast(Any, None), Path("runs"), 1.0, 1 << 20)


def test_without_a_coordinator_each_host_not_started_is_named_with_what_it_printed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    crash = ["[default0]:Traceback (most recent call last):", "[default0]:ModuleNotFoundError: No module named 'torch'"]
    run = run_with(tmp_path, [*launch(), (8.0, started("node1", 1)), (9.0, Exited("node0", 1))], 60, [],
                   {"node0": crash})
    out = host_check(monkeypatch, run)
    assert out.figures is None
    found = {(f.check, f.host): f for f in out.findings}
    assert sorted(found) == [("compute", "node0"), ("compute", "node2"), ("compute", "node3"), ("links", "node0")]
    node0 = found[("compute", "node0")]
    assert node0.status is CheckStatus.FAIL and node0.message == "could not start its host check (exited with code 1)"
    assert node0.evidence == "node0 printed:\n  " + "\n  ".join(crash)
    assert found[("compute", "node2")].status is CheckStatus.WARN
    assert found[("compute", "node2")].evidence == "node2 printed nothing"
    links = found[("links", "node0")]
    assert links.status is CheckStatus.FAIL and links.message == "the host check printed no result"


@pytest.mark.parametrize(("timeline", "message", "status"), [
    ([(3.0, Exited("node3", 1))], "could not start its host check (exited with code 1)", CheckStatus.FAIL),
    ([(9.0, started("node3", 3))],
     "started its host check but did not reach node 0's store at 198.18.0.10:29500 in 10 s; the others joined in 0.1 s",
     CheckStatus.FAIL),
    ([], "did not start its host check in 10 s; the others started in 0.1 s (a starved or overloaded host)",
     CheckStatus.WARN),
    ([(9.0, started("node3", 3)), (40.0, joined("node3", 3))],  # joined after the deadline: late, not cut off
     "did not start its host check in 10 s; the others started in 0.1 s (a starved or overloaded host)",
     CheckStatus.WARN),
    ([(16.0, started("node3", 3))],  # started after its deadline (node 0 served at 5 s, + 10 s): late
     "did not start its host check in 10 s; the others started in 0.1 s (a starved or overloaded host)",
     CheckStatus.WARN),
])
def test_a_host_the_coordinator_named_for_its_join_is_told_apart_by_what_it_printed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, timeline: Timeline, message: str,
        status: CheckStatus) -> None:
    text = recorded(FIXTURES / "cpu_4_hosts_one_never_started.txt")  # node3 missed the join deadline
    events = [*launch(), (5.0, serving()), *((5.0, started(h, r)) for r, h in enumerate(HOSTS[:3]) if r),
              *((5.1, joined(h, r)) for r, h in enumerate(HOSTS[:3])), *timeline]
    tails = {"node3": ["[default0]:" + STARTED + " rank=3 store=198.18.0.10:29500"]}
    out = host_check(monkeypatch, run_with(tmp_path, events, 50, [RESULT + text], tails))
    assert out.figures is not None
    (late,) = [f for f in out.findings if f.host == "node3" and f.check == "compute"]
    assert (late.status, late.message) == (status, message)
    assert late.evidence.startswith("node3 printed:\n  [default0]:DDPCTL-DEEP-START rank=3")


def test_every_start_message_is_named_in_computes_explain_page() -> None:
    from orchestrator.checks import explain

    entry = explain.entry("compute")
    for piece in ("could not start its host check (", "started its host check but did not reach node 0's store at",
                  "its host check ended before the figures (", "did not start its host check in"):
        assert piece in entry, piece


def test_a_pairs_gloo_device_is_never_found_by_the_hosts_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """GLOO_SOCKET_IFNAME's interfaces where set (ddpctl sets it where the name resolves nowhere),
    else this host's own address on its route to node 0: no lookup of its name either way."""
    import socket

    from train_jobs.hostcheck.check import gloo_devices

    def no_lookup(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a name was looked up")

    for name in ("gethostbyname", "getaddrinfo", "getfqdn", "gethostbyname_ex"):
        monkeypatch.setattr(socket, name, no_lookup)
    assert gloo_devices({"GLOO_SOCKET_IFNAME": "eth0,eth1", "DDPCTL_COORDINATOR": "198.18.0.10:29500"}) == [
        {"interface": "eth0"}, {"interface": "eth1"}]
    assert gloo_devices({"DDPCTL_COORDINATOR": "127.0.0.1:29500"}) == [{"hostname": "127.0.0.1"}]
    assert gloo_devices({"DDPCTL_COORDINATOR": "[::1]:29500"}) == [{"hostname": "::1"}]
