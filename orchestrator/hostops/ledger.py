"""The host ledger: what ddpctl learns about each host, kept across runs on this machine in one SQLite
file (`$DDPCTL_STATE_DIR/hosts.sqlite`, else `$XDG_STATE_HOME/ddpctl/hosts.sqlite`, else
`~/.local/state/ddpctl/hosts.sqlite`): each host as seen, its runs, and its events (faults, findings,
releases); each run's time account (orchestrator/account) and what each host cost it. WAL, a busy
timeout and short transactions let several ddpctl processes write at once.

It never blocks a launch: every operation turns a SQLite or OS error (locked, corrupt, read-only, a
disk error) into a warning and goes on without it; a corrupt file is moved aside
(`hosts.sqlite.corrupt-<time>`, never deleted) and a fresh one started."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from inventory import Host
from orchestrator.account import text
from orchestrator.account.compute import Account, totals
from orchestrator.hostops.quarantine import Cost, Event, EventKind
from orchestrator.remote.wire import HostFacts

FILE_NAME = "hosts.sqlite"
STATE_DIR_ENV = "DDPCTL_STATE_DIR"
BUSY_TIMEOUT_S = 3.0  # a writer waits this long for another one's transaction, then warns and goes on
SCHEMA_VERSION = 1  # PRAGMA user_version (tables added since leave it: below)
# Bounded: each host keeps its newest KEEP_EVENTS events, KEEP_RUNS runs and KEEP_RUNS costs (its run
# count goes on counting); the file keeps the newest KEEP_ACCOUNTS accounts. A release is newer than
# the faults it clears, so trimming never brings one back.
KEEP_EVENTS = 500
KEEP_RUNS = 500
KEEP_ACCOUNTS = 2000
DETAIL_CHARS = 500

SCHEMA_V1 = (
    """CREATE TABLE IF NOT EXISTS hosts (key TEXT PRIMARY KEY, name TEXT NOT NULL, address TEXT NOT NULL,
       hostname TEXT, gpus INTEGER, first_seen REAL NOT NULL, last_seen REAL, runs INTEGER NOT NULL DEFAULT 0)""",
    """CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY, host TEXT NOT NULL, run_id TEXT NOT NULL,
       at REAL NOT NULL, kind TEXT NOT NULL, UNIQUE (host, run_id, kind))""",
    """CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY, host TEXT NOT NULL, at REAL NOT NULL,
       run_id TEXT, kind TEXT NOT NULL, detail TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS events_by_host ON events (host, at)",
    "CREATE INDEX IF NOT EXISTS runs_by_host ON runs (host, at)",
)
# Added since: each run's account, and each host's cost per run (the seconds of the run's losses
# charged to it). Tables only, so the version stays: an older ddpctl reads the file as it did.
ACCOUNT_TABLES = (
    """CREATE TABLE IF NOT EXISTS accounts (run_id TEXT PRIMARY KEY, job TEXT, started REAL NOT NULL,
       ended REAL NOT NULL, wall_s REAL NOT NULL, productive_s REAL NOT NULL, goodput REAL, outcome TEXT NOT NULL,
       attempts INTEGER NOT NULL, biggest TEXT NOT NULL, account TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS accounts_by_start ON accounts (started)",
    """CREATE TABLE IF NOT EXISTS costs (id INTEGER PRIMARY KEY, host TEXT NOT NULL, run_id TEXT NOT NULL,
       at REAL NOT NULL, seconds REAL NOT NULL, causes TEXT NOT NULL, UNIQUE (host, run_id))""",
    "CREATE INDEX IF NOT EXISTS costs_by_host ON costs (host, at)",
)
SCHEMA = (*SCHEMA_V1, *ACCOUNT_TABLES)
TABLES = {"hosts", "runs", "events", "accounts", "costs"}

T = TypeVar("T")


def ledger_path(env: Mapping[str, str] | None = None) -> Path:
    """Where the ledger lives on this machine."""
    env = os.environ if env is None else env
    if env.get(STATE_DIR_ENV):
        return Path(env[STATE_DIR_ENV]) / FILE_NAME
    base = Path(env["XDG_STATE_HOME"]) if env.get("XDG_STATE_HOME") else Path.home() / ".local" / "state"
    return base / "ddpctl" / FILE_NAME


def address_of(host: Host) -> str:
    """user@host:port as the inventory gives it (what tells two clusters' `node0` apart)."""
    user = f"{host.user}@" if host.user else ""
    port = f":{host.port}" if host.port else ""
    return f"{user}{host.address}{port}"


def key_of(host: Host) -> str:
    return f"{host.name} {address_of(host)}"


@dataclass(frozen=True)
class Sighting:
    """A host seen by a run, with what it said of itself where known."""

    host: Host
    hostname: str | None = None
    gpus: int | None = None


@dataclass(frozen=True)
class Note:
    """A new event about a host."""

    host: Host
    kind: EventKind
    detail: str
    at: float | None = None  # None: the record's time


@dataclass(frozen=True)
class HostRecord:
    """One host as the ledger knows it."""

    name: str
    address: str
    hostname: str | None = None
    gpus: int | None = None
    first_seen: float | None = None
    last_seen: float | None = None
    runs: int = 0
    events: tuple[Event, ...] = ()
    costs: tuple[Cost, ...] = ()  # what it cost each run it was charged in, oldest first

    @property
    def key(self) -> str:
        return f"{self.name} {self.address}"


@dataclass
class Reading:
    hosts: list[HostRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class AccountReading:
    """Runs' accounts, newest first, and the ledger's warnings."""

    accounts: list[Account] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class DoctorFinding(Protocol):
    """What the ledger reads of a doctor finding (orchestrator/checks/model.py's Finding)."""

    @property
    def check(self) -> str: ...
    @property
    def host(self) -> str | None: ...
    @property
    def message(self) -> str: ...
    @property
    def status(self) -> object: ...  # CheckStatus: its value "fail", "warn", "ok", "skip"


class Ledger:
    """The ledger file at `path`; each call opens it, does one short transaction and closes it."""

    def __init__(self, path: Path | None = None, timeout: float = BUSY_TIMEOUT_S) -> None:
        self.path = path if path is not None else ledger_path()
        self.timeout = timeout

    def record(self, run_id: str, kind: str, seen: Sequence[Sighting], notes: Sequence[Note] = (),
               at: float | None = None) -> list[str]:
        """Record one run (`kind`: "doctor" or "up") of the hosts `seen`, and `notes`; the warnings."""
        when = time.time() if at is None else at
        _, warnings = self._guard("recording", lambda db: _record(db, run_id, kind, seen, notes, when), None)
        return warnings

    def read(self, hosts: Iterable[Host] | None = None) -> Reading:
        """Every host the ledger knows (`hosts`: these, known or not), with its events oldest first."""
        wanted = None if hosts is None else list(hosts)
        nothing: list[HostRecord] = []
        found, warnings = self._guard("reading", lambda db: _read(db, wanted), nothing)
        return Reading(found, warnings)

    def release(self, record: HostRecord, detail: str, at: float | None = None) -> list[str]:
        """A release event: the host's faults before it no longer count."""
        when = time.time() if at is None else at
        _, warnings = self._guard("releasing", lambda db: _release(db, record, detail, when), None)
        return warnings

    def record_account(self, account: Account, hosts: Sequence[Host]) -> list[str]:
        """Record a run's account (again: it replaces the run's earlier one) and each host's cost in
        it (`hosts`: the job's, to find the hosts of account.by_host(); one not among them is not
        charged); the warnings."""
        if not account.run_id:
            return ["host ledger: an account without a run id is not recorded"]
        _, warnings = self._guard("recording the run's account", lambda db: _record_account(db, account, hosts), None)
        return warnings

    def accounts(self, since: float, until: float | None = None) -> AccountReading:
        """The accounts of the runs that started at or after `since` (and before `until`), newest first."""
        nothing: list[Account] = []
        found, warnings = self._guard("reading the runs' accounts", lambda db: _accounts(db, since, until), nothing)
        return AccountReading(found, warnings)

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        try:
            db.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
            db.execute("PRAGMA journal_mode = WAL")
            _schema(db)
        except BaseException:
            db.close()
            raise
        return db

    def _guard(self, what: str, op: Callable[[sqlite3.Connection], T], default: T) -> tuple[T, list[str]]:
        """`op` on the open ledger; any SQLite or OS error: `default` and a warning (a corrupt file
        moved aside first, and `op` tried once more on a fresh one)."""
        warnings: list[str] = []
        for tries in (1, 2):
            try:
                db = self._open()
                try:
                    return op(db), warnings
                finally:
                    db.close()
            except (sqlite3.Error, OSError, TooNew) as exc:
                if tries == 1 and corrupt(exc):
                    warnings.append(self._move_aside(exc))
                    continue
                warnings.append(f"host ledger {self.path}: {what} skipped ({describe(exc)}); the run goes on")
                return default, warnings
        return default, warnings  # pragma: no cover (the loop returns)

    def _move_aside(self, exc: BaseException) -> str:
        """Keep the corrupt file (and its WAL) beside it, for a post-mortem; a fresh one starts."""
        if self._readable():  # another process put a fresh one in its place meanwhile
            return f"host ledger {self.path} was corrupt ({describe(exc)}); another ddpctl started a fresh one"
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        try:
            os.replace(self.path, aside)
        except FileNotFoundError:
            return f"host ledger {self.path} was corrupt ({describe(exc)}); another ddpctl moved it aside"
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(OSError):
                os.replace(f"{self.path}{suffix}", f"{aside}{suffix}")
        return f"host ledger {self.path} was corrupt ({describe(exc)}): moved aside to {aside}; a fresh one started"

    def _readable(self) -> bool:
        try:
            db = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
            try:
                db.execute("SELECT count(*) FROM sqlite_master").fetchone()
                return True
            finally:
                db.close()
        except sqlite3.Error:
            return False


class TooNew(Exception):
    """The file's schema is a newer ddpctl's."""


def corrupt(exc: BaseException) -> bool:
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    name = getattr(exc, "sqlite_errorname", "")
    text = str(exc).lower()
    return name in ("SQLITE_NOTADB", "SQLITE_CORRUPT") or "not a database" in text or "malformed" in text


def describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if "locked" in text or "busy" in text:
        return f"{text}: another ddpctl held it past {BUSY_TIMEOUT_S:g} s"
    return text


def _version(db: sqlite3.Connection) -> int:
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise TooNew(f"written by a newer ddpctl (schema {version}, this one reads {SCHEMA_VERSION})")
    return version


def _schema(db: sqlite3.Connection) -> None:
    """Make what the file lacks (a new file; one an older ddpctl wrote, without the accounts), in
    one transaction: every statement is IF NOT EXISTS, so another ddpctl doing the same meanwhile
    is harmless."""
    _version(db)
    present = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if present >= TABLES:
        return
    with _transaction(db):
        for statement in SCHEMA:
            db.execute(statement)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on an error): a writer takes the lock up front, or waits."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind: object, value: object, tb: object) -> None:
        if kind is None:
            self.db.execute("COMMIT")
        elif self.db.in_transaction:
            self.db.execute("ROLLBACK")


def _ensure(db: sqlite3.Connection, host: Host, at: float) -> str:
    key = key_of(host)
    db.execute("INSERT OR IGNORE INTO hosts (key, name, address, first_seen) VALUES (?, ?, ?, ?)",
               (key, host.name, address_of(host), at))
    return key


def _record(db: sqlite3.Connection, run_id: str, kind: str, seen: Sequence[Sighting], notes: Sequence[Note],
            at: float) -> None:
    with _transaction(db):
        touched: set[str] = set()
        for s in seen:
            key = _ensure(db, s.host, at)
            db.execute("UPDATE hosts SET last_seen = max(coalesce(last_seen, 0), ?), hostname = coalesce(?, hostname),"
                       " gpus = coalesce(?, gpus) WHERE key = ?", (at, s.hostname, s.gpus, key))
            added = db.execute("INSERT OR IGNORE INTO runs (host, run_id, at, kind) VALUES (?, ?, ?, ?)",
                               (key, run_id, at, kind)).rowcount
            if added:
                db.execute("UPDATE hosts SET runs = runs + 1 WHERE key = ?", (key,))
            touched.add(key)
        for n in notes:
            key = _ensure(db, n.host, at)
            db.execute("INSERT INTO events (host, at, run_id, kind, detail) VALUES (?, ?, ?, ?, ?)",
                       (key, n.at if n.at is not None else at, run_id, n.kind.value, n.detail[:DETAIL_CHARS]))
            touched.add(key)
        for key in touched:
            _trim(db, key)


def _trim(db: sqlite3.Connection, key: str) -> None:
    for table, keep in (("events", KEEP_EVENTS), ("runs", KEEP_RUNS), ("costs", KEEP_RUNS)):
        db.execute(f"DELETE FROM {table} WHERE host = ? AND id NOT IN "
                   f"(SELECT id FROM {table} WHERE host = ? ORDER BY at DESC, id DESC LIMIT ?)", (key, key, keep))


def _release(db: sqlite3.Connection, record: HostRecord, detail: str, at: float) -> None:
    with _transaction(db):
        db.execute("INSERT OR IGNORE INTO hosts (key, name, address, first_seen) VALUES (?, ?, ?, ?)",
                   (record.key, record.name, record.address, at))
        db.execute("INSERT INTO events (host, at, run_id, kind, detail) VALUES (?, ?, NULL, ?, ?)",
                   (record.key, at, EventKind.RELEASE.value, detail[:DETAIL_CHARS]))
        _trim(db, record.key)


def _record_account(db: sqlite3.Connection, account: Account, hosts: Sequence[Host]) -> None:
    by_name = {h.name: h for h in hosts}
    goodput = account.goodput
    with _transaction(db):
        db.execute("INSERT OR REPLACE INTO accounts (run_id, job, started, ended, wall_s, productive_s, goodput, "
                   "outcome, attempts, biggest, account) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   (account.run_id, account.job, account.started, account.ended, account.wall_s,
                    account.productive_s, goodput, account.outcome, account.attempts, text.biggest(account),
                    json.dumps(account.to_json())))
        db.execute("DELETE FROM costs WHERE run_id = ?", (account.run_id,))
        for name, seconds in account.by_host().items():
            host = by_name.get(name)
            if host is None or seconds <= 0:
                continue
            key = _ensure(db, host, account.ended)
            db.execute("INSERT INTO costs (host, run_id, at, seconds, causes) VALUES (?, ?, ?, ?, ?)",
                       (key, account.run_id, account.ended, seconds, causes_of(account, name)[:DETAIL_CHARS]))
            _trim(db, key)
        db.execute("DELETE FROM accounts WHERE run_id NOT IN "
                   "(SELECT run_id FROM accounts ORDER BY started DESC, run_id DESC LIMIT ?)", (KEEP_ACCOUNTS,))


def causes_of(account: Account, host: str) -> str:
    """The causes the host is charged for in the account, the costliest first: `lost, SIGKILL`."""
    return ", ".join(totals((p.cause or p.kind, p.seconds) for p in account.parts if p.host == host))


def _accounts(db: sqlite3.Connection, since: float, until: float | None) -> list[Account]:
    found = []
    for (data,) in db.execute("SELECT account FROM accounts WHERE started >= ? AND started < ? "
                              "ORDER BY started DESC, run_id DESC", (since, math.inf if until is None else until)):
        with contextlib.suppress(ValueError, KeyError, TypeError):  # a newer ddpctl's shape: skipped
            found.append(Account.from_json(json.loads(data)))
    return found


def _read(db: sqlite3.Connection, hosts: list[Host] | None) -> list[HostRecord]:
    rows = {r[0]: r for r in db.execute(
        "SELECT key, name, address, hostname, gpus, first_seen, last_seen, runs FROM hosts ORDER BY name, address")}
    events: dict[str, list[Event]] = {}
    for key, at, run_id, kind, detail in db.execute(
            "SELECT host, at, run_id, kind, detail FROM events ORDER BY at, id"):
        try:
            events.setdefault(key, []).append(Event(at, EventKind(kind), detail, run_id))
        except ValueError:  # a newer ddpctl's kind: not ours to judge
            continue
    costs: dict[str, list[Cost]] = {}
    for key, at, run_id, seconds, causes in db.execute(
            "SELECT host, at, run_id, seconds, causes FROM costs ORDER BY at, id"):
        costs.setdefault(key, []).append(Cost(at, run_id, seconds, causes))
    keys = list(rows) if hosts is None else [key_of(h) for h in hosts]
    found = []
    for i, key in enumerate(keys):
        row = rows.get(key)
        if row is None:
            assert hosts is not None
            found.append(HostRecord(hosts[i].name, address_of(hosts[i])))
            continue
        found.append(HostRecord(row[1], row[2], row[3], row[4], row[5], row[6], row[7], tuple(events.get(key, ())),
                                tuple(costs.get(key, ()))))
    return found


def doctor_notes(hosts: Sequence[Host], findings: Iterable[DoctorFinding],
                 deep_checks: Iterable[str] = ()) -> list[Note]:
    """A note per failed or warned doctor finding that names a host of `hosts`: a deep-check one
    (its check in `deep_checks`) marks the host suspect until it is released."""
    by_name = {h.name: h for h in hosts}
    deep = set(deep_checks)
    notes = []
    for f in findings:
        status = str(getattr(f.status, "value", f.status))
        host = by_name.get(f.host or "")
        if host is None or status not in ("fail", "warn"):
            continue
        kind = EventKind.DEEP_FINDING if f.check in deep else EventKind.FINDING
        notes.append(Note(host, kind, f"[{f.check}] {status}: {f.message}"))
    return notes


def record_doctor(hosts: Sequence[Host], facts: Mapping[str, HostFacts], findings: Iterable[DoctorFinding],
                  run_id: str, deep_checks: Iterable[str] = (), ledger: Ledger | None = None) -> list[str]:
    """Record one doctor run: each host of `hosts` that answered (`facts`: host name -> its facts)
    as seen with its hostname and GPUs, and each failed or warned finding; the warnings (never raises)."""
    try:
        seen = [Sighting(h, facts[h.name].hostname, facts[h.name].gpu_count) for h in hosts if h.name in facts]
        notes = doctor_notes(hosts, findings, deep_checks)
    except Exception as exc:  # the ledger never stops doctor
        return [f"host ledger: doctor's run not recorded ({exc})"]
    return (ledger or Ledger()).record(run_id, "doctor", seen, notes)
