"""The runs' accounts in the host ledger, for `ddpctl runs`: the window its --since gives, one row
per run (newest first) and the losses summed over the window by kind and by host."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from inventory import ConfigError
from inventory.fields import duration_seconds
from orchestrator.account import text
from orchestrator.account.compute import Account, totals
from orchestrator.hostops.ledger import Ledger

DEFAULT_SINCE = "7d"
SINCE_EXAMPLES = "7d, 24h, 90m, 2w"


def parse_since(value: str) -> float:
    """--since as seconds: a number and its unit (s, m, h, d, w); ConfigError naming the flag."""
    seconds = duration_seconds(value)
    if seconds is None or seconds <= 0:
        raise ConfigError(f"expected a duration with its unit, got {value!r}", key="--since",
                          hint=f"a number and s, m, h, d or w: {SINCE_EXAMPLES} (ddpctl runs --since 24h)")
    return seconds


@dataclass(frozen=True)
class RunRow:
    """One run of `ddpctl runs`."""

    run_id: str
    job: str
    started: float
    wall_s: float
    outcome: str
    attempts: int
    goodput: float | None
    biggest: str  # the biggest loss in words ("88 s to node0"); "" for none

    @classmethod
    def of(cls, account: Account) -> RunRow:
        return cls(account.run_id or "?", account.job or "", account.started, account.wall_s, account.outcome,
                   account.attempts, account.goodput, text.biggest(account))


@dataclass
class RunsView:
    """The runs that started in the window, newest first, and their losses summed."""

    path: str
    since: float  # the window's start (epoch)
    window_s: float
    accounts: list[Account] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def rows(self) -> list[RunRow]:
        return [RunRow.of(a) for a in self.accounts]

    @property
    def by_kind(self) -> dict[str, float]:
        """Every run's losses by kind, most first."""
        return totals(kv for a in self.accounts for kv in a.by_kind().items())

    @property
    def by_host(self) -> dict[str, float]:
        """Every run's losses charged to each host, most first."""
        return totals(kv for a in self.accounts for kv in a.by_host().items())

    @property
    def wall_s(self) -> float:
        return sum(a.wall_s for a in self.accounts)

    @property
    def productive_s(self) -> float:
        return sum(a.productive_s for a in self.accounts)


def runs_view(window_s: float, ledger: Ledger | None = None, now: float | None = None) -> RunsView:
    """The accounts of the runs that started in the last `window_s` seconds."""
    ledger = ledger or Ledger()
    since = (time.time() if now is None else now) - window_s
    reading = ledger.accounts(since)
    return RunsView(str(ledger.path), since, window_s, reading.accounts, reading.warnings)
