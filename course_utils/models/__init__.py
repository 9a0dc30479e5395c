"""Models shared by the notebooks: small ones built here, and all-MiniLM-L6-v2 (pretrained,
loaded offline from an installed wheel; ``transformers`` is imported only when it is loaded)."""

from .cnn import ResBlock, SmallResNet
from .gpt import GPTConfig, TinyGPT
from .minilm import MiniLM, MiniLMUnavailable, SentenceEncoder, load_minilm
from .mlp import MLP
from .transformer import TransformerBlock

__all__ = ["GPTConfig", "MLP", "MiniLM", "MiniLMUnavailable", "SentenceEncoder", "load_minilm", "ResBlock",
           "SmallResNet", "TinyGPT", "TransformerBlock"]
