"""A synthetic audio set for torchaudio examples, generated deterministically in memory.

Four classes, each a short clip: a steady tone, a rising chirp, white noise,
and a train of tone pulses. Frequencies, amplitudes and a little background
noise are drawn from a seeded generator, so the same arguments give the same set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

AUDIO_CLASSES = ("tone", "chirp", "noise", "pulses")


@dataclass(frozen=True)
class AudioSet:
    """Waveforms ``(N, samples)`` float32 in [-1, 1], int64 labels, class names, sample rate."""

    waveforms: torch.Tensor
    labels: torch.Tensor
    classes: tuple[str, ...]
    sample_rate: int


def _clip(kind: str, t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    def uniform(lo: float, hi: float) -> float:
        return lo + (hi - lo) * float(torch.rand((), generator=gen))

    if kind == "tone":
        return torch.sin(2 * math.pi * uniform(200, 1200) * t)
    if kind == "chirp":
        f0, f1 = uniform(150, 400), uniform(1200, 2500)
        duration = float(t[-1]) if len(t) > 1 else 1.0
        phase = 2 * math.pi * (f0 * t + (f1 - f0) * t**2 / (2 * duration))
        return torch.sin(phase)
    if kind == "noise":
        return torch.randn(t.shape, generator=gen).clamp(-3, 3) / 3
    if kind == "pulses":
        rate = uniform(4, 10)
        gate = (torch.sin(2 * math.pi * rate * t) > 0.3).float()
        return gate * torch.sin(2 * math.pi * uniform(300, 900) * t)
    raise ValueError(f"unknown audio class {kind!r}; known: {AUDIO_CLASSES}")


def synthetic_audio(
    n_per_class: int = 32, sample_rate: int = 8000, duration_s: float = 0.5, seed: int = 0
) -> AudioSet:
    """Return ``n_per_class`` clips of each class, shuffled reproducibly."""
    if n_per_class < 1:
        raise ValueError(f"n_per_class must be at least 1, got {n_per_class!r}")
    if sample_rate < 1000 or duration_s <= 0:
        raise ValueError("sample_rate must be >= 1000 Hz and duration_s > 0")
    gen = torch.Generator().manual_seed(seed)
    n_samples = int(sample_rate * duration_s)
    t = torch.arange(n_samples, dtype=torch.float32) / sample_rate
    waves, labels = [], []
    for label, kind in enumerate(AUDIO_CLASSES):
        for _ in range(n_per_class):
            amp = 0.3 + 0.6 * float(torch.rand((), generator=gen))
            clip = amp * _clip(kind, t, gen)
            clip = clip + 0.01 * torch.randn(n_samples, generator=gen)
            waves.append(clip.clamp(-1, 1))
            labels.append(label)
    order = torch.randperm(len(labels), generator=gen)
    return AudioSet(
        torch.stack(waves)[order].to(torch.float32),
        torch.tensor(labels, dtype=torch.int64)[order],
        AUDIO_CLASSES,
        sample_rate,
    )
