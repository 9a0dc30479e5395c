"""scikit-learn's handwritten digits (1,797 images, 8x8, ten classes) as tensors.

The data ship inside scikit-learn, so loading needs no network.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, TensorDataset


@dataclass(frozen=True)
class DigitsSplit:
    """Train and test tensors: images are float32 ``(N, 1, 8, 8)`` in [0, 1], labels int64."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def load_digits_split(test_fraction: float = 0.25, seed: int = 0) -> DigitsSplit:
    """Return a stratified train/test split of the digits as tensors.

    Raises ValueError unless ``0 < test_fraction < 1``.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be between 0 and 1, got {test_fraction!r}")
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(bunch.target, dtype=torch.int64)
    idx = torch.arange(len(labels)).numpy()
    train_idx, test_idx = train_test_split(
        idx, test_size=test_fraction, random_state=seed, stratify=labels.numpy()
    )
    train_t, test_t = torch.as_tensor(train_idx), torch.as_tensor(test_idx)
    return DigitsSplit(images[train_t], labels[train_t], images[test_t], labels[test_t])


def digits_loaders(
    batch_size: int = 64, test_fraction: float = 0.25, seed: int = 0
) -> tuple[DataLoader, DataLoader]:
    """Return (train, test) DataLoaders over the digits; the train loader shuffles reproducibly."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size!r}")
    split = load_digits_split(test_fraction, seed)
    gen = torch.Generator().manual_seed(seed)
    train = DataLoader(TensorDataset(split.x_train, split.y_train),
                       batch_size=batch_size, shuffle=True, generator=gen)
    test = DataLoader(TensorDataset(split.x_test, split.y_test), batch_size=batch_size)
    return train, test
