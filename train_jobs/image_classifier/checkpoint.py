"""Atomic checkpoints: write a temp file in the same folder, fsync, then os.replace."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

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
