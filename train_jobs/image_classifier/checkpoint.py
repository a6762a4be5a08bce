"""Checkpoints: atomic last.pt files, and a run's position (epoch, micro-batch, per-rank RNG and
running totals) saved by rank 0 and restored on every rank, so a resumed run repeats none of the
work and reproduces the uninterrupted run bit for bit (same world size, deterministic kernels)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from train_jobs import common  # as a plain script too: train.py puts the repo root on sys.path first

LAST = "last.pt"


def save_atomic(state: dict[str, Any], folder: Path, name: str = LAST) -> Path:
    """Save `state` so readers see the old file or the complete new one, never a torn one."""
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / name
    tmp = folder / f".{name}.tmp-{os.getpid()}"
    try:
        with tmp.open("wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


def load_last(folder: Path, name: str = LAST) -> dict[str, Any] | None:
    """The last checkpoint in folder, or None when there is none."""
    path = folder / name
    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


def rng_state() -> dict[str, Any]:
    """This process's CPU (and CUDA) RNG states."""
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def zero_totals(device: torch.device) -> torch.Tensor:
    """A rank's running epoch totals: loss sum, correct, count (float64)."""
    return torch.zeros(3, dtype=torch.float64, device=device)


@dataclass
class Progress:
    """Where the run stands: the epoch to (continue to) train and what of it is done on this rank.

    batches_done counts micro-batches and always ends an optimizer step (a checkpoint is taken only
    at a step boundary), so resuming never splits a gradient-accumulation group.
    """

    epoch: int
    totals: torch.Tensor  # this rank's loss sum, correct, count over the batches done
    batches_done: int = 0
    seconds: float = 0.0  # training time spent on this epoch so far
    rng: dict[str, Any] | None = None  # mid-epoch resume: apply once the epoch's data iterator exists


@dataclass
class Resumed:
    """What a checkpoint restores besides model, optimizer and scaler."""

    at: Progress
    history: list[dict[str, float]] = field(default_factory=list)


def save_run(
    ctx: common.DistContext,
    folder: Path,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    at: Progress,
    history: list[dict[str, float]],
    seed: int,
) -> None:
    """Collective: gather every rank's RNG state and epoch totals; rank 0 writes last.pt atomically."""
    per_rank: list[Any] = [None] * ctx.env.world_size
    dist.all_gather_object(per_rank, {"rng": rng_state(), "totals": at.totals.cpu()})
    if not ctx.is_main:
        return
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scaler": scaler.state_dict(),
        "epoch": at.epoch - 1,  # last completed epoch (-1: none yet)
        "sampler": {"seed": seed, "next_epoch": at.epoch, "batches_done": at.batches_done},
        "rng": [r["rng"] for r in per_rank],
        "partial": {"totals": [r["totals"] for r in per_rank], "seconds": at.seconds},
        "history": history,
        "world_size": ctx.env.world_size,
    }
    save_atomic(state, folder)


def restore_run(
    ctx: common.DistContext,
    folder: Path,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    seed: int,
) -> Resumed | None:
    """Rank 0 reads last.pt and broadcasts it (works without a shared filesystem); None: none there."""
    box: list[Any] = [load_last(folder) if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0)
    state = box[0]
    if state is None:
        return None
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    at = _position(ctx, state, seed)
    where = f" + {at.batches_done} micro-batches of epoch {at.epoch}" if at.batches_done else ""
    common.print0(ctx, f"resume: from epoch={state['epoch']}{where} in {folder}")
    return Resumed(at=at, history=list(state["history"]))


def _position(ctx: common.DistContext, state: dict[str, Any], seed: int) -> Progress:
    """This rank's Progress from a checkpoint; sets the RNG now unless it waits for the data iterator."""
    sampler = state["sampler"]
    at = Progress(epoch=sampler["next_epoch"], totals=zero_totals(ctx.device))
    done = sampler.get("batches_done", 0)  # absent in end-of-epoch-only checkpoints
    if state["world_size"] != ctx.env.world_size:
        again = f"; epoch {at.epoch} restarts from its first batch" if done else ""
        common.print0(ctx, f"resume: world size changed; RNG reseeded (not bit-identical){again}")
        torch.manual_seed(seed + 1000 * state["epoch"] + ctx.env.rank)
        return at
    rng = state["rng"][ctx.env.rank]
    if not done:
        set_rng_state(rng)
        return at
    at.batches_done = done
    at.totals = state["partial"]["totals"][ctx.env.rank].to(ctx.device)
    at.seconds = state["partial"]["seconds"]
    at.rng = rng
    return at
