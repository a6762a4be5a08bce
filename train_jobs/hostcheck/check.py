"""The active half of `ddpctl doctor --deep`: one rank per host times a matrix multiply on each of
its GPUs (on the CPU where it has none), then exchanges a few MiB with other hosts in rounds.

Compute is timed in turn among hosts that share a kernel (the same boot id: containers or
namespaces on one machine share its cores, and one host's load would hide another's); hosts on
different kernels are timed at once. A figure is throughput over a window of at least
--compute-seconds, not the best single multiply, so a host whose CPU time is rationed (a cgroup
quota, a throttled GPU) shows its real pace; each device's best of WINDOWS windows, taken in turns
(every host's first, then every host's second, ...), so a burst of someone else's load does not
make a finding.

Links: in each round (schedule.py) every paired host sends and receives --bytes with its partner
at once, after a small warm-up, --iters times at least and more while that takes under
MIN_EXCHANGE_S (MAX_EXCHANGES at most); a pair's figure is its best exchange, MB/s one way
(1e6 bytes/s). Rank 0 plans the rounds and stops the tournament once --links-budget seconds have
passed (after MIN_ROUNDS), then measures the slow pairs again and re-pairs the hosts seen on them
with the fastest ones (at most schedule.MAX_RECHECK_ROUNDS rounds).

Rank 0 prints `DDPCTL-DEEP <json>` at the end:
  {"schema": 1, "backend": str, "bytes": int, "iters": int, "rounds": int, "all_pairs": bool,
   "links": [{"a": rank, "b": rank, "mbps": float, "measured": int, "rounds": [int, ...]}, ...],
   "compute": [{"rank": int, "device": "cpu"|"cuda:<i>", "gpu": str|null, "model": str,
                "tflops": float, "seconds": float, "windows": [float, ...], "kernel_shared_by": int}, ...],
   "links_s": float, "compute_s": float}
and `DDPCTL-DEEP-ROUND <i> <pairs>` as each round ends (progress, so a long run never looks hung).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from train_jobs.hostcheck import schedule

CPU_N = 512  # CPU: 512 x 512 float32 multiplies
GPU_N = 8192  # GPU: 8192 x 8192 bf16 multiplies
WARMUP_BYTES = 64 << 10
MIN_EXCHANGE_S = 0.1  # a pair keeps exchanging until this long has passed (--iters at least) ...
MAX_EXCHANGES = 10  # ... or this many timed exchanges
WINDOWS = 3  # compute: each device's best of this many windows, taken in turns


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=int, default=2 << 20, help="bytes each way per exchange")
    p.add_argument("--iters", type=int, default=2, help="timed exchanges per pair")
    p.add_argument("--links-budget", type=float, default=20.0, help="seconds of tournament rounds")
    p.add_argument("--compute-seconds", type=float, default=0.15, help="one timing window per device")
    p.add_argument("--timeout", type=float, default=120.0, help="a collective's timeout")
    return p.parse_args(argv)


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return f"{os.uname().nodename}-{os.getpid()}"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_matmul(device: torch.device, window: float) -> tuple[float, float]:
    """(TFLOP/s, seconds timed): multiplies back to back for at least `window` seconds."""
    n, dtype = (GPU_N, torch.bfloat16) if device.type == "cuda" else (CPU_N, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        torch.mm(a, b)
    _sync(device)
    done, start = 0, time.perf_counter()
    while True:
        for _ in range(4):
            torch.mm(a, b)
        _sync(device)
        done += 4
        elapsed = time.perf_counter() - start
        if elapsed >= window:
            return 2.0 * n ** 3 * done / elapsed / 1e12, elapsed


def compute_phase(rank: int, world: int, window: float, ctl: Any) -> list[dict[str, Any]]:
    """Every device of every host, timed in turn among hosts on one kernel; all ranks get the list."""
    kernels: list[Any] = [None] * world
    dist.all_gather_object(kernels, boot_id(), group=ctl)
    slot = kernels[:rank].count(kernels[rank])
    sharing = kernels.count(kernels[rank])
    slots = max(kernels.count(k) for k in kernels)
    devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())] or [torch.device("cpu")]
    windows: dict[int, list[tuple[float, float]]] = {i: [] for i in range(len(devices))}
    for _ in range(WINDOWS):  # every host's first window, then every host's second, …: a burst of
        for turn in range(slots):  # someone else's load does not spoil all of one host's windows
            dist.barrier(group=ctl)
            if turn != slot:
                continue
            for i, device in enumerate(devices):
                windows[i].append(time_matmul(device, window))
    best = {i: max(w) for i, w in windows.items()}
    mine: list[dict[str, Any]] = []
    for i, device in enumerate(devices):
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        model = gpu or f"{cpu_model()} ({torch.get_num_threads()} threads)"
        mine.append({"rank": rank, "device": str(device), "gpu": gpu, "model": model,
                     "tflops": best[i][0], "seconds": best[i][1], "windows": [w for w, _s in windows[i]],
                     "kernel_shared_by": sharing})
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, mine, group=ctl)
    return [row for rows in everyone for row in rows]


def exchange(rank: int, partner: int, nbytes: int, iters: int, device: torch.device) -> float:
    """Best seconds of simultaneous send+receive of `nbytes` with `partner`: `iters` at least, more
    while they take under MIN_EXCHANGE_S (at most MAX_EXCHANGES), so a healthy pair gets enough tries
    that a moment off the CPU is not its figure; the lower rank decides and tells its partner."""
    send = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    recv = torch.empty_like(send)
    more = torch.zeros(1, dtype=torch.int32, device=device)
    best, done, started = float("inf"), -1, time.perf_counter()
    while True:  # the first, small, warms the connection up and is not timed
        size = min(WARMUP_BYTES, nbytes) // 4 if done < 0 else nbytes // 4
        _sync(device)
        start = time.perf_counter()
        ops = [dist.P2POp(dist.isend, send[:size], partner), dist.P2POp(dist.irecv, recv[:size], partner)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        _sync(device)
        if done < 0:
            started = time.perf_counter()
        else:
            best = min(best, time.perf_counter() - start)
        done += 1
        if rank < partner:
            spent = time.perf_counter() - started
            more.fill_(int(done < iters or (spent < MIN_EXCHANGE_S and done < MAX_EXCHANGES)))
            dist.send(more, partner)
        else:
            dist.recv(more, partner)
        if not int(more.item()):
            return best


def run_round(number: int, pairs: list[schedule.Pair], args: argparse.Namespace, rank: int, world: int,
              device: torch.device, ctl: Any) -> dict[schedule.Pair, float]:
    partner = next((b if a == rank else a for a, b in pairs if rank in (a, b)), None)
    dist.barrier(group=ctl)
    seconds = exchange(rank, partner, args.bytes, args.iters, device) if partner is not None else 0.0
    got: list[Any] = [None] * world
    dist.all_gather_object(got, (partner, seconds), group=ctl)
    rates: dict[schedule.Pair, float] = {}
    for r, (other, secs) in enumerate(got):
        if other is not None and r < other:  # the lower rank's figure; its partner's is the same exchange
            rates[(r, other)] = args.bytes / max(secs, max(got[other][1], 1e-9)) / 1e6
    if rank == 0:
        print(f"DDPCTL-DEEP-ROUND {number} {len(pairs)}", flush=True)
    return rates


def plan_next(played: int, tournament: list[list[schedule.Pair]], rates: dict[schedule.Pair, float],
              elapsed: float, budget: float, rechecked: bool, n: int) -> tuple[str, list[list[schedule.Pair]]]:
    """Rank 0's choice after each round: ("tournament", [its next round]) while the budget lasts
    (MIN_ROUNDS whatever it is), then ("recheck", rounds) once where a pair was slow, then
    ("done", [])."""
    if played < len(tournament) and (played < schedule.MIN_ROUNDS or elapsed < budget):
        return "tournament", [tournament[played]]
    if not rechecked:
        rounds = schedule.recheck_rounds(rates, n)[:schedule.MAX_RECHECK_ROUNDS]
        if rounds:
            return "recheck", rounds
    return "done", []


def links_phase(args: argparse.Namespace, rank: int, world: int, device: torch.device,
                ctl: Any) -> tuple[list[dict[str, Any]], int, bool]:
    """(one row per pair measured, rounds run, whether every pair was measured)."""
    tournament = schedule.round_robin(world)
    rates: dict[schedule.Pair, float] = {}  # a pair's best figure
    seen_in: dict[schedule.Pair, list[int]] = {}  # the rounds that measured it
    started, played, number, rechecked = time.monotonic(), 0, 0, False
    while True:
        plan: list[Any] = [None]
        if rank == 0:
            plan[0] = plan_next(played, tournament, rates, time.monotonic() - started, args.links_budget,
                                rechecked, world)
        dist.broadcast_object_list(plan, src=0, group=ctl)
        kind, rounds = plan[0]
        if kind == "done":
            rows = [{"a": a, "b": b, "mbps": v, "measured": len(seen_in[(a, b)]), "rounds": seen_in[(a, b)]}
                    for (a, b), v in rates.items()]
            return rows, number, played == len(tournament)
        for pairs in rounds:
            for p, v in run_round(number, pairs, args, rank, world, device, ctl).items():
                rates[p] = max(v, rates.get(p, 0.0))
                seen_in.setdefault(p, []).append(number)
            number += 1
        played += kind == "tournament"
        rechecked = rechecked or kind == "recheck"


def main() -> int:
    args = parse_args(sys.argv[1:])
    cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    ctl = dist.new_group(backend="gloo") if cuda else None
    rank, world = dist.get_rank(), dist.get_world_size()
    started = time.monotonic()
    compute = compute_phase(rank, world, args.compute_seconds, ctl)
    computed = time.monotonic()
    links, rounds, every = links_phase(args, rank, world, device, ctl) if world > 1 else ([], 0, True)
    if rank == 0:
        out = {"schema": 1, "backend": backend, "bytes": args.bytes, "iters": args.iters, "rounds": rounds,
               "all_pairs": every, "links": links, "compute": compute,
               "compute_s": computed - started, "links_s": time.monotonic() - computed}
        print("DDPCTL-DEEP " + json.dumps(out), flush=True)
    dist.barrier(group=ctl)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
