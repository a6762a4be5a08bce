"""DDP image classifier: small ResNet on CIFAR-shaped data, with accumulation, AMP, resume and
preemption.

Launch: python -m torch.distributed.run --standalone --nproc-per-node 2 train.py --epochs 5
Rank 0 prints one line per epoch and a final line:
  epoch=E loss=L acc=A samples_per_s=S train_acc=T time_s=X   (acc: held-out accuracy)
  final acc=A loss=L epochs=N checksum=C
and every rank prints common.rank_report_line (params_identical=..., checksum=...).

With --checkpoint-dir DIR (default: $DDPCTL_CHECKPOINT_DIR, which ddpctl sets from the job file's
[restart] checkpoint_dir), rank 0 writes DIR/last.pt atomically after every epoch, keeping the one
it replaces as DIR/prev.pt: a resume that finds last.pt unreadable warns and uses prev.pt.

Preemption: SIGUSR1 on any rank (torchrun forwards it to every worker when started with
`--signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1`; Slurm sends it before the time limit
with `--signal=USR1@90`) makes all ranks stop at the next optimizer step (they agree with an
all_reduce after every step, so a gradient-accumulation group is never split). Rank 0 saves the
position (epoch, micro-batches done, model/optimizer/scaler, every rank's RNG and running totals)
and every rank exits 0 after rank 0 prints one of:
  preempted: checkpoint saved at epoch=E          (E: the epoch a resumed run continues)
  preempted: no --checkpoint-dir, nothing saved
A torchrun that received the signal itself still exits 1 (it re-raises it as SignalException).

Resume: --resume, or automatically when SLURM_RESTART_COUNT > 0 (a requeued Slurm job) or
DDPCTL_ATTEMPT > 0 (ddpctl restarted the job after a failure) and the checkpoint directory holds a
checkpoint. Rank 0 prints
  resumed from checkpoint at epoch=E (restart N)   (N: SLURM_RESTART_COUNT, 0 for --resume)
or, on a ddpctl restart,
  resumed from DIR/last.pt at epoch=E on attempt N after: <DDPCTL_PREV_FAILURE>
(E: the epoch the run continues; " after: ..." only when DDPCTL_PREV_FAILURE is set) and the run
continues mid-epoch where it stopped: with the same world size it ends with exactly the checksum
of an uninterrupted run. Checkpoints carry DDPCTL_RUN_ID: a ddpctl restart of a run that started
fresh (no --resume) resumes only from one its own attempts saved, never from what an earlier run
left in the directory.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
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
    checkpoint_dir: Path | None  # --checkpoint-dir, else DDPCTL_CHECKPOINT_DIR
    resume: bool
    restart: int  # SLURM_RESTART_COUNT: 0 on the first run, n on the n-th requeue
    attempt: int = 0  # DDPCTL_ATTEMPT: 0 on the first attempt, n on ddpctl's n-th restart
    prev_failure: str | None = None  # DDPCTL_PREV_FAILURE: why the attempt before failed
    run_id: str | None = None  # DDPCTL_RUN_ID: the same for every attempt; stamped on checkpoints

    @property
    def auto_resume(self) -> bool:
        """--resume, or a requeued Slurm job or restarted ddpctl job that has somewhere to resume from."""
        return self.resume or ((self.restart > 0 or self.attempt > 0) and self.checkpoint_dir is not None)

    @property
    def resume_run_only(self) -> str | None:
        """The run whose checkpoints a resume may use: on a ddpctl restart of a run that started
        fresh (no --resume, no Slurm requeue), only the ones this run saved, never a stale
        checkpoint an earlier run left in the directory. None: any."""
        return self.run_id if self.attempt > 0 and not self.resume and self.restart == 0 else None


@dataclass(frozen=True)
class EpochStats:
    """Global (all-rank) figures of one training epoch."""

    loss: float
    train_acc: float
    samples: int
    seconds: float


class PreemptFlag:
    """Set by SIGUSR1 and nothing else; the ranks act on it together (agreed) at a step boundary."""

    def __init__(self) -> None:
        self.requested = False

    def install(self, signum: int = signal.SIGUSR1) -> None:
        signal.signal(signum, self._on_signal)
        signal.siginterrupt(signum, False)  # restart interrupted system calls: only a flag is set

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def agreed(self, device: torch.device) -> bool:
        """Collective: True on every rank when any rank has been signalled."""
        flag = torch.tensor([1.0 if self.requested else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


ATTEMPT_ENV = "DDPCTL_ATTEMPT"  # ddpctl: 0, 1, ... (orchestrator/launch/plan.py)
PREV_FAILURE_ENV = "DDPCTL_PREV_FAILURE"  # ddpctl: one line, on attempts after the first
RUN_ID_ENV = "DDPCTL_RUN_ID"  # ddpctl: the same for every attempt of a run
CHECKPOINT_DIR_ENV = "DDPCTL_CHECKPOINT_DIR"  # ddpctl: [restart] checkpoint_dir


def _count(environ: Mapping[str, str], name: str) -> int:
    """A whole number >= 0 from environ[name]; 0 when unset or empty."""
    raw = environ.get(name, "").strip()
    if not raw:
        return 0
    try:
        count = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number") from None
    if count < 0:
        raise ValueError(f"{name}={raw!r} is negative")
    return count


def restart_count(environ: Mapping[str, str]) -> int:
    """SLURM_RESTART_COUNT (Slurm sets it on a requeued job); 0 when unset or empty."""
    return _count(environ, "SLURM_RESTART_COUNT")


def attempt_number(environ: Mapping[str, str]) -> int:
    """DDPCTL_ATTEMPT (ddpctl sets it on every rank: 0, then 1, 2, ... on restarts); 0 when unset or empty."""
    return _count(environ, ATTEMPT_ENV)


def parse_args(argv: list[str], environ: Mapping[str, str] = os.environ) -> TrainArgs:
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
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from checkpoint-dir/last.pt (implied when SLURM_RESTART_COUNT > 0 or DDPCTL_ATTEMPT > 0)",
    )
    ns = p.parse_args(argv)
    if ns.checkpoint_dir is None and environ.get(CHECKPOINT_DIR_ENV, "").strip():
        ns.checkpoint_dir = Path(environ[CHECKPOINT_DIR_ENV].strip())  # relative: to the job's workdir (cwd)
    if ns.resume and ns.checkpoint_dir is None:
        p.error("--resume needs --checkpoint-dir DIR (where last.pt was saved)")
    if ns.accum_steps < 1:
        p.error(f"--accum-steps {ns.accum_steps}: must be >= 1")
    try:
        restart = restart_count(environ)
    except ValueError as e:
        p.error(f"{e}: unset it or set it to 0, 1, 2, ... (Slurm's restart count)")
    try:
        attempt = attempt_number(environ)
    except ValueError as e:
        p.error(f"{e}: unset it or set it to 0, 1, 2, ... (ddpctl's attempt number)")
    prev_failure = " ".join(environ.get(PREV_FAILURE_ENV, "").split()) or None  # one line
    run_id = environ.get(RUN_ID_ENV, "").strip() or None
    return TrainArgs(**vars(ns), restart=restart, attempt=attempt, prev_failure=prev_failure, run_id=run_id)


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


def remaining_batches(loader: DataLoader[Any], at: ckpt.Progress) -> Iterator[tuple[int, Any]]:
    """(index, micro-batch) of the epoch from at.batches_done on.

    Making the iterator draws the loader's base seed from the global RNG, so a mid-epoch resume
    restores the RNG saved at the step boundary only after that draw.
    """
    batches = iter(loader)
    if at.rng is not None:
        ckpt.set_rng_state(at.rng)
        at.rng = None
    return itertools.islice(enumerate(batches), at.batches_done, None)


def train_one_epoch(
    ctx: common.DistContext,
    ddp: DistributedDataParallel,
    loader: DataLoader[Any],
    opt: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    args: TrainArgs,
    at: ckpt.Progress,
    preempt: PreemptFlag,
) -> bool:
    """Train the rest of epoch at.epoch, updating `at`; False when the ranks agreed to stop for
    preemption (checked after every optimizer step, so never inside an accumulation group)."""
    amp = common.select_amp(args.amp, ctx.device.type)
    ddp.train()
    start = time.perf_counter()
    n = len(loader)
    finished = True
    for i, (x, y) in remaining_batches(loader, at):
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
        at.totals += torch.stack([loss.detach().double() * len(y), correct.double(), at.totals.new_tensor(len(y))])
        at.batches_done = i + 1
        if stepping and preempt.agreed(ctx.device):
            finished = False
            break
    at.seconds += time.perf_counter() - start
    return finished


def epoch_stats(at: ckpt.Progress) -> EpochStats:
    """Collective: the finished epoch's figures over all ranks."""
    totals = at.totals.clone()
    dist.all_reduce(totals)
    return EpochStats(
        loss=float(totals[0] / totals[2]),
        train_acc=float(totals[1] / totals[2]),
        samples=int(totals[2]),
        seconds=at.seconds,
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


def resume(
    ctx: common.DistContext,
    args: TrainArgs,
    ddp: DistributedDataParallel,
    opt: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
) -> ckpt.Resumed:
    """Where the run starts: the checkpoint's position (--resume, a requeued Slurm job or a ddpctl
    restart), else epoch 0."""
    fresh = ckpt.Resumed(at=ckpt.Progress(epoch=0, totals=ckpt.zero_totals(ctx.device)))
    after = f" after: {args.prev_failure}" if args.prev_failure else ""
    if args.checkpoint_dir is None or not args.auto_resume:
        if args.attempt > 0:
            common.print0(ctx, f"attempt {args.attempt}: no --checkpoint-dir nor {CHECKPOINT_DIR_ENV} to resume "
                               f"from, starting fresh{after}")
        elif args.restart > 0:
            common.print0(ctx, f"restart {args.restart}: no --checkpoint-dir to resume from, starting fresh")
        return fresh
    resumed = ckpt.restore_run(ctx, args.checkpoint_dir, ddp.module, opt, scaler, args.seed, args.resume_run_only)
    if resumed is None:
        on = f" on attempt {args.attempt}{after}" if args.attempt > 0 else ""
        common.print0(ctx, f"resume: no checkpoint in {args.checkpoint_dir}, starting fresh{on}")
        return fresh
    common.print0(ctx, resumed_line(args, resumed))
    return resumed


def resumed_line(args: TrainArgs, resumed: ckpt.Resumed) -> str:
    """What rank 0 prints on resuming (E: the epoch the run continues)."""
    if args.attempt > 0:  # a ddpctl restart
        after = f" after: {args.prev_failure}" if args.prev_failure else ""
        return f"resumed from {resumed.path} at epoch={resumed.at.epoch} on attempt {args.attempt}{after}"
    return f"resumed from checkpoint at epoch={resumed.at.epoch} (restart {args.restart})"


def stop_preempted(
    ctx: common.DistContext,
    args: TrainArgs,
    ddp: DistributedDataParallel,
    opt: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    at: ckpt.Progress,
    history: list[dict[str, float]],
) -> int:
    """Rank 0 saves where the run stands; once every rank is past that, rank 0 says so. Exit code 0."""
    if args.checkpoint_dir is None:
        line = "preempted: no --checkpoint-dir, nothing saved"
    else:
        ckpt.save_run(ctx, args.checkpoint_dir, ddp.module, opt, scaler, at, history, args.seed, args.run_id)
        line = f"preempted: checkpoint saved at epoch={at.epoch}"
    dist.barrier()
    common.print0(ctx, line)
    return 0


def epoch_line(epoch: int, stats: EpochStats, acc: float) -> str:
    return (
        f"epoch={epoch} loss={stats.loss:.4f} acc={acc:.4f} "
        f"samples_per_s={stats.samples / stats.seconds:.1f} "
        f"train_acc={stats.train_acc:.4f} time_s={stats.seconds:.2f}"
    )


def run(ctx: common.DistContext, args: TrainArgs, preempt: PreemptFlag) -> int:
    splits = load_splits(args.data, args.train_size, args.test_size, seed=1234)
    common.print0(ctx, f"data={splits.source} train={len(splits.train)} test={len(splits.test)}")
    ddp = build_model(ctx, args)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    scaler = torch.amp.GradScaler(ctx.device.type, enabled=common.select_amp(args.amp, "").use_scaler)
    torch.manual_seed(args.seed + 1 + ctx.env.rank)  # per-rank augmentation stream
    start = resume(ctx, args, ddp, opt, scaler)
    at, history = start.at, start.history
    sampler = DistributedSampler(splits.train, shuffle=True, seed=args.seed)
    loader = DataLoader(splits.train, batch_size=args.batch_size, sampler=sampler)
    while at.epoch < args.epochs:
        sampler.set_epoch(at.epoch)
        if not train_one_epoch(ctx, ddp, loader, opt, scaler, args, at, preempt):
            return stop_preempted(ctx, args, ddp, opt, scaler, at, history)
        stats = epoch_stats(at)
        sync_buffers(ddp.module)
        acc = evaluate(ctx, ddp.module, splits.test, 256)
        history.append({"epoch": at.epoch, "loss": stats.loss, "acc": acc})
        common.print0(ctx, epoch_line(at.epoch, stats, acc))
        at = ckpt.Progress(epoch=at.epoch + 1, totals=ckpt.zero_totals(ctx.device))
        if args.checkpoint_dir is not None:
            ckpt.save_run(ctx, args.checkpoint_dir, ddp.module, opt, scaler, at, history, args.seed, args.run_id)
    check = common.check_params_identical(ctx, ddp.module.parameters())
    common.emit(common.rank_report_line(ctx, check))
    last = history[-1] if history else {"loss": float("nan"), "acc": float("nan")}
    common.print0(
        ctx,
        f"final acc={last['acc']:.4f} loss={last['loss']:.6f} epochs={args.epochs} checksum={check.checksum:.10e}",
    )
    return 0 if check.identical else 1


@record
def main(argv: list[str] | None = None) -> int:
    preempt = PreemptFlag()
    preempt.install()  # first thing: from here on SIGUSR1 stops the run cleanly instead of killing it
    args = parse_args(sys.argv[1:] if argv is None else argv)
    ctx = common.init_distributed()
    ok = False
    try:
        rc = run(ctx, args, preempt)
        ok = True
        return rc
    finally:
        common.cleanup(barrier=ok)


if __name__ == "__main__":
    sys.exit(main())
