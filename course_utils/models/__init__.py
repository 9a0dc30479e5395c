"""Small models shared by the notebooks (compile, export, profiling, serving)."""

from .cnn import ResBlock, SmallResNet
from .gpt import GPTConfig, TinyGPT
from .mlp import MLP
from .transformer import TransformerBlock

__all__ = ["GPTConfig", "MLP", "ResBlock", "SmallResNet", "TinyGPT", "TransformerBlock"]
