"""Load the tiny GPT checkpoint shipped in ``data/tiny_gpt.pt`` (``weights_only=True``)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..data.files import verify
from ..data.text import CharTokenizer
from ..models.gpt import GPTConfig, TinyGPT

CHECKPOINT_FILE = "tiny_gpt.pt"
FORMAT = "course_utils.tiny_gpt/1"


def load_tiny_gpt(path: str | Path | None = None) -> tuple[TinyGPT, CharTokenizer]:
    """Return the trained ``TinyGPT`` (eval mode, CPU) and its ``CharTokenizer``.

    Without ``path`` the shipped file is checked against ``data/SHA256SUMS`` first. The file
    is read with ``torch.load(weights_only=True)``: only tensors and plain containers, no code.
    """
    file = verify(CHECKPOINT_FILE) if path is None else Path(path)
    ckpt = torch.load(file, map_location="cpu", weights_only=True)
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise ValueError(f"{file} is not a tiny GPT checkpoint (expected format {FORMAT!r})")
    config = GPTConfig(**ckpt["config"])
    model = TinyGPT(config)
    missing, unexpected = model.load_state_dict(ckpt["state_dict"], strict=False)
    if unexpected or set(missing) - {"head.weight"}:
        raise ValueError(f"{file}: state dict does not fit TinyGPT (missing {missing}, unexpected {unexpected})")
    tokenizer = CharTokenizer.from_dict(ckpt["tokenizer"])
    if tokenizer.vocab_size != config.vocab_size:
        raise ValueError(f"{file}: tokenizer has {tokenizer.vocab_size} characters, model {config.vocab_size}")
    return model.eval(), tokenizer
