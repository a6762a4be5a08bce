"""The time account as a pure function of a run's events (orchestrator/account/): recorded
timelines, each with the parts it must give, and the one line `up` ends with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.account import events as ev
from orchestrator.account.compute import Account, Redone, account
from orchestrator.account.events import Event, EventLog, read
from orchestrator.account.text import line

T0 = 1_800_000_000.0


def E(t: float, kind: str, **fields: Any) -> Event:
    return Event(T0 + t, kind, fields.pop("attempt", None), fields.pop("host", None), fields.pop("cause", None),
                 fields.pop("step", None), fields)


def start(checkpoints: bool = True) -> list[Event]:
    return [E(0, ev.RUN_START, run_id="r1", job="train", checkpoints=checkpoints),
            E(0, ev.ATTEMPT_START, attempt=0)]


# The issue's run: node0 cut from SSH at 30.6 s, lost at 90.7 s, fenced to 106.8 s, the next
# attempt's first step at 118.3 s resuming from the checkpoint at step 121, done at 209.6 s.
LOST_HOST = [*start(), E(5, ev.LAUNCH, attempt=0), E(14.5, ev.FIRST_STEP, attempt=0, step=1),
             E(20, ev.PROGRESS, attempt=0, step=80), E(29.6, ev.CHECKPOINT, attempt=0, host="node1", step=121),
             E(30.6, ev.CONTACT_LOST, attempt=0, host="node0"), E(90.7, ev.LOST, attempt=0, host="node0"),
             E(92, ev.ATTEMPT_END, attempt=0, outcome="failed", step=129, last_step=T0 + 90),
             E(92, ev.FENCE_START, attempt=0, hosts=["node0"]), E(106.8, ev.FENCE_END, attempt=0),
             E(106.8, ev.RESTART, attempt=1, host="node0", cause="lost"), E(106.8, ev.ATTEMPT_START, attempt=1),
             E(118.3, ev.FIRST_STEP, attempt=1, step=1),
             E(209.2, ev.ATTEMPT_END, attempt=1, outcome="ok", step=400, last_step=T0 + 209.2),
             E(209.6, ev.RUN_END, outcome="ok")]

CLEAN = [*start(False), E(8, ev.FIRST_STEP, attempt=0, step=1),
         E(100, ev.ATTEMPT_END, attempt=0, outcome="ok", last_step=T0 + 99), E(100, ev.RUN_END, outcome="ok")]

ERROR_NO_CHECKPOINTS = [*start(False), E(10, ev.FIRST_STEP, attempt=0, step=1),
                        E(40, ev.FAILED, attempt=0, host="node1", cause="failed"),
                        E(41, ev.ATTEMPT_END, attempt=0, outcome="failed", last_step=T0 + 40),
                        E(41, ev.RESTART, attempt=1, cause="error"), E(41, ev.BACKOFF_START, attempt=0),
                        E(46, ev.BACKOFF_END, attempt=0), E(46, ev.ATTEMPT_START, attempt=1),
                        E(55, ev.FIRST_STEP, attempt=1, step=1),
                        E(100, ev.ATTEMPT_END, attempt=1, outcome="ok", last_step=T0 + 100),
                        E(100, ev.RUN_END, outcome="ok")]

STRAGGLER = [*start(False), E(10, ev.FIRST_STEP, attempt=0, step=1),
             E(20, ev.STRAGGLER, attempt=0, host="node2", rank=2, end=T0 + 60, slower=0.25),
             E(110, ev.ATTEMPT_END, attempt=0, outcome="ok", last_step=T0 + 110), E(110, ev.RUN_END, outcome="ok")]

STALL_THEN_STOP = [*start(False), E(10, ev.FIRST_STEP, attempt=0, step=1),
                   E(30, ev.STALL_START, attempt=0, cause="hang"), E(50, ev.STALL_END, attempt=0, step=90),
                   E(70, ev.STOP, attempt=0, cause="stopped by Ctrl-C"),
                   E(72, ev.ATTEMPT_END, attempt=0, outcome="stopped", last_step=T0 + 70),
                   E(72, ev.RUN_END, outcome="stopped")]

SLURM_REQUEUE = [*start(), E(1, ev.QUEUED, attempt=0), E(21, ev.RUNNING, attempt=0),
                 E(30, ev.FIRST_STEP, attempt=0, step=1), E(50, ev.CHECKPOINT, attempt=0, host="n1", step=40),
                 E(60, ev.REQUEUED, attempt=0, cause="requeued"), E(62, ev.QUEUED, attempt=0),
                 E(70, ev.RUNNING, attempt=0), E(80, ev.FIRST_STEP, attempt=0, step=1),
                 E(150, ev.ATTEMPT_END, attempt=0, outcome="ok", last_step=T0 + 150),
                 E(150, ev.RUN_END, outcome="ok")]

FAILED_FOR_GOOD = [*start(False), E(10, ev.FIRST_STEP, attempt=0, step=1),
                   E(50, ev.FAILED, attempt=0, host="node3", cause="failed"),
                   E(53, ev.ATTEMPT_END, attempt=0, outcome="failed", last_step=T0 + 50),
                   E(53, ev.RUN_END, outcome="failed")]

CASES: dict[str, tuple[list[Event], dict[tuple[str, str | None], float], float]] = {
    # name: events, {(kind, host): seconds}, productive seconds
    "lost host": (LOST_HOST, {("start-up", None): 14.5, ("detection", "node0"): 60.1, ("fencing", "node0"): 14.8,
                              ("relaunch", "node0"): 12.8, ("re-done", "node0"): 1.0, ("shutdown", None): 0.4}, 106.0),
    "clean": (CLEAN, {("start-up", None): 8, ("shutdown", None): 1}, 91),
    "error, no checkpoints": (ERROR_NO_CHECKPOINTS, {("start-up", None): 10, ("relaunch", None): 10,
                                                     ("backoff", None): 5}, 75),
    "straggler": (STRAGGLER, {("start-up", None): 10, ("straggler", "node2"): 8}, 92),
    "stall then stop": (STALL_THEN_STOP, {("start-up", None): 10, ("no progress", None): 20,
                                          ("stopped", None): 2}, 40),
    "slurm requeue": (SLURM_REQUEUE, {("pending", None): 20, ("start-up", None): 10, ("requeue", None): 20,
                                      ("re-done", None): 10}, 90),
    "failed for good": (FAILED_FOR_GOOD, {("start-up", None): 10, ("failure", "node3"): 3}, 40),
}


@pytest.mark.parametrize("name", CASES)
def test_the_parts_add_up_to_the_wall_time_and_are_charged_as_recorded(name: str) -> None:
    events, parts, productive = CASES[name]
    got = account(events)
    assert got.productive_s + sum(p.seconds for p in got.parts) == pytest.approx(got.wall_s, abs=1e-6)
    charged: dict[tuple[str, str | None], float] = {}
    for part in got.parts:
        charged[(part.kind, part.host)] = charged.get((part.kind, part.host), 0.0) + part.seconds
    assert charged == pytest.approx(parts, abs=0.01)
    assert got.productive_s == pytest.approx(productive, abs=0.01)


def test_the_issue_run_in_one_line() -> None:
    got = account(LOST_HOST)
    assert line(got) == ("goodput 51 % (106 s of 210 s): 89 s to node0 (lost: 60 s detection, 15 s fencing, "
                         "13 s relaunch, 1 s re-done since step 121), 14 s start-up")
    assert got.by_host() == pytest.approx({"node0": 88.7}, abs=0.01)
    assert got.redone.known and got.redone.steps == 129 - 121 and got.redone.since_step == 121
    assert got.attempts == 2 and got.outcome == "ok" and got.restarted


def test_without_checkpoints_re_done_work_is_unknown_not_guessed() -> None:
    got = account(ERROR_NO_CHECKPOINTS)
    assert not got.redone.known and got.redone.steps is None
    assert "re-done work unknown" in line(got)
    assert "re-done" not in {p.kind for p in got.parts}


def test_a_blip_is_not_a_loss() -> None:
    """Contact lost and back: no detection time, the steps meanwhile are productive."""
    events = [*start(False), E(10, ev.FIRST_STEP, attempt=0, step=1), E(30, ev.CONTACT_LOST, attempt=0, host="n0"),
              E(45, ev.CONTACT_BACK, attempt=0, host="n0"),
              E(100, ev.ATTEMPT_END, attempt=0, outcome="ok", last_step=T0 + 100), E(100, ev.RUN_END, outcome="ok")]
    got = account(events)
    assert got.by_host() == {} and got.productive_s == pytest.approx(90)


def test_a_run_without_its_end_counts_to_now() -> None:
    events = [*start(False), E(10, ev.FIRST_STEP, attempt=0, step=1), E(40, ev.PROGRESS, attempt=0, step=50)]
    got = account(events, now=T0 + 60)
    assert got.outcome == "running" and got.wall_s == pytest.approx(60)
    assert got.productive_s + sum(p.seconds for p in got.parts) == pytest.approx(60)


def test_the_events_file_round_trips_and_a_torn_line_is_skipped(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    for e in LOST_HOST:
        log.add(e.kind, e.t, attempt=e.attempt, host=e.host, cause=e.cause, step=e.step, **e.extra)
    with (tmp_path / ev.FILE_NAME).open("a") as out:
        out.write('{"t": 1, "event": "progr')  # a run killed mid-line
    back = read(tmp_path / ev.FILE_NAME)
    assert [(e.kind, e.host, e.step) for e in back] == [(e.kind, e.host, e.step) for e in LOST_HOST]
    assert line(account(back)) == line(account(LOST_HOST))


def test_the_account_round_trips_through_json() -> None:
    got = account(LOST_HOST)
    again = Account.from_json(json.loads(json.dumps(got.to_json())))
    assert again.to_json() == got.to_json() and line(again) == line(got)


def test_an_unwritable_events_file_costs_the_account_not_the_run(tmp_path: Path) -> None:
    (tmp_path / ev.FILE_NAME).mkdir()  # a folder where the file would be
    log = EventLog(tmp_path)
    log.add(ev.RUN_START)
    assert log.broken is not None
    log.add(ev.RUN_END)  # quiet from now on


def test_events_are_held_until_the_run_has_its_folder(tmp_path: Path) -> None:
    """A launch its checks refuse leaves nothing behind; one that starts has them all, in order."""
    run = tmp_path / "runs" / "r1"
    log = EventLog(run)
    log.add(ev.RUN_START, T0)
    log.add(ev.ATTEMPT_START, T0, attempt=0)
    assert not run.exists() and [e.kind for e in log.events()] == [ev.RUN_START, ev.ATTEMPT_START]
    run.mkdir(parents=True)  # the launch's run directory
    log.add(ev.LAUNCH, T0 + 1, attempt=0)
    assert [e.kind for e in read(run / ev.FILE_NAME)] == [ev.RUN_START, ev.ATTEMPT_START, ev.LAUNCH]
    assert [e.kind for e in log.events()] == [ev.RUN_START, ev.ATTEMPT_START, ev.LAUNCH]


def test_a_run_without_optimizer_steps_has_no_goodput_to_tell() -> None:
    events = [*start(False), E(30, ev.ATTEMPT_END, attempt=0, outcome="ok"), E(30, ev.RUN_END, outcome="ok")]
    got = account(events)
    assert got.goodput is None and not got.stepped
    assert line(got) == "goodput unknown (no rank took an optimizer step the rank wrapper saw) in 30 s: 30 s start-up"


def test_two_failures_re_done_say_their_sum_and_no_single_step() -> None:
    events = [*start(), E(10, ev.FIRST_STEP, attempt=0, step=1), E(20, ev.CHECKPOINT, attempt=0, step=50),
              E(30, ev.FAILED, attempt=0, host="n1"), E(30, ev.ATTEMPT_END, attempt=0, outcome="failed", step=90,
                                                        last_step=T0 + 30),
              E(30, ev.RESTART, attempt=1, host="n1", cause="host fault"), E(30, ev.ATTEMPT_START, attempt=1),
              E(40, ev.FIRST_STEP, attempt=1, step=1), E(50, ev.CHECKPOINT, attempt=1, step=20),
              E(54, ev.FAILED, attempt=1, host="n2"), E(54, ev.ATTEMPT_END, attempt=1, outcome="failed", step=35,
                                                        last_step=T0 + 54),
              E(54, ev.RESTART, attempt=2, host="n2", cause="host fault"), E(54, ev.ATTEMPT_START, attempt=2),
              E(60, ev.FIRST_STEP, attempt=2, step=1),
              E(90, ev.ATTEMPT_END, attempt=2, outcome="ok", last_step=T0 + 90), E(90, ev.RUN_END, outcome="ok")]
    got = account(events)
    redone = {p.host: p.seconds for p in got.parts if p.kind == "re-done"}
    assert redone == pytest.approx({"n1": 10, "n2": 4})
    assert got.redone.steps == (90 - 50) + (35 - 20) and got.redone.since_step is None
    assert "4 s re-done)" in line(got) and "since step" not in line(got)


@pytest.mark.parametrize(("wall", "productive"), [(47.8612, 11.93265), (1000.0, 249.24951), (3.0, 2.99951)])
def test_an_account_read_back_from_its_json_says_the_same_goodput(wall: float, productive: float) -> None:
    """`ddpctl runs` reads accounts back from the ledger's JSON: its goodput is the run's own, to the digit."""
    written = Account("r1", "train", T0, T0 + wall, productive, (), Redone(False), 1, "ok").to_json()
    back = Account.from_json(written)
    assert back.goodput is not None and round(back.goodput, 4) == written["goodput"]
