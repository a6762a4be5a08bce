"""Datasets: deterministic synthetic CIFAR-shaped data, or a real cifar-10-batches-py folder."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

NUM_CLASSES = 10
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
CIFAR_DIRNAME = "cifar-10-batches-py"


@dataclass(frozen=True)
class Splits:
    """Train and test sets, plus where they came from (for the log)."""

    train: TensorDataset
    test: TensorDataset
    source: str


def _prototypes(g: torch.Generator) -> torch.Tensor:
    """One smooth 3x32x32 pattern per class: random 4x4 colour blobs upsampled."""
    coarse = torch.randn(NUM_CLASSES, 3, 4, 4, generator=g)
    return nn_upsample(coarse, 32)


def nn_upsample(x: torch.Tensor, size: int) -> torch.Tensor:
    return torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)


def synthetic_split(n: int, prototypes: torch.Tensor, g: torch.Generator) -> TensorDataset:
    """Samples = class pattern * random contrast, randomly shifted, plus strong pixel noise."""
    labels = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    contrast = 0.5 + torch.rand(n, 1, 1, 1, generator=g)
    images = prototypes[labels] * contrast
    shifts = torch.randint(-3, 4, (n, 2), generator=g)
    for i in range(n):  # small translations so the net must learn shift-tolerant features
        images[i] = torch.roll(images[i], shifts=(int(shifts[i, 0]), int(shifts[i, 1])), dims=(1, 2))
    images = images + 1.2 * torch.randn(images.shape, generator=g)
    return TensorDataset(images.contiguous(), labels)


def synthetic_splits(train_size: int, test_size: int, seed: int) -> Splits:
    """Identical on every rank for a given seed."""
    g = torch.Generator().manual_seed(seed)
    protos = _prototypes(g)
    return Splits(
        train=synthetic_split(train_size, protos, g),
        test=synthetic_split(test_size, protos, g),
        source=f"synthetic(seed={seed})",
    )


def find_cifar_dir(root: Path) -> Path | None:
    """The folder with data_batch_1..5 and test_batch: root or root/cifar-10-batches-py."""
    for candidate in (root, root / CIFAR_DIRNAME):
        if (candidate / "data_batch_1").is_file() and (candidate / "test_batch").is_file():
            return candidate
    return None


def _load_batch(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    with path.open("rb") as f:
        d = pickle.load(f, encoding="bytes")  # the official CIFAR-10 python format
    images = torch.as_tensor(d[b"data"]).reshape(-1, 3, 32, 32).float().div_(255.0)
    labels = torch.as_tensor(list(d[b"labels"]), dtype=torch.long)
    return images, labels


def _normalize(images: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
    return (images - mean) / std


def cifar_splits(folder: Path, train_size: int | None, test_size: int | None) -> Splits:
    """Read CIFAR-10 python pickles; train/test sizes truncate (None: all)."""
    parts = [_load_batch(folder / f"data_batch_{i}") for i in range(1, 6)]
    train_x = torch.cat([p[0] for p in parts])[:train_size]
    train_y = torch.cat([p[1] for p in parts])[:train_size]
    test_x, test_y = _load_batch(folder / "test_batch")
    return Splits(
        train=TensorDataset(_normalize(train_x), train_y),
        test=TensorDataset(_normalize(test_x[:test_size]), test_y[:test_size]),
        source=f"cifar10({folder})",
    )


def load_splits(data_dir: str | None, train_size: int, test_size: int, seed: int) -> Splits:
    """CIFAR-10 from data_dir when it holds the pickles, else synthetic data."""
    if data_dir is not None:
        folder = find_cifar_dir(Path(data_dir))
        if folder is not None:
            return cifar_splits(folder, train_size or None, test_size or None)
    return synthetic_splits(train_size, test_size, seed)
