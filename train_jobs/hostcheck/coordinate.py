"""The host check's coordinator (pure; no torch): it hands each host its tests through a board (the
job's key-value store) and waits for their replies, each wait with a deadline (schedule.bound). A
host that has not joined, or not finished its compute test, by its deadline is named and left out;
a pair that has not answered is named and its hosts sit out until they answer; the rest goes on.

Messages, one JSON object each: a host posts `join` ({"boot": …}); the coordinator posts a host's
commands in order (`{"op": "compute", "window": s}`, `{"op": "pair", "partner": r, "tag": …,
"cap_s": s, …}`, `{"op": "done"}`) and the host replies to each (check.py's worker). What it measured is
one DeepFigures (figures.py), which check.py prints.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from train_jobs.hostcheck import schedule
from train_jobs.hostcheck.figures import ROUND, ComputeRow, DeepFigures, LinkRow, Missed, Phases
from train_jobs.hostcheck.verdict import SLOW_LINK, Figure, judge, slow_among_peers

POLL_S = 0.05
WINDOWS = 3  # compute: each device's best of this many windows, taken in turns ...
AGAIN_WINDOWS = 3  # ... and a device that looks slow gets up to this many more, one at a time


class Board(Protocol):
    """The store as the coordinator uses it."""

    def joined(self, rank: int) -> dict[str, Any] | None: ...
    def post(self, rank: int, seq: int, command: Mapping[str, Any]) -> None: ...
    def reply(self, rank: int, seq: int) -> dict[str, Any] | None: ...
    def news(self) -> int:
        """A number that changes whenever a host joins or replies: the coordinator reads the
        joins and replies only then (one call a poll, not one per host)."""


@dataclass(frozen=True)
class Clock:
    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


class SimulatedClock:
    """A clock that moves only when slept on: the deadlines without the wait (the unit tests and
    bench/deep_scale.py run the coordinator on it)."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds

    def clock(self) -> Clock:
        return Clock(self.now, self.sleep)


@dataclass(frozen=True)
class Settings:
    nbytes: int = 2 << 20
    iters: int = 2
    window: float = 0.15  # one compute timing window
    links_budget: float = 20.0
    backend: str = "gloo"  # what the pairs exchange over: with gloo (on the CPU) a slow CPU explains a slow link

    @property
    def cpu_links(self) -> bool:
        return self.backend == "gloo"


