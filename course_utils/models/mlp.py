"""What is the plain network the notebooks start from? A multi-layer perceptron with GELU and LayerNorm."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """``depth`` hidden layers of Linear -> LayerNorm -> GELU, then a Linear output layer."""

    def __init__(self, in_features: int, hidden: int, out_features: int, depth: int = 2) -> None:
        super().__init__()
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.LayerNorm(hidden), nn.GELU()]
            width = hidden
        layers.append(nn.Linear(width, out_features))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the output for inputs whose last dimension is ``in_features``."""
        return self.net(x)
