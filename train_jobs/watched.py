"""A real DDP job to watch: it steps at a set pace and can be made slow or stuck on purpose, so
that `ddpctl up`'s straggler and hang verdicts (orchestrator/watch/) are tested and measured on
real hosts with no change to how ddpctl runs it.

Each step: `load_batch` (the input side) sleeps half of --step-ms, a gradient hook (the compute
side, inside backward) sleeps the other half, each jittered by +-(--noise); then the optimizer
step and an all_reduce of the loss (a metric, as real scripts log one).
- --slow-rank R --slow-ms M --slow-side input|compute: from step --slow-after on (until step
  --slow-until, if given), rank R spends M ms more per step in `load_batch` (input) or in its
  gradient hook (compute).
- --hang-rank R --hang-at S --hang-how sleep|stop|skip: at step S rank R sleeps forever in
  `load_batch` ("sleep"), stops itself with SIGSTOP ("stop"), or skips the loss all_reduce and
  then waits forever for a file no one writes ("skip": the others wait in that all_reduce).
- --leak-mb M: every rank keeps M MiB more at each step (a leak, for the memory finding).
Rank 0 prints `step N loss X` every --print-every steps; the job ends after --steps steps.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-ms", type=float, default=40.0, help="each rank's time per step (half input, half compute)")
    p.add_argument("--noise", type=float, default=0.0, help="each half jittered by up to this fraction")
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--slow-side", choices=("input", "compute"), default="input")
    p.add_argument("--slow-after", type=int, default=0, help="the step the slowdown starts at")
    p.add_argument("--slow-until", type=int, default=-1, help="the step the slowdown ends at (-1: never)")
    p.add_argument("--hang-rank", type=int, default=-1)
    p.add_argument("--hang-at", type=int, default=-1)
    p.add_argument("--hang-how", choices=("sleep", "stop", "skip"), default="sleep")
    p.add_argument("--leak-mb", type=float, default=0.0)
    p.add_argument("--print-every", type=int, default=10)
    return p.parse_args(argv)


class Pace:
    """How long this rank's input and compute take at each step."""

    def __init__(self, args: argparse.Namespace, rank: int) -> None:
        self.args, self.rank = args, rank
        self.random = random.Random(1000 + rank)
        self.step = 0

    def half(self, side: str) -> float:
        base = self.args.step_ms / 2 * (1 + self.random.uniform(-self.args.noise, self.args.noise))
        slow = self.rank == self.args.slow_rank and self.args.slow_side == side and self.step >= self.args.slow_after \
            and (self.args.slow_until < 0 or self.step < self.args.slow_until)
        return (base + (self.args.slow_ms if slow else 0.0)) / 1000


def load_batch(pace: Pace, args: argparse.Namespace) -> torch.Tensor:
    if pace.rank == args.hang_rank and pace.step == args.hang_at:
        if args.hang_how == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif args.hang_how == "sleep":
            while True:
                time.sleep(3600)
    time.sleep(pace.half("input"))
    return torch.randn(32, 64)


def wait_for_peers(path: str) -> None:
    """Wait for a file that never comes (the 'skip' hang: this rank left the collective out)."""
    while not os.path.exists(path):
        time.sleep(1)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pace = Pace(args, rank)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    model[0].weight.register_hook(lambda grad: time.sleep(pace.half("compute")))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    leaked = []
    for step in range(args.steps):
        if args.leak_mb:
            leaked.append(bytearray(b"x" * int(args.leak_mb * 2**20)))  # touched: resident
        pace.step = step
        x = load_batch(pace, args)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        metric = loss.detach().clone()
        if rank == args.hang_rank and step == args.hang_at and args.hang_how == "skip":
            wait_for_peers(os.path.join(os.getcwd(), f"never-written-{os.getpid()}"))
        dist.all_reduce(metric)
        if rank == 0 and step % args.print_every == 0:
            print(f"step {step} loss {metric.item() / dist.get_world_size():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