@dataclass
class Coordinator:
    world: int
    board: Board
    settings: Settings = field(default_factory=Settings)
    clock: Clock = field(default_factory=Clock)
    progress: Callable[[str], None] = lambda _: None
    seq: dict[int, int] = field(default_factory=dict)  # each rank's next command number
    busy: dict[int, int] = field(default_factory=dict)  # rank -> the command it has not answered
    missed: list[Missed] = field(default_factory=list)
    joins: dict[int, dict[str, Any]] = field(default_factory=dict)
    kernels: dict[int, str] = field(default_factory=dict)  # rank -> its boot id (hosts on one machine share it)
    compute_rows: list[ComputeRow] = field(default_factory=list)
    rates: dict[schedule.Pair, Figure] = field(default_factory=dict)
    seen_in: dict[schedule.Pair, list[int]] = field(default_factory=dict)
    pair_times: list[float] = field(default_factory=list)
    rounds: int = 0
    phases: Phases = field(default_factory=Phases)

    # -- messaging ------------------------------------------------------------------------------
    def _send(self, rank: int, command: Mapping[str, Any]) -> int:
        seq = self.seq.get(rank, 0)
        self.board.post(rank, seq, command)
        self.seq[rank] = seq + 1
        return seq

    def _wait(self, asked: Mapping[int, int], allowed: Callable[[], float],
              done: Callable[[int, dict[str, Any], float], None]) -> dict[int, dict[str, Any]]:
        """Replies to `asked` (rank -> command number) until all are in or `allowed()` seconds have
        passed (asked again after each reply: a bound that follows the finished ones); the ranks
        that did not answer are busy until they do."""
        started, got, seen = self.clock.now(), {}, None
        while True:
            news = self.board.news()
            for rank, seq in asked.items() if news != seen else ():
                if rank not in got:
                    reply = self.board.reply(rank, seq)
                    if reply is not None:
                        got[rank] = reply
                        done(rank, reply, self.clock.now() - started)
            seen = news
            if len(got) == len(asked) or self.clock.now() - started >= allowed():
                break
            self.clock.sleep(POLL_S)
        for rank, seq in asked.items():
            if rank not in got:
                self.busy[rank] = seq
        return got

    def _collect_late(self) -> None:
        """Hosts that were busy and have answered since are free again."""
        for rank, seq in list(self.busy.items()):
            if self.board.reply(rank, seq) is not None:
                del self.busy[rank]

    # -- phases ---------------------------------------------------------------------------------
    def join(self) -> list[int]:
        """The ranks that joined by the join deadline."""
        started, seen = self.clock.now(), None
        delays: list[float] = []
        while True:
            news = self.board.news()
            for rank in range(self.world) if news != seen else ():
                if rank not in self.joins:
                    info = self.board.joined(rank)
                    if info is not None:
                        self.joins[rank] = info
                        self.kernels[rank] = str(info.get("boot", rank))
                        delays.append(self.clock.now() - started)
            seen = news
            limit = schedule.bound(delays, schedule.JOIN_BOUND)
            if len(self.joins) == self.world or self.clock.now() - started >= limit:
                break
            self.clock.sleep(POLL_S)
        late = tuple(r for r in range(self.world) if r not in self.joins)
        if late:
            self.missed.append(Missed("join", late, limit, statistics.median(delays) if delays else None,
                                      "did not start its host check"))
        self.phases = replace(self.phases, join_s=self.clock.now() - started)
        return sorted(self.joins)

    def compute(self, ranks: Sequence[int]) -> list[int]:
        """Every device of each host, timed in turn among hosts on one kernel; the ranks that
        finished every window in time."""
        started = self.clock.now()
        on_kernel = {r: [q for q in ranks if self.kernels[q] == self.kernels[r]] for r in ranks}
        slot = {r: on_kernel[r].index(r) for r in ranks}
        sharing = {r: len(on_kernel[r]) for r in ranks}
        active = list(ranks)
        times: list[float] = []
        windows: dict[int, list[list[dict[str, Any]]]] = {r: [] for r in ranks}
        for _ in range(WINDOWS):  # every host's first window, then every host's second, …
            self._windows(active, slot, windows, times)
        for _ in range(AGAIN_WINDOWS):  # a host that looks slow: more windows, before a verdict
            looks_slow = self._slow_compute(self._rows(active, windows, sharing))
            again = [r for r in active if r in looks_slow]
            if not again:
                break
            self._windows(active, slot, windows, times, only=again)
        self.compute_rows = self._rows(active, windows, sharing)
        self.phases = replace(self.phases, compute_s=self.clock.now() - started)
        return active

    @staticmethod
    def _rows(active: Sequence[int], windows: Mapping[int, list[list[dict[str, Any]]]],
              sharing: Mapping[int, int]) -> list[ComputeRow]:
        return [row for r in active for row in best_windows(r, windows[r], sharing[r])]

    def _windows(self, active: list[int], slot: Mapping[int, int], windows: dict[int, list[list[dict[str, Any]]]],
                 times: list[float], only: Sequence[int] | None = None) -> None:
        """One window on each host of `active` (or of `only` among them), in turns among hosts on
        one kernel; a host past the deadline is named and leaves `active`."""
        ranks = list(active if only is None else only)
        for turn in range(max((slot[r] for r in ranks), default=-1) + 1):
            now = [r for r in ranks if slot[r] == turn and r in active]
            if not now:
                continue
            asked = {r: self._send(r, {"op": "compute", "window": self.settings.window}) for r in now}
            got = self._wait(asked, lambda: schedule.bound(times, schedule.COMPUTE_BOUND),
                             lambda _r, _rep, took: times.append(took))
            for r in now:
                if r in got:
                    windows[r].append(got[r].get("devices", []))
                else:
                    active.remove(r)
                    self.missed.append(Missed("compute", (r,), schedule.bound(times, schedule.COMPUTE_BOUND),
                                              statistics.median(times) if times else None,
                                              "did not finish its compute test"))

    def links(self, ranks: Sequence[int]) -> bool:
        """The tournament among `ranks` while the budget lasts, then the rechecks; whether every
        pair was measured."""
        started = self.clock.now()
        tournament = [[(ranks[a], ranks[b]) for a, b in r] for r in schedule.round_robin(len(ranks))]
        played, out = 0, set[int]()
        slow_compute = self._slow_compute()
        while played < len(tournament) and (played < schedule.MIN_ROUNDS
                                            or self.clock.now() - started < self.settings.links_budget):
            if played >= schedule.MIN_ROUNDS and self._some_host_all_slow(out):
                out |= schedule.sitting_out(judge(list(ranks), self.rates, slow_compute, self.settings.cpu_links))
            self._round([p for p in tournament[played] if not set(p) & out])
            played += 1
        rechecks = self.clock.now()
        for _ in range(schedule.MAX_RECHECK_ROUNDS):
            if self.clock.now() - rechecks >= schedule.RECHECK_BUDGET_S:
                break
            self._collect_late()
            judged = judge(list(ranks), self.rates, slow_compute, self.settings.cpu_links)
            free = [r for r in ranks if r not in self.busy]
            plan = schedule.recheck_rounds(judged, self.rates, free, kernels=self.kernels)
            if not plan:
                break
            self._round(plan[0])
        self._finish_busy()
        self.phases = replace(self.phases, links_s=self.clock.now() - started)
        n = len(ranks)
        return len(self.rates) == n * (n - 1) // 2  # every pair met (none sat out, none skipped busy)

    def _some_host_all_slow(self, already: set[int]) -> bool:
        """Whether a host (not `already` out) has its best link so far far below the median (cheap:
        the judging that decides who sits out costs more, at 128 hosts, than a round)."""
        if not self.rates:
            return False
        median = statistics.median(f.mbps for f in self.rates.values())
        best: dict[int, float] = {}
        for (a, b), f in self.rates.items():
            best[a], best[b] = max(best.get(a, 0.0), f.mbps), max(best.get(b, 0.0), f.mbps)
        return any(v * SLOW_LINK < median for h, v in best.items() if h not in already)

    def _slow_compute(self, rows: Sequence[ComputeRow] | None = None) -> set[int]:
        """The ranks with a device below 1/SLOW_COMPUTE of its peers' median (of the same model)."""
        rows = self.compute_rows if rows is None else rows
        found = slow_among_peers([row.model for row in rows], [row.tflops for row in rows])
        return {rows[i].rank for i in found}

    def _round(self, pairs: Sequence[schedule.Pair]) -> None:
        self._collect_late()
        pairs = [p for p in pairs if p[0] not in self.busy and p[1] not in self.busy]
        if not pairs:
            return
        number, self.rounds = self.rounds, self.rounds + 1
        cap = schedule.bound(self.pair_times, schedule.LINK_BOUND)
        asked: dict[int, int] = {}
        for a, b in pairs:
            for rank, partner, role in ((a, b, 0), (b, a, 1)):
                asked[rank] = self._send(rank, {"op": "pair", "partner": partner, "role": role,
                                                "tag": f"r{number}/{a}-{b}", "bytes": self.settings.nbytes,
                                                "iters": self.settings.iters, "cap_s": cap})
        got = self._wait(asked, lambda: cap + schedule.LINK_SLACK, lambda *_: None)
        for a, b in pairs:
            self.seen_in.setdefault((a, b), []).append(number)
            lead = got.get(a)
            if b in got and lead is not None and lead.get("mbps") is not None:
                fig = Figure(float(lead["mbps"]), 1, bool(lead.get("complete")))
                if fig.complete:
                    self.pair_times.append(float(lead.get("seconds") or 0.0))
            else:
                late = tuple(r for r in (a, b) if r not in got)
                why = "; ".join(str(got[r].get("error")) for r in (a, b) if r in got and got[r].get("error"))
                fig = Figure(0.0, 1, False, missed=True)
                others = statistics.median(self.pair_times) if self.pair_times else None
                self.missed.append(Missed("links", (a, b), cap + schedule.LINK_SLACK if late else cap, others,
                                          why or f"rank {', '.join(map(str, late))} did not answer", number))
            old = self.rates.get((a, b))
            self.rates[(a, b)] = fig if old is None else old.again(fig)
        self.progress(f"{ROUND} {number} {len(pairs)}")

    def _finish_busy(self) -> None:
        """Wait for the busy hosts no longer than a pair's deadline: they are already named."""
        if not self.busy:
            return
        limit = self.clock.now() + schedule.bound(self.pair_times, schedule.LINK_BOUND) + schedule.LINK_SLACK
        while self.busy and self.clock.now() < limit:
            self._collect_late()
            self.clock.sleep(POLL_S)

    def done(self) -> None:
        """Every rank's last command (a host that joins late reads it first and ends)."""
        for rank in range(self.world):
            self._send(rank, {"op": "done"})

    def run(self) -> DeepFigures:
        """Join, compute, links, done: the figures (check.py prints them)."""
        joined = self.join()
        active = self.compute(joined)
        every = True
        if len(active) > 1:
            every = self.links(active)
        self.done()
        return self.figures(active, every)

    def figures(self, active: Sequence[int], every: bool) -> DeepFigures:
        links = tuple(LinkRow(a, b, f, tuple(self.seen_in.get((a, b), ()))) for (a, b), f in self.rates.items())
        return DeepFigures(self.settings.nbytes, self.settings.iters, self.rounds, every and len(active) == self.world,
                           links, tuple(self.compute_rows), tuple(active), tuple(self.missed), self.phases,
                           self.settings.backend)


def best_windows(rank: int, windows: Sequence[Sequence[Mapping[str, Any]]], sharing: int) -> list[ComputeRow]:
    """One row per device (`windows`: the host's replies, each a row per device): its best window's
    figure, and every window's."""
    rows: list[ComputeRow] = []
    if not windows:
        return rows
    for i, first in enumerate(windows[0]):
        mine = [w[i] for w in windows if i < len(w)]
        best = max(mine, key=lambda d: float(d["tflops"]))
        gpu = first.get("gpu")
        rows.append(ComputeRow(rank, str(first["device"]), None if gpu is None else str(gpu), str(first["model"]),
                               float(best["tflops"]), float(best.get("seconds", 0.0)),
                               tuple(float(d["tflops"]) for d in mine), sharing))
    return rows
