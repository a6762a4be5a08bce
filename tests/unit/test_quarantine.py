"""Quarantine: the pure policy (orchestrator/hostops/quarantine.py) over a host's ledger events, the
inventory's keys with located errors, and `up` with and without restarts leaving a quarantined host
out (a spare in its place, else shrunk to min_nodes, else refused), naming a suspect one, and
recording what each launch learned (orchestrator/restarts/hostledger.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from inventory import ConfigError, Host, Inventory, Job, load_inventory
from inventory.model import RestartSpec
from orchestrator.errors import LaunchBlocked
from orchestrator.hostops.hostbook import screen
from orchestrator.hostops.ledger import Ledger, Note, Sighting
from orchestrator.hostops.quarantine import Event, EventKind, LedgerState, Policy, duration, judge
from orchestrator.launch import core
from orchestrator.launch.observer import Collected
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.result import HostRun, RunResult, RunState
from orchestrator.restarts.loop import Restarts
from orchestrator.run_up import Finished, UpRequest
from orchestrator.run_up import detach as run_up_detach
from orchestrator.run_up import launch as run_up_launch

H = 3600.0
NOW = 100 * H


def ev(hours_ago: float, kind: EventKind = EventKind.HOST_FAULT, detail: str = "a rank was killed (SIGKILL: …)",
       run: str = "r") -> Event:
    return Event(NOW - hours_ago * H, kind, detail, run)


# -- the policy ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("events", "state"), [
    ([], LedgerState.OK),
    ([ev(1, EventKind.STRAGGLER), ev(1, EventKind.FINDING)], LedgerState.OK),  # not faults
    ([ev(1)], LedgerState.SUSPECT),
    ([ev(30), ev(1)], LedgerState.SUSPECT),  # one of them is out of the 24 h window
    ([ev(5, EventKind.LOST), ev(1)], LedgerState.QUARANTINED),
    ([ev(5, EventKind.HARDWARE), ev(1, EventKind.LOST)], LedgerState.QUARANTINED),
    ([ev(5), ev(3), ev(2, EventKind.RELEASE)], LedgerState.OK),  # a release resets the count
    ([ev(5), ev(3), ev(2, EventKind.RELEASE), ev(1)], LedgerState.SUSPECT),
    ([ev(50, EventKind.DEEP_FINDING)], LedgerState.SUSPECT),  # a deep finding: until a release
    ([ev(50, EventKind.DEEP_FINDING), ev(1, EventKind.RELEASE)], LedgerState.OK),
])
def test_the_state_follows_the_host_faults_since_the_last_release(events: list[Event], state: LedgerState) -> None:
    assert judge(events, Policy(), NOW).state is state


def test_the_reason_names_each_fault_with_its_time_and_run() -> None:
    got = judge([ev(5, EventKind.LOST, "node1 lost", "train-1.0"), ev(1, run="train-2")], Policy(), NOW)
    assert got.state is LedgerState.QUARANTINED
    assert got.reason is not None
    assert got.reason.startswith("2 host faults in 24 h: lost at ")
    assert "(run train-1.0), SIGKILL at " in got.reason and got.reason.endswith("(run train-2)")
    assert got.mtbf == 4 * H


def test_the_policys_settings_and_its_switch() -> None:
    three = [ev(5), ev(3), ev(1)]
    assert judge(three[1:], Policy(after=3), NOW).state is LedgerState.SUSPECT
    assert judge(three, Policy(after=3), NOW).state is LedgerState.QUARANTINED
    assert judge(three, Policy(window=2 * H), NOW).state is LedgerState.SUSPECT
    off = judge(three, Policy(enabled=False), NOW)
    assert off.state is LedgerState.SUSPECT and off.reason is not None and off.reason.endswith("(quarantine is off)")
    listed = judge([ev(1, detail="a rank exited with code 75, listed in …")], Policy(), NOW).reason
    assert listed is not None and listed.startswith("1 host fault(s) in 24 h: exit code 75 at ")


@pytest.mark.parametrize(("seconds", "text"), [(86400, "24 h"), (7 * 86400.0, "7 d"), (1800, "30 min"), (90, "90 s")])
def test_a_window_reads_as_people_write_it(seconds: float, text: str) -> None:
    assert duration(seconds) == text


# -- the inventory's keys ----------------------------------------------------------------------------

def load(tmp_path: Path, defaults: str) -> Inventory:
    path = tmp_path / "hosts.toml"
    path.write_text(f"[defaults]\n{defaults}\n[[hosts]]\nname = \"n0\"\n")
    return load_inventory(path)


@pytest.mark.parametrize(("line", "want"), [
    ("", (True, 2, 86400.0)),
    ("quarantine = false", (False, 2, 86400.0)),
    ("quarantine_after = 3", (True, 3, 86400.0)),
    ("quarantine_window = 3600", (True, 2, 3600.0)),
    ('quarantine_window = "90m"', (True, 2, 5400.0)),
    ('quarantine_window = "7d"', (True, 2, 7 * 86400.0)),
    ("quarantine_window = 1.5", (True, 2, 1.5)),
])
def test_the_quarantine_keys_in_defaults(tmp_path: Path, line: str, want: tuple[bool, int, float]) -> None:
    inv = load(tmp_path, line)
    assert (inv.quarantine, inv.quarantine_after, inv.quarantine_window) == want


@pytest.mark.parametrize(("line", "key", "words"), [
    ('quarantine = "no"', "defaults.quarantine", "expected true or false"),
    ("quarantine_after = 0", "defaults.quarantine_after", "out of range"),
    ('quarantine_after = "2"', "defaults.quarantine_after", "expected an integer"),
    ('quarantine_window = "a day"', "defaults.quarantine_window", "expected seconds or a duration"),
    ("quarantine_window = 0", "defaults.quarantine_window", "out of range"),
    ("quarantine_windw = 5", "defaults.quarantine_windw", "unknown key"),
])
def test_a_bad_quarantine_key_is_a_located_error(tmp_path: Path, line: str, key: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as err:
        load(tmp_path, line)
    assert err.value.key == key and err.value.line == 2


def test_the_keys_are_the_inventorys_not_a_hosts(tmp_path: Path) -> None:
    path = tmp_path / "hosts.toml"
    path.write_text('[[hosts]]\nname = "n0"\nquarantine = false\n')
    with pytest.raises(ConfigError, match="quarantine"):
        load_inventory(path)


# -- up: left out, named, recorded ---------------------------------------------------------------------

A, B, C = (Host(n, f"198.18.0.{i + 1}") for i, n in enumerate("abc"))
S1 = Host("s1", "198.18.1.1", spare=True)


def make_job(spares: Sequence[Host] = (S1,), min_nodes: int | None = None, max_restarts: int = 2,
             quarantine: bool = True) -> Job:
    return Job("train", Inventory((A, B, C, *spares)), (A, B, C), script="train.py",
               restart=RestartSpec(max_restarts=max_restarts, min_nodes=min_nodes, backoff=0.0, max_backoff=0.0,
                                   quarantine=quarantine))


def faults(host: Host, n: int = 2) -> None:
    for i in range(n):
        Ledger().record(f"old-{i}", "up", [Sighting(host)], [Note(host, EventKind.HOST_FAULT, "a rank was killed "
                                                                  "(SIGKILL: out of memory, or killed on the host)")])


def result(job: Job, job_id: str, killed: str | None = None) -> RunResult:
    runs = [HostRun(h.name, i, "torchrun", state=RunState.EXITED, exit_code=0, hostname=f"{h.name}.lab")
            for i, h in enumerate(job.hosts)]
    first = None
    for run in runs:
        if run.host == killed:
            run.state, run.exit_code, first = RunState.FAILED, 1, run
            run.tail = ["exitcode  : -9 (pid: 42)"]
        elif killed is not None:
            run.state, run.exit_code = RunState.STOPPED, None
    return RunResult(job_id=job_id, run_dir=Path("runs") / job_id, hosts=runs, exit_code=1 if killed else 0,
                     first_failure=first)


class FakeLaunch:
    """core.launch: each call's hosts kept; the host named in `kills` fails (a SIGKILLed rank)."""

    def __init__(self, kills: Sequence[str | None] = ()) -> None:
        self.hosts: list[list[str]] = []
        self.kills = list(kills)

    def __call__(self, job: Job, backend: Any, observer: Any, options: Any = None, **kw: Any) -> RunResult:
        self.hosts.append([h.name for h in job.hosts])
        attempt = kw.get("attempt")
        job_id = attempt.job_id if attempt is not None else f"plain-{len(self.hosts)}"
        return result(job, job_id, self.kills.pop(0) if self.kills else None)


