"""What the time account costs, on this machine, no cluster: a synthetic week-long run's
events.jsonl (a `progress` event every 5 s as `up` writes them, a checkpoint every 10 min, a lost
host, its fence and a restart every 12 h, a straggler now and then), its size, and the time and
peak memory to compute its account from the file; then `ddpctl runs --json` over a ledger holding
--runs such accounts (the ledger keeps the newest 2000), beside `ddpctl --help` (the CLI's own
start-up). Prints figures; asserts nothing."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from orchestrator.account import compute, events  # noqa: E402
from orchestrator.account import events as ev  # noqa: E402
from orchestrator.account.events import EventLog  # noqa: E402
from orchestrator.account.text import line  # noqa: E402
from orchestrator.hostops.ledger import Ledger  # noqa: E402

DAY = 86400.0


def week_of_events(run_dir: Path, days: float, t0: float = 1_800_000_000.0) -> int:
    """A run of `days` days: an attempt every 12 h, each ended by a lost host (the last succeeds)."""
    run_dir.mkdir(parents=True)  # as the launch makes it
    log = EventLog(run_dir)
    log.add(ev.RUN_START, t0, run_id="week", job="week", hosts=[f"node{i}" for i in range(8)], checkpoints=True)
    t, attempt, step, written = t0, 0, 0, 1
    end = t0 + days * DAY
    while t < end:
        log.add(ev.ATTEMPT_START, t, attempt=attempt)
        t += 60
        log.add(ev.FIRST_STEP, t, attempt=attempt, step=1)
        until = min(t + DAY / 2, end)
        while t < until:
            t += 5
            step += 25
            log.add(ev.PROGRESS, t, attempt=attempt, step=step)
            written += 1
            if int(t - t0) % 600 == 0:
                log.add(ev.CHECKPOINT, t, attempt=attempt, host="node0", step=step)
            if int(t - t0) % 7200 == 0:
                log.add(ev.STRAGGLER, t, attempt=attempt, host="node3", rank=3, end=t + 300, slower=0.2)
        if t >= end:
            log.add(ev.ATTEMPT_END, t, attempt=attempt, outcome="ok", step=step, last_step=t)
            break
        log.add(ev.CONTACT_LOST, t, attempt=attempt, host="node5")
        log.add(ev.LOST, t + 60, attempt=attempt, host="node5", cause="no contact")
        log.add(ev.ATTEMPT_END, t + 61, attempt=attempt, outcome="failed", step=step, last_step=t)
        log.add(ev.RESTART, t + 61, attempt=attempt + 1, host="node5", cause="lost")
        log.add(ev.FENCE_START, t + 61, attempt=attempt, hosts=["node5"])
        log.add(ev.FENCE_END, t + 150, attempt=attempt)
        t += 150
        attempt += 1
    log.add(ev.RUN_END, t + 2, outcome="ok", exit_code=0)
    return written


def timed(argv: list[str], env: dict[str, str], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        subprocess.run(argv, env=env, capture_output=True, check=True)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "week"
        began = time.perf_counter()
        week_of_events(run_dir, args.days)
        wrote = time.perf_counter() - began
        path = events.path_of(run_dir)
        size = path.stat().st_size
        count = sum(1 for _ in path.open())
        began = time.perf_counter()
        read = events.read(path)
        parsed = time.perf_counter() - began
        account = compute.account(read)
        took = time.perf_counter() - began
        del read
        tracemalloc.start()  # a second time, traced (tracing slows it down)
        compute.account(events.read(path))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"a {args.days:g}-day run: {count} events, {size / 1e6:.1f} MB ({size / args.days / 1e3:.0f} kB a day; "
              f"written one line at a time in {wrote:.1f} s, {wrote / count * 1e6:.0f} µs an event)")
        print(f"  its account from the file: {took:.2f} s ({parsed:.2f} s of it reading), peak {peak / 1e6:.0f} MB: "
              f"{line(account)}")

        env = {**os.environ, "DDPCTL_STATE_DIR": str(Path(tmp) / "state")}
        os.environ["DDPCTL_STATE_DIR"] = env["DDPCTL_STATE_DIR"]
        ledger = Ledger()
        began = time.perf_counter()
        for i in range(args.runs):
            shifted = compute.Account(f"run-{i}", "week", account.started - i * 3600, account.ended - i * 3600,
                                      account.productive_s, account.parts, account.redone, account.attempts,
                                      account.outcome, account.restarted)
            ledger.record_account(shifted, [])
        recorded = (time.perf_counter() - began) / args.runs
        ddpctl = [sys.executable, "-m", "orchestrator"]
        runs = timed([*ddpctl, "runs", "--since", "1000w", "--json"], env, args.rounds)
        page = timed([*ddpctl, "runs", "--since", "1000w", "--html", str(Path(tmp) / "runs.html")], env, args.rounds)
        bare = timed([*ddpctl, "--help"], env, args.rounds)
        print(f"an account into the ledger: {recorded * 1e3:.1f} ms a run (once, at its end)")
        print(f"`ddpctl runs --json` over {args.runs} runs: {runs:.2f} s; `--html`: {page:.2f} s "
              f"(`ddpctl --help`: {bare:.2f} s), median of {args.rounds}")


if __name__ == "__main__":
    main()
