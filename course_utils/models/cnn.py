"""Which convolutional network do the notebooks use? A small residual CNN for the 8x8 digits (``SmallResNet``)."""

from __future__ import annotations

import torch
from torch import nn


class ResBlock(nn.Module):
    """Two 3x3 conv + batch-norm layers with an identity shortcut; keeps shape."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``relu(x + bn2(conv2(relu(bn1(conv1(x))))))``."""
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + x)


class SmallResNet(nn.Module):
    """Stem conv, a residual block, 2x2 max-pool, another block, global pooling, linear head.

    Input ``(N, in_channels, H, W)`` with H, W >= 2 (the digits are 8x8); output logits ``(N, classes)``.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, width: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            ResBlock(width),
            nn.MaxPool2d(2),
            ResBlock(width),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return class logits for a batch of images."""
        return self.classifier(torch.flatten(self.features(x), 1))
