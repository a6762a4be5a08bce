"""Toy DDP job: a few steps of linear regression, then a cross-rank parameter-identity check.

Launch: python -m torch.distributed.run --standalone --nproc-per-node 2 train.py --epochs 2
Every rank prints one line at the end:
  rank=R local_rank=L world_size=W node_rank=N params_identical=True checksum=X device=D backend=B
Test hooks: --echo-args (prints `ARGS <json of sys.argv[1:]>` on every rank), --fail-rank R
--fail-at-step S (RuntimeError on that rank), --sleep-rank R (sleeps forever before a collective
while the other ranks block in all_reduce), --steps-delay SECONDS.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

try:
    from train_jobs import common
except ImportError:  # run as a plain script from its own directory: add the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from train_jobs import common


@dataclass(frozen=True)
class ToyArgs:
    epochs: int
    steps: int
    batch_size: int
    lr: float
    seed: int
    echo_args: bool
    fail_rank: int | None
    fail_at_step: int
    sleep_rank: int | None
    steps_delay: float


def parse_args(argv: list[str]) -> ToyArgs:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps", type=int, default=4, help="steps per epoch (at most)")
    p.add_argument("--batch-size", type=int, default=8, help="per-rank batch size")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--echo-args", action="store_true", help="print ARGS <json argv> per rank")
    p.add_argument("--fail-rank", type=int, default=None, help="rank that raises RuntimeError")
    p.add_argument("--fail-at-step", type=int, default=0, help="global step of --fail-rank")
    p.add_argument("--sleep-rank", type=int, default=None, help="rank that sleeps forever")
    p.add_argument("--steps-delay", type=float, default=0.0, help="seconds to sleep per step")
    p.add_argument("rest", nargs="*", help="extra positional arguments (echoed, else ignored)")
    ns = p.parse_args(argv)
    return ToyArgs(
        epochs=ns.epochs,
        steps=ns.steps,
        batch_size=ns.batch_size,
        lr=ns.lr,
        seed=ns.seed,
        echo_args=ns.echo_args,
        fail_rank=ns.fail_rank,
        fail_at_step=ns.fail_at_step,
        sleep_rank=ns.sleep_rank,
        steps_delay=ns.steps_delay,
    )


def synthetic_regression(n: int, seed: int) -> TensorDataset:
    """y = x @ w + 0.1 noise, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 1, generator=g)
    y = x @ w + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def sleep_forever_before_collective(rank: int) -> None:
    """Hang on purpose (for stack-dump tests): Python-level sleep, never returns."""
    common.emit(f"rank={rank} sleeping forever before all_reduce")
    while True:
        time.sleep(3600)


def maybe_fail(args: ToyArgs, rank: int, step: int) -> None:
    if args.fail_rank == rank and step == args.fail_at_step:
        # the rank's own clock: bench/launch_teardown.py times the teardown from this instant
        common.emit(f"rank={rank} raising the injected failure at unix time {time.time():.3f}")
        raise RuntimeError(f"injected failure: rank {rank} at step {step} (--fail-rank)")


def train(ctx: common.DistContext, args: ToyArgs) -> nn.Module:
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(ctx.device)
    ddp = DistributedDataParallel(model, device_ids=[ctx.device] if ctx.device.type == "cuda" else None)
    if args.sleep_rank == ctx.env.rank:
        sleep_forever_before_collective(ctx.env.rank)
    probe = torch.ones(1, device=ctx.device)
    dist.all_reduce(probe)  # the others block here while --sleep-rank sleeps
    data = synthetic_regression(n=max(64, args.batch_size * args.steps * ctx.env.world_size), seed=1)
    sampler = DistributedSampler(data, shuffle=True, seed=args.seed)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, device=ctx.device)
        for i, (x, y) in enumerate(loader):
            if i >= args.steps:
                break
            maybe_fail(args, ctx.env.rank, step)
            loss = nn.functional.mse_loss(ddp(x.to(ctx.device)), y.to(ctx.device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += torch.stack([loss.detach(), torch.ones((), device=ctx.device)])
            step += 1
            if args.steps_delay > 0:
                time.sleep(args.steps_delay)
        dist.all_reduce(total)
        common.print0(ctx, f"epoch={epoch} loss={(total[0] / total[1]).item():.6f} steps={step}")
    return model


@record
def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    args = parse_args(raw)
    ctx = common.init_distributed()
    ok = False
    try:
        if args.echo_args:
            common.emit(f"ARGS {json.dumps(raw)}")
        model = train(ctx, args)
        check = common.check_params_identical(ctx, model.parameters())
        common.emit(common.rank_report_line(ctx, check))
        ok = True
        return 0 if check.identical else 1
    finally:
        common.cleanup(barrier=ok)


if __name__ == "__main__":
    sys.exit(main())
