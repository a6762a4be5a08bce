"""The host ledger's runs' accounts (orchestrator/hostops/ledger.py): a file an older ddpctl wrote
gets their tables in place, with its rows and its version kept; each run's account is kept (once per run, newest first,
bounded) with what each of the job's hosts cost it; the cost in a window reaches `ddpctl hosts`'
rows and the quarantine's reason; `up`'s hook (restarts/hostledger.py) never raises."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
from account_fixtures import HOSTS, NODE0, NODE1, account

from inventory import Host, Inventory, Job
from inventory.specs import SlurmSpec
from orchestrator.hostops import ledger as ledger_mod
from orchestrator.hostops.hostbook import hosts_view
from orchestrator.hostops.ledger import SCHEMA_VERSION, Ledger, Note, key_of
from orchestrator.hostops.quarantine import Cost, EventKind, LedgerState, Policy, Spent, judge, spent
from orchestrator.restarts import hostledger

NOW = 1_700_000_000.0
H = 3600.0


def version_1_file(path: Path) -> None:
    """What version 1 wrote (its migration from an empty file), with a host, a run and an event."""
    db = sqlite3.connect(path)
    try:
        for statement in ledger_mod.SCHEMA_V1:
            db.execute(statement)
        key = key_of(NODE1)
        db.execute("INSERT INTO hosts VALUES (?, 'node1', '198.18.0.11', 'gpu-b', 8, 10.0, 20.0, 1)", (key,))
        db.execute("INSERT INTO runs (host, run_id, at, kind) VALUES (?, 'old-1', 20.0, 'up')", (key,))
        db.execute("INSERT INTO events (host, at, run_id, kind, detail) VALUES (?, 20.0, 'old-1', 'lost', 'gone')",
                   (key,))
        db.execute("PRAGMA user_version = 1")
        db.commit()
    finally:
        db.close()


def test_a_file_without_accounts_gets_them_in_place_and_keeps_its_hosts_runs_and_events(tmp_path: Path) -> None:
    """An older ddpctl's file: the accounts' tables are added, its rows kept, and its version left
    as it was, so that older ddpctl (which refuses a newer version) still reads it."""
    path = tmp_path / "hosts.sqlite"
    version_1_file(path)
    db = sqlite3.connect(path)
    try:
        assert {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")} == {
            "hosts", "runs", "events"}
    finally:
        db.close()
    book = Ledger(path)
    assert book.record_account(account("new-1", NOW, node1=40.0), HOSTS) == []
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 1
        assert {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")} == {
            "hosts", "runs", "events", "accounts", "costs"}
    finally:
        db.close()
    (row,) = book.read([NODE1]).hosts
    assert (row.hostname, row.gpus, row.runs, row.first_seen) == ("gpu-b", 8, 1, 10.0)
    assert [(e.kind, e.detail, e.run_id) for e in row.events] == [(EventKind.LOST, "gone", "old-1")]
    assert [(c.run_id, c.seconds) for c in row.costs] == [("new-1", 40.0)]
    assert [a.run_id for a in book.accounts(0.0).accounts] == ["new-1"]


def test_a_fresh_file_and_an_upgraded_one_have_the_same_tables(tmp_path: Path) -> None:
    def tables(path: Path) -> set[str]:
        Ledger(path).read()
        db = sqlite3.connect(path)
        try:
            return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'index')")}
        finally:
            db.close()

    old = tmp_path / "old.sqlite"
    version_1_file(old)
    assert tables(old) == tables(tmp_path / "fresh.sqlite") >= {"accounts", "costs", "hosts", "runs", "events"}


def test_an_account_is_kept_whole_with_its_row_and_read_back_newest_first(tmp_path: Path) -> None:
    book = Ledger(tmp_path / "hosts.sqlite")
    first, second = account("run-1", NOW - 2 * H, node1=40.0), account("run-2", NOW - H, node0=30.0)
    assert book.record_account(first, HOSTS) == book.record_account(second, HOSTS) == []
    reading = book.accounts(NOW - 3 * H)
    assert reading.warnings == [] and reading.accounts == [second, first]
    assert [a.run_id for a in book.accounts(NOW - 90 * 60).accounts] == ["run-2"]  # --since: by start
    assert book.accounts(NOW - 3 * H, until=NOW - 90 * 60).accounts == [first]
    db = sqlite3.connect(tmp_path / "hosts.sqlite")
    try:
        got = db.execute("SELECT job, wall_s, goodput, outcome, attempts, biggest FROM accounts "
                         "WHERE run_id = 'run-1'").fetchone()
    finally:
        db.close()
    assert got == ("train", 600.0, pytest.approx(535 / 600), "ok", 2, "40 s to node1")


def test_recording_a_run_again_replaces_its_account_and_costs(tmp_path: Path) -> None:
    book = Ledger(tmp_path / "hosts.sqlite")
    book.record_account(account("run-1", NOW, node1=40.0), HOSTS)
    book.record_account(account("run-1", NOW, node1=60.0, node0=10.0), HOSTS)
    (only,) = book.accounts(0.0).accounts
    assert only.by_host() == {"node1": 60.0, "node0": 10.0}
    rows = {r.name: r for r in book.read().hosts}
    assert [(c.run_id, c.seconds, c.causes) for c in rows["node1"].costs] == [("run-1", 60.0, "lost")]
    assert [(c.seconds, c.causes) for c in rows["node0"].costs] == [(10.0, "straggler")]


def test_a_host_not_among_the_jobs_is_not_charged_and_no_run_id_is_a_warning(tmp_path: Path) -> None:
    book = Ledger(tmp_path / "hosts.sqlite")
    assert book.record_account(account("run-1", NOW, node1=40.0, node0=10.0), [NODE0]) == []
    assert [r.name for r in book.read().hosts] == ["node0"]
    assert book.accounts(0.0).accounts[0].by_host() == {"node1": 40.0, "node0": 10.0}  # the account is whole
    nameless = replace(account("x", NOW), run_id=None)
    assert book.record_account(nameless, HOSTS) == ["host ledger: an account without a run id is not recorded"]


def test_the_accounts_and_each_hosts_costs_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger_mod, "KEEP_ACCOUNTS", 3)
    monkeypatch.setattr(ledger_mod, "KEEP_RUNS", 2)
    book = Ledger(tmp_path / "hosts.sqlite")
    for i in range(5):
        book.record_account(account(f"run-{i}", NOW + i * H, node1=10.0 + i), HOSTS)
    assert [a.run_id for a in book.accounts(0.0).accounts] == ["run-4", "run-3", "run-2"]
    (node1,) = book.read([NODE1]).hosts
    assert [c.run_id for c in node1.costs] == ["run-3", "run-4"]


def test_a_broken_ledger_is_a_warning_for_accounts_too(tmp_path: Path) -> None:
    (tmp_path / "hosts.sqlite").write_bytes(b"not a database at all" * 100)
    book = Ledger(tmp_path / "hosts.sqlite")
    warnings = book.record_account(account("run-1", NOW, node1=40.0), HOSTS)
    assert len(warnings) == 1 and "moved aside" in warnings[0]
    assert [a.run_id for a in book.accounts(0.0).accounts] == ["run-1"]  # on the fresh file


# -- the cost in a window ----------------------------------------------------------------------------

def test_the_cost_in_a_window_sums_the_runs_since_its_start() -> None:
    costs = [Cost(NOW - 30 * H, "a", 100.0, "lost"), Cost(NOW - 2 * H, "b", 40.0, "lost"),
             Cost(NOW - H, "c", 98.0, "SIGKILL")]
    assert spent(costs, NOW - 24 * H) == Spent(138.0, 2)
    assert spent(costs, NOW - 24 * H).text() == "138 s in 2 runs"
    assert Spent(138.0 * 60, 1).text() == "138.0 min in 1 run" and Spent().text() == "-"


def test_the_quarantine_reason_says_what_the_faults_cost_in_its_window_since_the_release() -> None:
    faults = [ledger_event(NOW - 2 * H), ledger_event(NOW - H)]
    costs = [Cost(NOW - 30 * H, "old", 500.0, "lost"), Cost(NOW - 2 * H, "a", 100.0, "lost"),
             Cost(NOW - H, "b", 86.0, "SIGKILL")]
    got = judge(faults, Policy(), NOW, costs)
    assert got.state is LedgerState.QUARANTINED
    assert got.reason is not None and got.reason.startswith("2 host faults in 24 h, costing 186 s: ")
    one = judge(faults[1:], Policy(), NOW, costs[2:])
    assert one.reason is not None and one.reason.startswith("1 host fault(s) in 24 h, costing 86 s: ")
    released = judge([*faults[:1], ledger_event(NOW - 90 * 60, EventKind.RELEASE), faults[1]], Policy(), NOW, costs)
    assert released.reason is not None and ", costing 86 s: " in released.reason
    assert "costing" not in (judge(faults, Policy(), NOW).reason or "")  # no account: no cost said


def ledger_event(at: float, kind: EventKind = EventKind.HOST_FAULT) -> ledger_mod.Event:
    return ledger_mod.Event(at, kind, "a rank was killed (SIGKILL)", "r")


def test_hosts_rows_carry_the_cost_in_the_quarantine_window(tmp_path: Path) -> None:
    book = Ledger(tmp_path / "hosts.sqlite")
    book.record_account(account("run-old", NOW - 30 * H, node1=500.0), HOSTS)
    book.record_account(account("run-1", NOW - 3 * H, node1=100.0, node0=12.0), HOSTS)
    book.record_account(account("run-2", NOW - 2 * H, node1=38.0), HOSTS)
    book.record("run-2", "up", [], [Note(NODE1, EventKind.HOST_FAULT, "a rank was killed (SIGKILL)", NOW - 2 * H)])
    view = hosts_view(None, book, now=NOW)
    rows = {row.record.name: row for row in view.rows}
    assert rows["node1"].cost == Spent(138.0, 2) and rows["node0"].cost == Spent(12.0, 1)
    assert rows["node1"].to_json()["cost"] == {"seconds": 138.0, "runs": 2}
    assert rows["node1"].judgement.reason is not None and "costing 138 s" in rows["node1"].judgement.reason


# -- up's hook ------------------------------------------------------------------------------------------

def job(hosts: tuple[Host, ...] = (NODE0, NODE1)) -> Job:
    return Job("train", Inventory(HOSTS), hosts, script="train.py")


def test_up_records_the_account_with_the_jobs_and_the_inventorys_hosts() -> None:
    assert hostledger.record_account(job((NODE0,)), account("run-1", NOW, node1=40.0, node0=10.0)) == []
    assert {r.name: [c.seconds for c in r.costs] for r in Ledger().read().hosts} == {"node0": [10.0],
                                                                                    "node1": [40.0]}


def test_on_slurm_the_account_is_kept_but_no_host_charged() -> None:
    slurm = replace(job(), slurm=SlurmSpec())
    assert hostledger.record_account(slurm, account("run-1", NOW, node1=40.0)) == []
    assert [a.run_id for a in Ledger().accounts(0.0).accounts] == ["run-1"] and Ledger().read().hosts == []


def test_up_is_told_not_stopped_when_the_ledger_cannot_be_written(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    warnings = hostledger.record_account(job(), account("run-1", NOW, node1=40.0), Ledger(blocked / "hosts.sqlite"))
    assert len(warnings) == 1 and "recording the run's account skipped" in warnings[0]
