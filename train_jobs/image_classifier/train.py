"""DDP image classifier: small ResNet on CIFAR-shaped data, with accumulation, AMP and resume.

Launch: python -m torch.distributed.run --standalone --nproc-per-node 2 train.py --epochs 5
Rank 0 prints one line per epoch and a final line:
  epoch=E loss=L acc=A samples_per_s=S train_acc=T time_s=X   (acc: held-out accuracy)
  final acc=A loss=L epochs=N checksum=C
and every rank prints common.rank_report_line (params_identical=..., checksum=...).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

try:
    from train_jobs import common
    from train_jobs.image_classifier import checkpoint as ckpt
    from train_jobs.image_classifier.data import NUM_CLASSES, load_splits
    from train_jobs.image_classifier.model import SmallResNet
except ImportError:  # run as a plain script from its own directory: add the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from train_jobs import common
    from train_jobs.image_classifier import checkpoint as ckpt
    from train_jobs.image_classifier.data import NUM_CLASSES, load_splits
    from train_jobs.image_classifier.model import SmallResNet


@dataclass(frozen=True)
class TrainArgs:
    epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    width: int
    accum_steps: int
    clip_grad: float
    amp: str
    sync_bn: bool
    data: str | None
    train_size: int
    test_size: int
    seed: int
    checkpoint_dir: Path | None
    resume: bool


@dataclass(frozen=True)
class EpochStats:
    """Global (all-rank) figures of one training epoch."""

    loss: float
    train_acc: float
    samples: int
    seconds: float


@dataclass
class State:
    """What a checkpoint restores."""

    start_epoch: int
    history: list[dict[str, float]]


def parse_args(argv: list[str]) -> TrainArgs:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64, help="per-rank micro-batch size")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--width", type=int, default=16, help="channels of the first stage")
    p.add_argument("--accum-steps", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--clip-grad", type=float, default=0.0, help="max grad norm; 0 disables")
    p.add_argument("--amp", choices=("off", "bf16", "fp16"), default="off")
    p.add_argument("--sync-bn", action="store_true", help="convert BatchNorm to SyncBatchNorm")
    p.add_argument("--data", default=None, help="folder with cifar-10-batches-py (else synthetic)")
    p.add_argument("--train-size", type=int, default=2048, help="synthetic (or max CIFAR) train")
    p.add_argument("--test-size", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", type=Path, default=None)
    p.add_argument("--resume", action="store_true", help="continue from checkpoint-dir/last.pt")
    ns = p.parse_args(argv)
    if ns.resume and ns.checkpoint_dir is None:
        p.error("--resume needs --checkpoint-dir DIR (where last.pt was saved)")
    if ns.accum_steps < 1:
        p.error(f"--accum-steps {ns.accum_steps}: must be >= 1")
    return TrainArgs(**{k: v for k, v in vars(ns).items()})


def build_model(ctx: common.DistContext, args: TrainArgs) -> DistributedDataParallel:
    torch.manual_seed(args.seed)  # same init everywhere (DDP also broadcasts rank 0's)
    model: nn.Module = SmallResNet(num_classes=NUM_CLASSES, width=args.width)
    if args.sync_bn and common.sync_bn_supported(ctx.device.type):
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    elif args.sync_bn:
        common.print0(ctx, f"sync-bn: unsupported on {ctx.device.type}; per-rank BatchNorm kept")
    model = model.to(ctx.device)
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def random_flip(x: torch.Tensor) -> torch.Tensor:
    """Horizontal flip of half the batch, drawn from the global RNG (restored on resume)."""
    flip = torch.rand(x.shape[0]) < 0.5
    return torch.where(flip.view(-1, 1, 1, 1).to(x.device), x.flip(3), x)


def is_step_batch(i: int, n_batches: int, accum_steps: int) -> bool:
    """Whether micro-batch i ends an accumulation group (the last batch always does)."""
    return (i + 1) % accum_steps == 0 or i == n_batches - 1


def train_one_epoch(
    ctx: common.DistContext,
    ddp: DistributedDataParallel,
    loader: DataLoader[Any],
    opt: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    args: TrainArgs,
) -> EpochStats:
    amp = common.select_amp(args.amp, ctx.device.type)
    ddp.train()
    totals = torch.zeros(3, dtype=torch.float64, device=ctx.device)  # loss sum, correct, count
    start = time.perf_counter()
    n = len(loader)
    for i, (x, y) in enumerate(loader):
        x, y = random_flip(x.to(ctx.device)), y.to(ctx.device)
        stepping = is_step_batch(i, n, args.accum_steps)
        sync = contextlib.nullcontext() if stepping else ddp.no_sync()
        with sync:
            with torch.autocast(ctx.device.type, dtype=amp.dtype, enabled=amp.enabled):
                logits = ddp(x)
                loss = nn.functional.cross_entropy(logits.float(), y)
            scaler.scale(loss / args.accum_steps).backward()
        if stepping:
            if args.clip_grad > 0:
                scaler.unscale_(opt)
                nn.utils.clip_grad_norm_(ddp.parameters(), args.clip_grad)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
        correct = (logits.argmax(1) == y).sum()
        totals += torch.stack([loss.detach().double() * len(y), correct.double(), totals.new_tensor(len(y))])
    dist.all_reduce(totals)
    seconds = time.perf_counter() - start
    return EpochStats(
        loss=float(totals[0] / totals[2]),
        train_acc=float(totals[1] / totals[2]),
        samples=int(totals[2]),
        seconds=seconds,
    )


def sync_buffers(model: nn.Module) -> None:
    """Give every rank rank 0's BatchNorm running stats (DDP only broadcasts them on forward)."""
    for b in model.buffers():
        dist.broadcast(b, src=0)


