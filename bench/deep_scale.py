"""`doctor --deep`'s schedule at 64 and 128 hosts: the coordinator that runs on node 0
(train_jobs/hostcheck/coordinate.py, the same code) against simulated hosts on a simulated clock,
healthy and with faults, and the verdicts doctor draws from its figures.

128 torch ranks do not fit this 2-core machine, and the schedule does not need them: each host is
modelled by when it joins, how long a compute window takes and what each exchange moves, from the
figures measured on the 8-host namespace cluster (--round-s: a healthy pair's turn, its group set
up and its exchanges; --mbps: its figure; 40 Mbit/s moves 2 MiB in 0.42 s; 2 Mbit/s moves nothing
whole within a 1 s cap). On
real hosts a round's pairs use separate links and cores, so a round takes about as long at any
size. Per case: rounds, pairs measured of all, the simulated time of each phase, the coordinator's
own CPU time (the real cost of judging the figures between rounds), and the hosts named.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from orchestrator.doctor.deep import analyse  # noqa: E402
from train_jobs.hostcheck.coordinate import Coordinator, Settings, SimulatedClock  # noqa: E402

NBYTES = 2 << 20


class SimHosts:
    """coordinate.Board over modelled hosts: `slow` rank -> MB/s its link carries, `starved` ranks
    never join (their sessions get a sliver of a core: torch alone takes a minute to import)."""

    def __init__(self, clock: SimulatedClock, n: int, round_s: float, mbps: float, slow: Mapping[int, float],
                 starved: set[int], seed: int) -> None:
        rng = random.Random(seed)
        self.clock, self.round_s, self.mbps, self.slow, self.starved = clock, round_s, mbps, slow, starved
        self.join_at = {r: rng.uniform(0.3, 2.0) for r in range(n)}
        self.noise = rng
        self.posted: dict[tuple[int, int], tuple[float, dict[str, Any]]] = {}
        self.answers: dict[tuple[int, int], tuple[float, dict[str, Any]]] = {}

    def news(self) -> int:
        return round(self.clock.t * 1000)  # news at every poll: every reply is read as it comes

    def joined(self, rank: int) -> dict[str, Any] | None:
        if rank in self.starved or self.clock.t < self.join_at[rank]:
            return None
        return {"boot": f"boot-{rank}"}

    def post(self, rank: int, seq: int, command: Mapping[str, Any]) -> None:
        self.posted[(rank, seq)] = (self.clock.t, dict(command))
        self.answers[(rank, seq)] = self._answer(rank, dict(command))

    def _answer(self, rank: int, command: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        if command["op"] == "compute":
            return 0.2, {"devices": [{"device": "cuda:0", "gpu": "H100", "model": "H100",
                                      "tflops": 700.0 * self.noise.uniform(0.9, 1.1), "seconds": 0.15}]}
        if command["op"] != "pair":
            return 0.0, {}
        cap = float(command["cap_s"])
        link = min(self.slow.get(rank, 1e9), self.slow.get(int(command["partner"]), 1e9))
        mbps = min(self.mbps * self.noise.uniform(0.85, 1.15), link)
        whole = NBYTES / mbps / 1e6
        if whole <= cap:
            return max(whole, self.round_s), {"mbps": mbps, "seconds": whole, "complete": True}
        return cap + 0.3, {"mbps": mbps, "seconds": cap, "complete": False}

    def reply(self, rank: int, seq: int) -> dict[str, Any] | None:
        at, _ = self.posted[(rank, seq)]
        took, answer = self.answers[(rank, seq)]
        return answer if self.clock.t >= at + took else None


def one(n: int, round_s: float, mbps: float, slow: Mapping[int, float], starved: set[int],
        seed: int) -> dict[str, Any]:
    clock = SimulatedClock()
    hosts = SimHosts(clock, n, round_s, mbps, slow, starved, seed)
    coordinator = Coordinator(n, hosts, Settings(backend="nccl"), clock.clock())
    cpu = time.process_time()
    figures = coordinator.run()
    cpu = time.process_time() - cpu
    names = [f"node{i}" for i in range(n)]
    named = sorted({(f.check, f.host or "") for f in analyse(names, figures) if f.status.value in ("warn", "fail")})
    return {"rounds": figures.rounds, "pairs": len(figures.links), "all": n * (n - 1) // 2,
            "phases": figures.phases, "sim_s": clock.t, "cpu_s": cpu, "named": named}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[8, 64, 128])
    p.add_argument("--round-s", type=float, default=0.3,
                   help="a healthy pair's turn: group set-up and its exchanges, seconds")
    p.add_argument("--mbps", type=float, default=1000.0, help="a healthy link's figure, MB/s")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    print(f"doctor --deep's coordinator on simulated hosts (a healthy pair {args.round_s:g} s a round at "
          f"{args.mbps:g} MB/s, 2 MiB each way)")
    print(f"{'hosts':>5}  {'case':<34} {'rounds':>6} {'pairs':>13} {'join':>6} {'compute':>8} {'links':>7} "
          f"{'total':>7} {'cpu':>6}  named")
    for n in args.sizes:
        cases = [("healthy", {}, set()),
                 ("node3 at 40 Mbit/s", {3: 5.0}, set()),
                 ("node3 at 2 Mbit/s + node5 starved", {3: 0.25}, {5}),
                 ("node3 at 40 Mbit/s + node5 starved", {3: 5.0}, {5})]
        for name, slow, starved in cases:
            r = one(n, args.round_s, args.mbps, slow, starved, args.seed)
            ph = r["phases"]
            named = ", ".join(f"{h} ({c})" for c, h in r["named"]) or "-"
            print(f"{n:>5}  {name:<34} {r['rounds']:>6} {r['pairs']:>6}/{r['all']:<6} {ph.join_s or 0:>5.1f}s "
                  f"{ph.compute_s or 0:>7.1f}s {ph.links_s or 0:>6.1f}s {r['sim_s']:>6.1f}s "
                  f"{r['cpu_s']:>5.2f}s  {named}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