def plain_up(job: Job, tmp_path: Path, fake: FakeLaunch, monkeypatch: pytest.MonkeyPatch) -> Collected:
    monkeypatch.setattr(core, "launch", fake)
    seen = Collected()
    outcome = run_up_launch(job, None, None, UpRequest(LaunchOptions(runs_dir=tmp_path), max_restarts=0),  # type: ignore[arg-type]
                            seen)
    assert isinstance(outcome, Finished)
    return seen


def test_a_host_sigkilled_in_two_plain_runs_is_quarantined_and_the_next_runs_on_the_spare(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = make_job(max_restarts=0)
    fake = FakeLaunch(["b", "b"])
    plain_up(job, tmp_path, fake, monkeypatch)
    assert screen(job, [B]).suspect  # one fault: suspect, kept
    seen = plain_up(job, tmp_path, fake, monkeypatch)
    assert any(n.startswith("b is suspect (1 host fault(s) in 24 h: SIGKILL at ") for n in seen.notices), seen.notices
    seen = plain_up(job, tmp_path, fake, monkeypatch)
    assert fake.hosts == [["a", "b", "c"], ["a", "b", "c"], ["a", "c", "s1"]]
    line = next(n for n in seen.notices if n.startswith("leaving b out"))
    assert line.startswith("leaving b out: quarantined (2 host faults in 24 h: SIGKILL at ")
    assert "(run plain-1)" in line and line.endswith("; release it with: ddpctl hosts --release b")
    assert "spare s1 takes a place in this run" in seen.notices
    (row,) = Ledger().read([B]).hosts
    assert row.runs == 2 and [e.kind for e in row.events] == [EventKind.HOST_FAULT] * 2
    assert Ledger().read([A]).hosts[0].hostname == "a.lab"


def test_without_a_spare_a_plain_up_shrinks_to_min_nodes_else_refuses(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    faults(B)
    fake = FakeLaunch()
    plain_up(make_job(spares=(), min_nodes=2, max_restarts=0), tmp_path, fake, monkeypatch)
    assert fake.hosts == [["a", "c"]]
    with pytest.raises(LaunchBlocked, match=r"quarantined hosts leave too few to launch: 2 host\(s\) left") as err:
        plain_up(make_job(spares=(), max_restarts=0), tmp_path, fake, monkeypatch)
    assert "ddpctl hosts --release HOST" in str(err.value)


def test_the_job_or_the_inventory_can_turn_quarantine_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    faults(B)
    fake = FakeLaunch()
    plain_up(make_job(quarantine=False, max_restarts=0), tmp_path, fake, monkeypatch)
    job = make_job(max_restarts=0)
    plain_up(replace(job, inventory=replace(job.inventory, quarantine=False)), tmp_path, fake, monkeypatch)
    assert fake.hosts == [["a", "b", "c"]] * 2


def test_a_detached_up_leaves_a_quarantined_host_out_and_records_its_hosts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    faults(B)
    started: list[list[str]] = []

    def detach(job: Job, backend: Any, observer: Any, options: Any = None) -> Any:
        started.append([h.name for h in job.hosts])
        return SimpleNamespace(plan=SimpleNamespace(job_id="detached-1"))

    monkeypatch.setattr(core, "detach", detach)
    seen = Collected()
    request = UpRequest(LaunchOptions(runs_dir=tmp_path), max_restarts=0, detach=True)
    run_up_detach(make_job(max_restarts=0), None, None, request, seen)  # type: ignore[arg-type]
    assert started == [["a", "c", "s1"]]
    assert any(n.startswith("leaving b out: quarantined (2 host faults") for n in seen.notices), seen.notices
    runs = {row.name: row.runs for row in Ledger().read([A, B, C, S1]).hosts}
    assert runs == {"a": 1, "b": 2, "c": 1, "s1": 1}  # b's two are the faulted runs, before


def test_every_restart_attempt_leaves_a_quarantined_host_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    faults(S1)  # the spare is quarantined: it never takes a place
    fake = FakeLaunch(["c"])
    monkeypatch.setattr(core, "launch", fake)
    seen = Collected()
    job = make_job(spares=(S1, Host("s2", "198.18.1.2", spare=True)))
    run = Restarts(job, lambda j: None, seen, LaunchOptions(runs_dir=tmp_path), 2)()  # type: ignore[arg-type,return-value]
    assert run.exit_code == 0
    assert fake.hosts == [["a", "b", "c"], ["a", "b", "s2"]]
    assert any(n.startswith("leaving s1 out: quarantined (2 host faults") for n in seen.notices)
    assert [(e.host, e.from_attempt) for e in run.excluded][:2] == [("s1", 0), ("c", 1)]
    (row,) = Ledger().read([C]).hosts
    assert [(e.kind, e.run_id) for e in row.events] == [(EventKind.HOST_FAULT, f"{run.run_id}.0")]


def test_a_restarted_run_refuses_at_once_when_quarantine_leaves_too_few(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    faults(A)
    monkeypatch.setattr(core, "launch", FakeLaunch())
    with pytest.raises(LaunchBlocked, match="quarantined hosts leave too few"):
        Restarts(make_job(spares=()), lambda j: None, Collected(), LaunchOptions(runs_dir=tmp_path), 2)()  # type: ignore[arg-type,return-value]


def test_a_broken_ledger_is_a_warning_and_the_launch_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = Path(tmp_path / "state")
    state.mkdir()
    (state / "hosts.sqlite").write_bytes(b"\x00garbage" * 300)
    monkeypatch.setenv("DDPCTL_STATE_DIR", str(state))
    fake = FakeLaunch()
    seen = plain_up(make_job(max_restarts=0), tmp_path, fake, monkeypatch)
    assert fake.hosts == [["a", "b", "c"]]
    assert any(n.startswith("warning: host ledger") and "corrupt" in n for n in seen.notices), seen.notices
    assert list(state.glob("hosts.sqlite.corrupt-*"))


def test_a_host_that_only_did_not_confirm_a_stop_in_time_is_seen_not_charged(tmp_path: Path) -> None:
    """Stopped by the user while its link was in a blip, a host that could not confirm the stop
    within its bound is lost to that run (`up` ends without it), but that is no evidence it failed:
    the ledger keeps no fault (a blip is not a death). One lost by silence is charged."""
    from orchestrator.restarts import hostledger
    from orchestrator.restarts.loop import lost_hosts

    job = make_job(max_restarts=0)
    for unconfirmed, kinds in ((True, []), (False, [EventKind.LOST])):
        done = result(job, f"stop-{unconfirmed}")
        run = next(r for r in done.hosts if r.host == "b")
        run.state, run.error, run.stop_unconfirmed = RunState.LOST, "did not confirm the stop", unconfirmed
        Ledger().path.unlink(missing_ok=True)
        assert hostledger.record_attempt(job, done, lost_hosts(done), {}) == []
        (row,) = Ledger().read([B]).hosts
        assert row.runs == 1 and [e.kind for e in row.events] == kinds