@torch.no_grad()
def evaluate(ctx: common.DistContext, model: nn.Module, test: TensorDataset, bs: int) -> float:
    """Accuracy over the whole test set: each rank scores a strided shard, counts all_reduced."""
    model.eval()
    idx = torch.arange(ctx.env.rank, len(test), ctx.env.world_size)
    counts = torch.zeros(2, dtype=torch.float64, device=ctx.device)
    for chunk in idx.split(bs):
        x, y = test[chunk]
        pred = model(x.to(ctx.device)).argmax(1)
        counts += torch.stack([(pred == y.to(ctx.device)).sum().double(), counts.new_tensor(len(y))])
    dist.all_reduce(counts)
    return float(counts[0] / counts[1])


def save_checkpoint(
    ctx: common.DistContext,
    args: TrainArgs,
    ddp: DistributedDataParallel,
    opt: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    epoch: int,
    history: list[dict[str, float]],
) -> None:
    """Gather every rank's RNG state; rank 0 writes last.pt atomically."""
    if args.checkpoint_dir is None:
        return
    rngs: list[Any] = [None] * ctx.env.world_size
    dist.all_gather_object(rngs, ckpt.rng_state())
    if ctx.is_main:
        state = {
            "model": ddp.module.state_dict(),
            "optimizer": opt.state_dict(),
            "scaler": scaler.state_dict(),
            "epoch": epoch,  # last completed epoch
            "sampler": {"seed": args.seed, "next_epoch": epoch + 1},
            "rng": rngs,
            "history": history,
            "world_size": ctx.env.world_size,
        }
        ckpt.save_atomic(state, args.checkpoint_dir)


def restore(
    ctx: common.DistContext,
    args: TrainArgs,
    ddp: DistributedDataParallel,
    opt: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
) -> State:
    """Rank 0 reads last.pt and broadcasts it (works without a shared filesystem)."""
    box: list[Any] = [None]
    if ctx.is_main and args.checkpoint_dir is not None:
        box[0] = ckpt.load_last(args.checkpoint_dir)
    dist.broadcast_object_list(box, src=0)
    state = box[0]
    if state is None:
        common.print0(ctx, f"resume: no checkpoint in {args.checkpoint_dir}, starting fresh")
        return State(start_epoch=0, history=[])
    ddp.module.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    if state["world_size"] == ctx.env.world_size:
        ckpt.set_rng_state(state["rng"][ctx.env.rank])
    else:
        common.print0(ctx, "resume: world size changed; RNG reseeded (not bit-identical)")
        torch.manual_seed(args.seed + 1000 * state["epoch"] + ctx.env.rank)
    common.print0(ctx, f"resume: from epoch={state['epoch']} in {args.checkpoint_dir}")
    return State(start_epoch=state["sampler"]["next_epoch"], history=list(state["history"]))


def epoch_line(epoch: int, stats: EpochStats, acc: float) -> str:
    return (
        f"epoch={epoch} loss={stats.loss:.4f} acc={acc:.4f} "
        f"samples_per_s={stats.samples / stats.seconds:.1f} "
        f"train_acc={stats.train_acc:.4f} time_s={stats.seconds:.2f}"
    )


def run(ctx: common.DistContext, args: TrainArgs) -> int:
    splits = load_splits(args.data, args.train_size, args.test_size, seed=1234)
    common.print0(ctx, f"data={splits.source} train={len(splits.train)} test={len(splits.test)}")
    ddp = build_model(ctx, args)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    scaler = torch.amp.GradScaler(ctx.device.type, enabled=common.select_amp(args.amp, "").use_scaler)
    torch.manual_seed(args.seed + 1 + ctx.env.rank)  # per-rank augmentation stream
    state = restore(ctx, args, ddp, opt, scaler) if args.resume else State(0, [])
    sampler = DistributedSampler(splits.train, shuffle=True, seed=args.seed)
    loader = DataLoader(splits.train, batch_size=args.batch_size, sampler=sampler)
    for epoch in range(state.start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        stats = train_one_epoch(ctx, ddp, loader, opt, scaler, args)
        sync_buffers(ddp.module)
        acc = evaluate(ctx, ddp.module, splits.test, 256)
        state.history.append({"epoch": epoch, "loss": stats.loss, "acc": acc})
        common.print0(ctx, epoch_line(epoch, stats, acc))
        save_checkpoint(ctx, args, ddp, opt, scaler, epoch, state.history)
    check = common.check_params_identical(ctx, ddp.module.parameters())
    common.emit(common.rank_report_line(ctx, check))
    last = state.history[-1] if state.history else {"loss": float("nan"), "acc": float("nan")}
    common.print0(
        ctx,
        f"final acc={last['acc']:.4f} loss={last['loss']:.6f} epochs={args.epochs} checksum={check.checksum:.10e}",
    )
    return 0 if check.identical else 1


@record
def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    ctx = common.init_distributed()
    ok = False
    try:
        rc = run(ctx, args)
        ok = True
        return rc
    finally:
        common.cleanup(barrier=ok)


if __name__ == "__main__":
    sys.exit(main())
