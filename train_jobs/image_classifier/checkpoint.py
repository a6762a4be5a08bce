"""Checkpoints: atomic last.pt files, and a run's position (epoch, micro-batch, per-rank RNG and
running totals) saved by rank 0 and restored on every rank, so a resumed run repeats none of the
work and reproduces the uninterrupted run bit for bit (same world size, deterministic kernels).

A run keeps two files: last.pt, and prev.pt, the one it replaced. A save writes a temporary file,
fsyncs it, moves last.pt to prev.pt, then the temporary file to last.pt (os.replace both times), so
a process or host killed mid-save leaves either file complete or absent, never torn. Loading takes
last.pt, or prev.pt with a warning when last.pt is missing, cannot be read, is no checkpoint, or
(on a ddpctl restart of a fresh run) was saved by another run: checkpoints carry DDPCTL_RUN_ID.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from train_jobs import common  # as a plain script too: train.py puts the repo root on sys.path first

LAST = "last.pt"
PREV = "prev.pt"  # the checkpoint before last.pt: what a run resumes from when last.pt is unreadable


def _fsync_dir(folder: Path) -> None:
    """Make the renames in folder durable (best effort: not every filesystem lets a directory be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save_atomic(state: dict[str, Any], folder: Path, name: str = LAST, previous: str | None = None) -> Path:
    """Save `state` so readers see the old file or the complete new one, never a torn one.

    previous: keep the file being replaced under this name (itself replaced atomically), as the
    fallback of a reader that finds the new one unreadable.
    """
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / name
    tmp = folder / f".{name}.tmp-{os.getpid()}"
    try:
        with tmp.open("wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        if previous is not None and final.is_file():
            os.replace(final, folder / previous)  # killed here: no `name`, `previous` is the newest
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(folder)
    return final


def _warn(line: str) -> None:
    common.emit(line)


def load_latest(
    folder: Path,
    names: tuple[str, ...] = (LAST, PREV),
    warn: Callable[[str], None] = _warn,
    run_id: str | None = None,
) -> tuple[Path, dict[str, Any]] | None:
    """(path, state) of the newest readable checkpoint in folder, trying `names` newest first;
    None when there is none. A file that is missing while an older one exists, cannot be read,
    holds no checkpoint (not a dict) or, with run_id, was saved by another run, is skipped for the
    next one, with a warning."""
    skipped: list[str] = []
    for i, name in enumerate(names):
        path = folder / name
        if not path.is_file():
            if path.exists():
                skipped.append(f"{path} is not a file")
            elif any((folder / older).is_file() for older in names[i + 1:]):
                skipped.append(f"{path} is missing (a save was interrupted?)")
            continue
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:  # a torn or foreign file: torch/pickle raise many kinds of error
            skipped.append(f"{path} is unreadable ({type(e).__name__}: {' '.join(str(e).split())[:200]})")
            continue
        if not isinstance(state, dict):
            skipped.append(f"{path} holds a {type(state).__name__}, not a checkpoint")
            continue
        if run_id is not None and state.get("run_id") != run_id:
            skipped.append(f"{path} was saved by run {state.get('run_id')}, not by this run {run_id}")
            continue
        for why in skipped:
            warn(f"checkpoint: warning: {why}; using {path}")
        return path, state
    for why in skipped:
        warn(f"checkpoint: warning: {why}; no older checkpoint to fall back to")
    return None


def load_last(folder: Path, name: str = LAST) -> dict[str, Any] | None:
    """The newest readable checkpoint in folder (`name`, else PREV), or None when there is none."""
    found = load_latest(folder, (name, PREV) if name != PREV else (name,))
    return None if found is None else found[1]


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
    path: Path | None = None  # the file it was read from (None: a fresh start)


def save_run(
    ctx: common.DistContext,
    folder: Path,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    at: Progress,
    history: list[dict[str, float]],
    seed: int,
    run_id: str | None = None,
) -> None:
    """Collective: gather every rank's RNG state and epoch totals; rank 0 writes last.pt atomically
    (the last.pt it replaces becomes prev.pt)."""
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
        "run_id": run_id,  # DDPCTL_RUN_ID: the same for every attempt of a ddpctl run
    }
    if not owns_checkpoints(folder):
        _warn(f"a newer attempt owns {folder} (.ddpctl-attempt): this stale attempt does not save")
        return
    save_atomic(state, folder, previous=PREV)


def owns_checkpoints(folder: Path) -> bool:
    """False when a newer ddpctl attempt, or another run, owns `folder`: ddpctl marks the owner in
    .ddpctl-attempt before each attempt starts (docs/restarts.md), and a stale attempt must not write."""
    try:
        mark = json.loads((folder / ".ddpctl-attempt").read_text())
    except (OSError, ValueError):
        return True
    return isinstance(mark, dict) and mark.get("run_id") == os.environ.get("DDPCTL_RUN_ID") and \
        int(mark.get("attempt", -1)) <= int(os.environ.get("DDPCTL_ATTEMPT", "0"))


def restore_run(
    ctx: common.DistContext,
    folder: Path,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    seed: int,
    run_id: str | None = None,
) -> Resumed | None:
    """Rank 0 reads last.pt (prev.pt when last.pt is unreadable, with a warning) and broadcasts it
    (works without a shared filesystem); None: no readable checkpoint there (with run_id: none
    saved by that run)."""
    box: list[Any] = [load_latest(folder, run_id=run_id) if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0)
    if box[0] is None:
        return None
    path, state = box[0]
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    at = _position(ctx, state, seed)
    where = f" + {at.batches_done} micro-batches of epoch {at.epoch}" if at.batches_done else ""
    common.print0(ctx, f"resume: from epoch={state['epoch']}{where} in {folder}")
    return Resumed(at=at, history=list(state["history"]), path=path)


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
