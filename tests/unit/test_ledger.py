"""The host ledger (orchestrator/hostops/ledger.py): where it lives, what it keeps, and that it never
blocks a launch: several processes writing at once keep every event, a corrupt file is moved aside
with a warning, a locked one is a warning within its busy timeout, a read-only one a warning."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest

from inventory import Host
from orchestrator.checks.model import CheckStatus, Finding
from orchestrator.hostops import ledger as ledger_mod
from orchestrator.hostops.ledger import (
    SCHEMA_VERSION,
    Ledger,
    Note,
    Sighting,
    address_of,
    key_of,
    ledger_path,
    record_doctor,
)
from orchestrator.hostops.quarantine import EventKind
from orchestrator.remote.wire import Facts, HostFacts

NODE0 = Host("node0", "198.18.0.10", user="alice", port=2222)
NODE1 = Host("node1", "198.18.0.11")
OTHER0 = Host("node0", "10.0.0.5")  # another cluster's node0


def test_the_file_is_under_the_state_directory_first_then_xdg_then_home(tmp_path: Path) -> None:
    assert ledger_path({"DDPCTL_STATE_DIR": str(tmp_path)}) == tmp_path / "hosts.sqlite"
    assert ledger_path({"XDG_STATE_HOME": "/x/state"}) == Path("/x/state/ddpctl/hosts.sqlite")
    assert ledger_path({}) == Path.home() / ".local/state/ddpctl/hosts.sqlite"


def test_the_tests_never_write_the_users_ledger(tmp_path: Path) -> None:
    assert Path(os.environ["DDPCTL_STATE_DIR"]) != Path.home() / ".local/state/ddpctl"
    assert ledger_path().parent == Path(os.environ["DDPCTL_STATE_DIR"])


def test_a_host_is_its_name_and_its_address_as_the_inventory_gives_them() -> None:
    assert address_of(NODE0) == "alice@198.18.0.10:2222" and address_of(NODE1) == "198.18.0.11"
    assert key_of(NODE0) != key_of(OTHER0)


def test_runs_and_events_are_kept_per_host_and_two_clusters_node0_do_not_mix(tmp_path: Path) -> None:
    book = Ledger(tmp_path / "hosts.sqlite")
    assert book.record("run-1.0", "up", [Sighting(NODE0, "gpu-a"), Sighting(NODE1)],
                       [Note(NODE1, EventKind.HOST_FAULT, "a rank was killed (SIGKILL)")], at=100.0) == []
    assert book.record("run-2", "doctor", [Sighting(NODE0, None, 8), Sighting(OTHER0)], at=200.0) == []
    reading = book.read()
    assert reading.warnings == []
    rows = {r.key: r for r in reading.hosts}
    mine = rows[key_of(NODE0)]
    assert (mine.hostname, mine.gpus, mine.runs, mine.first_seen, mine.last_seen) == ("gpu-a", 8, 2, 100.0, 200.0)
    assert rows[key_of(OTHER0)].runs == 1 and rows[key_of(OTHER0)].events == ()
    (event,) = rows[key_of(NODE1)].events
    assert (event.kind, event.run_id, event.at) == (EventKind.HOST_FAULT, "run-1.0", 100.0)
    only = book.read([NODE1, Host("node9", "198.18.0.19")]).hosts  # an inventory's hosts, known or not
    assert [(r.name, r.runs) for r in only] == [("node1", 1), ("node9", 0)]


def test_the_same_run_counts_once_and_each_host_keeps_its_newest_events(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger_mod, "KEEP_EVENTS", 3)
    book = Ledger(tmp_path / "hosts.sqlite")
    for i in range(5):
        book.record("run-1", "up", [Sighting(NODE1)], [Note(NODE1, EventKind.STRAGGLER, f"slow {i}")], at=float(i))
    (row,) = book.read([NODE1]).hosts
    assert row.runs == 1
    assert [e.detail for e in row.events] == ["slow 2", "slow 3", "slow 4"]


def test_the_schema_is_versioned(tmp_path: Path) -> None:
    path = tmp_path / "hosts.sqlite"
    Ledger(path).record("r", "up", [Sighting(NODE1)])
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    warnings = Ledger(path).record("r2", "up", [Sighting(NODE1)])
    assert len(warnings) == 1 and "newer ddpctl" in warnings[0] and "the run goes on" in warnings[0]


def write_many(path: str, writer: int, count: int) -> None:
    book = Ledger(Path(path), timeout=20.0)
    host = Host(f"node{writer % 2}", f"198.18.0.{10 + writer % 2}")
    for i in range(count):
        warnings = book.record(f"run-{writer}-{i}", "up", [Sighting(host)],
                               [Note(host, EventKind.HOST_FAULT, f"writer {writer} fault {i}")])
        assert warnings == [], warnings


def test_several_processes_writing_at_once_keep_every_event(tmp_path: Path) -> None:
    path = tmp_path / "hosts.sqlite"
    ctx = multiprocessing.get_context("spawn" if os.name != "posix" else "fork")
    procs = [ctx.Process(target=write_many, args=(str(path), w, 25)) for w in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 6
    reading = Ledger(path).read()
    assert reading.warnings == []
    assert sum(len(r.events) for r in reading.hosts) == 6 * 25
    assert sum(r.runs for r in reading.hosts) == 6 * 25
    assert {e.detail for r in reading.hosts for e in r.events} == {f"writer {w} fault {i}"
                                                                  for w in range(6) for i in range(25)}


def test_a_corrupt_file_is_moved_aside_with_a_warning_and_a_fresh_one_started(tmp_path: Path) -> None:
    path = tmp_path / "hosts.sqlite"
    path.write_bytes(b"garbage, not SQLite at all " * 200)
    warnings = Ledger(path).record("run-1", "up", [Sighting(NODE1)])
    assert len(warnings) == 1 and "corrupt" in warnings[0] and "moved aside to" in warnings[0], warnings
    (aside,) = tmp_path.glob("hosts.sqlite.corrupt-*")
    assert aside.read_bytes().startswith(b"garbage")  # kept, never deleted
    assert [r.runs for r in Ledger(path).read().hosts] == [1]  # the run went on into the fresh one


def test_a_corrupt_file_found_by_a_read_gives_no_rows_but_no_error_either(tmp_path: Path) -> None:
    path = tmp_path / "hosts.sqlite"
    Ledger(path).record("run-1", "up", [Sighting(NODE1)])
    with path.open("r+b") as f:  # the header's magic string gone: "file is not a database"
        f.write(b"\0" * 100)
    reading = Ledger(path).read()
    assert reading.hosts == [] and "corrupt" in reading.warnings[0]


def test_a_locked_ledger_is_a_warning_after_the_busy_timeout_not_a_block(tmp_path: Path) -> None:
    path = tmp_path / "hosts.sqlite"
    Ledger(path).record("run-0", "up", [Sighting(NODE1)])
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:  # it answers while the lock is still held (a block would wait for the holder, which waits for it)
        warnings = Ledger(path, timeout=0.3).record("run-1", "up", [Sighting(NODE1)])
        assert holder.in_transaction
        assert len(warnings) == 1 and "locked" in warnings[0] and "the run goes on" in warnings[0], warnings
        assert Ledger(path, timeout=0.3).read().hosts[0].runs == 1  # WAL: readers go on beside a writer
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert not list(tmp_path.glob("*.corrupt-*"))  # locked is not corrupt


def _record_in(path: str, out: multiprocessing.SimpleQueue[list[str]]) -> None:
    if os.geteuid() == 0:  # root writes read-only files: the ledger's user here is nobody
        os.setgid(65534)
        os.setuid(65534)
    out.put(Ledger(Path(path)).record("run-1", "up", [Sighting(NODE1)]))


def test_a_read_only_directory_is_a_warning() -> None:
    state = Path(tempfile.mkdtemp(prefix="ddpctl-ro-"))  # under /tmp: a user other than root can reach it
    try:
        state.chmod(0o555)
        out: multiprocessing.SimpleQueue[list[str]] = multiprocessing.SimpleQueue()
        child = multiprocessing.get_context("fork").Process(target=_record_in, args=(str(state / "hosts.sqlite"), out))
        child.start()
        child.join(30)
        assert child.exitcode == 0, "the ledger raised instead of warning"
        warnings = out.get()
    finally:
        shutil.rmtree(state)
    assert len(warnings) == 1 and "skipped" in warnings[0], warnings


def test_a_state_directory_that_cannot_be_made_is_a_warning(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    warnings = Ledger(tmp_path / "file" / "hosts.sqlite").record("run-1", "up", [Sighting(NODE1)])
    assert len(warnings) == 1 and "recording skipped" in warnings[0]
    reading = Ledger(tmp_path / "file" / "hosts.sqlite").read()
    assert reading.hosts == [] and "reading skipped" in reading.warnings[0]


def test_doctor_records_hosts_seen_with_hostname_and_gpus_and_its_findings(tmp_path: Path) -> None:
    book = Ledger(tmp_path / "hosts.sqlite")
    facts = {"node0": HostFacts("node0", Facts(hostname="gpu-a", gpu_count=8))}
    findings = [Finding("gpu_health", CheckStatus.FAIL, "node0", "Xid 79 on GPU 3"),
                Finding("clock", CheckStatus.WARN, "node1", "clock 2 s off"),
                Finding("ssh", CheckStatus.OK, "node0", "fine"),
                Finding("firewall", CheckStatus.FAIL, None, "the whole cluster")]
    assert record_doctor([NODE0, NODE1], facts, findings, "doctor-1", deep_checks={"gpu_health"}, ledger=book) == []
    rows = {r.name: r for r in book.read([NODE0, NODE1]).hosts}
    assert (rows["node0"].hostname, rows["node0"].gpus, rows["node0"].runs) == ("gpu-a", 8, 1)
    assert rows["node1"].runs == 0  # it did not answer: not seen, but its finding is kept
    assert [(e.kind, e.detail) for e in rows["node0"].events] == [(EventKind.DEEP_FINDING,
                                                                   "[gpu_health] fail: Xid 79 on GPU 3")]
    assert [e.kind for e in rows["node1"].events] == [EventKind.FINDING]
