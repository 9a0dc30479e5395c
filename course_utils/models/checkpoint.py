"""How is the tiny GPT stored and loaded? Its checkpoint format (``FORMAT``, the one place that
spells it: the trainer writes it, the loader checks it) and ``load_tiny_gpt``, which reads the
shipped ``data/tiny_gpt.pt`` or another file with ``weights_only=True``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..data.files import PARSE_ERRORS, load_tensors, malformed
from ..data.text import CharTokenizer
from .gpt import GPTConfig, TinyGPT

#: The shipped checkpoint, in ``data/``.
CHECKPOINT_FILE = "tiny_gpt.pt"
#: What a checkpoint's ``"format"`` entry says; the loader refuses any other.
FORMAT = "course_utils.tiny_gpt/1"
KEYS = ("format", "config", "state_dict", "tokenizer")


def _read(path: str | Path | None) -> tuple[dict[str, Any], Callable[[str, str], Exception]]:
    """Return the saved dict and how to report a bad part of it: DataFileError for the shipped
    file (restore it from git), ValueError naming the file for one given by ``path``."""
    if path is None:
        ckpt = load_tensors(CHECKPOINT_FILE, KEYS)
        return ckpt, lambda expected, found: malformed(CHECKPOINT_FILE, expected, found)
    file = Path(path)

    def bad(expected: str, found: str) -> ValueError:
        return ValueError(f"{file} is not a tiny GPT checkpoint: expected {expected}, found {found}")

    try:
        ckpt = torch.load(file, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except PARSE_ERRORS as err:
        raise bad("a file written by torch.save", f"{type(err).__name__}: {str(err).strip().splitlines()[0][:160]}") from err
    if not isinstance(ckpt, dict) or any(k not in ckpt for k in KEYS):
        found = f"keys {sorted(map(str, ckpt))}" if isinstance(ckpt, dict) else f"a {type(ckpt).__name__}"
        raise bad(f"a dict with keys {', '.join(KEYS)}", found)
    return ckpt, bad


def load_tiny_gpt(path: str | Path | None = None) -> tuple[TinyGPT, CharTokenizer]:
    """Return the trained ``TinyGPT`` (eval mode, CPU) and its ``CharTokenizer``.

    Without ``path`` the shipped file is checked against ``data/SHA256SUMS`` first. The file
    is read with ``torch.load(weights_only=True)``: only tensors and plain containers, no code.
    A damaged or foreign file gives one clear error (``DataFileError`` for the shipped file,
    ``ValueError`` for another), never a raw ``KeyError`` or shape ``RuntimeError``.
    """
    ckpt, bad = _read(path)
    if ckpt.get("format") != FORMAT:
        raise bad(f"format {FORMAT!r}", repr(ckpt.get("format"))[:80])
    try:
        config = GPTConfig(**ckpt["config"])
        model = TinyGPT(config)
    except PARSE_ERRORS as err:
        raise bad("a config of GPTConfig's fields", f"{type(err).__name__}: {err}") from err
    try:
        missing, unexpected = model.load_state_dict(ckpt["state_dict"], strict=False)
    except PARSE_ERRORS as err:  # shapes that do not fit the config
        raise bad("weights shaped as the config says", str(err).strip().splitlines()[-1][:200]) from err
    if unexpected or set(missing) - {"head.weight"}:
        raise bad("TinyGPT's weights", f"missing {missing}, unexpected {unexpected}")
    try:
        tokenizer = CharTokenizer.from_dict(ckpt["tokenizer"])
        tokenizer.encode(tokenizer.decode(list(range(tokenizer.vocab_size))))  # usable both ways
    except PARSE_ERRORS as err:
        raise bad("a character tokenizer", f"{type(err).__name__}: {err}") from err
    if tokenizer.vocab_size != config.vocab_size:
        raise bad(f"a tokenizer of {config.vocab_size} characters (the model's vocabulary)",
                  f"{tokenizer.vocab_size}")
    return model.eval(), tokenizer
