"""Models shared by the notebooks, each with its loader: small ones built here, and all-MiniLM-L6-v2
(pretrained, loaded offline from an installed wheel; ``transformers`` is imported only when it is loaded).

- ``mlp``: ``MLP``, a multi-layer perceptron (GELU, LayerNorm).
- ``cnn``: ``SmallResNet`` and its ``ResBlock``, for the 8x8 digits.
- ``transformer``: ``TransformerBlock``, whose one attention takes a KV cache and returns what it adds.
- ``gpt``: ``TinyGPT`` (the character-level GPT) and its KV-cache decoding: ``KVCache``, ``prefill``,
  ``decode_step``/``decode_core``, ``greedy_steps``, ``generate_cached``, ``pad_prompts``.
- ``checkpoint``: the tiny GPT's checkpoint format and ``load_tiny_gpt`` (the shipped ``data/tiny_gpt.pt``).
- ``minilm``: ``load_minilm``, ``MiniLM`` and ``SentenceEncoder`` (all-MiniLM-L6-v2).
"""

from .checkpoint import load_tiny_gpt
from .cnn import ResBlock, SmallResNet
from .gpt import GPTConfig, TinyGPT
from .minilm import MiniLM, MiniLMUnavailable, SentenceEncoder, load_minilm
from .mlp import MLP
from .transformer import TransformerBlock

__all__ = ["GPTConfig", "MLP", "MiniLM", "MiniLMUnavailable", "SentenceEncoder", "load_minilm", "load_tiny_gpt",
           "ResBlock", "SmallResNet", "TinyGPT", "TransformerBlock"]
