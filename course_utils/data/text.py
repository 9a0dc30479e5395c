"""A small English text corpus and a character tokenizer for the tiny GPT.

The corpus is built from the help topics that ship with Python itself
(``pydoc_data.topics``, the Python reference manual, PSF licence), kept as
``data/tiny_corpus.txt`` so every Python version trains on the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from .. import config
from .files import DataFileError, expected_checksums, malformed, malformed_content, sha256_of, verify

CORPUS_FILE = "tiny_corpus.txt"
#: Upper bound on the corpus size in characters (whole topics are kept).
CORPUS_MAX_CHARS = 300_000


def build_corpus_text(max_chars: int = CORPUS_MAX_CHARS) -> str:
    """Return corpus text made from ``pydoc_data.topics``: ASCII only, whole topics, sorted by name."""
    from pydoc_data.topics import topics

    parts: list[str] = []
    total = 0
    for key in sorted(topics):
        text = topics[key].replace("\t", "    ").encode("ascii", "ignore").decode("ascii")
        text = "\n".join(line.rstrip() for line in text.strip().splitlines())
        if total + len(text) + 2 > max_chars:
            break
        parts.append(text)
        total += len(text) + 2
    return "\n\n".join(parts) + "\n"


def rebuild_corpus() -> str:
    """Rebuild ``data/tiny_corpus.txt`` from this Python's docs and return a status line.

    Refuses to overwrite when this Python generates different text from the
    shipped file (other Python versions revise their docs): raises DataFileError.
    """
    text = build_corpus_text()
    path = config.data_dir() / CORPUS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="ascii")
    expected = expected_checksums().get(CORPUS_FILE)
    got = sha256_of(tmp)
    if expected is not None and got != expected:
        tmp.unlink()
        raise DataFileError(
            CORPUS_FILE,
            "this Python's documentation gives different text from the shipped corpus",
            f"restore the shipped file with `git checkout -- data/{CORPUS_FILE}` "
            "(the corpus was made with Python 3.11.7)",
        )
    tmp.replace(path)
    return f"wrote {path} ({len(text):,} characters, sha256 {got[:12]}...)"


def load_corpus() -> str:
    """Return the course's text corpus, after verifying its checksum.

    Raises DataFileError when the file is missing, altered, or not non-empty ASCII text.
    """
    path = verify(CORPUS_FILE)
    expected = "non-empty ASCII text"
    with malformed_content(CORPUS_FILE, expected):
        text = path.read_text(encoding="ascii")
    if not text.strip():
        raise malformed(CORPUS_FILE, expected, f"{len(text)} characters of blank text")
    return text


@dataclass(frozen=True)
class CharTokenizer:
    """Maps characters to integer ids and back; the vocabulary is fixed at creation."""

    chars: str

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """Return a tokenizer whose vocabulary is the sorted set of characters in ``text``."""
        if not text:
            raise ValueError("cannot build a vocabulary from empty text")
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        """Return the number of distinct characters."""
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        """Return the ids of ``text``; raises ValueError naming any character not in the vocabulary."""
        index = {ch: i for i, ch in enumerate(self.chars)}
        unknown = sorted({ch for ch in text if ch not in index})
        if unknown:
            shown = ", ".join(repr(ch) for ch in unknown[:10])
            raise ValueError(f"characters not in the vocabulary: {shown}")
        return [index[ch] for ch in text]

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        """Return the text for ``ids``; raises ValueError for an id outside the vocabulary."""
        if isinstance(ids, torch.Tensor):
            ids = ids.flatten().tolist()
        out = []
        for i in ids:
            if not 0 <= int(i) < len(self.chars):
                raise ValueError(f"token id {i} is outside the vocabulary (0..{len(self.chars) - 1})")
            out.append(self.chars[int(i)])
        return "".join(out)

    def to_dict(self) -> dict[str, str]:
        """Return a JSON-friendly form, for storing beside a checkpoint."""
        return {"chars": self.chars}

    @classmethod
    def from_dict(cls, state: dict[str, str]) -> CharTokenizer:
        """Return the tokenizer stored by ``to_dict``."""
        return cls(state["chars"])


def char_lm_split(
    val_fraction: float = 0.1, text: str | None = None
) -> tuple[CharTokenizer, torch.Tensor, torch.Tensor]:
    """Return (tokenizer, train ids, validation ids) for character language modelling.

    The validation part is the tail of the corpus, so no text leaks between them.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be between 0 and 1, got {val_fraction!r}")
    text = load_corpus() if text is None else text
    tok = CharTokenizer.from_text(text)
    ids = torch.tensor(tok.encode(text), dtype=torch.long)
    cut = int(len(ids) * (1.0 - val_fraction))
    return tok, ids[:cut], ids[cut:]


def random_batch(
    ids: torch.Tensor | Sequence[int], batch_size: int, block_size: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return inputs and next-character targets, each ``(batch_size, block_size)``, from random offsets."""
    ids = torch.as_tensor(ids, dtype=torch.long)
    if len(ids) <= block_size:
        raise ValueError(f"need more than block_size={block_size} tokens, got {len(ids)}")
    starts = torch.randint(0, len(ids) - block_size, (batch_size,), generator=generator)
    x = torch.stack([ids[s:s + block_size] for s in starts.tolist()])
    y = torch.stack([ids[s + 1:s + 1 + block_size] for s in starts.tolist()])
    return x, y
