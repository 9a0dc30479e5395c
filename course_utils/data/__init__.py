"""The course's offline data sets. Nothing here touches the network.

- ``digits``: scikit-learn's 8x8 handwritten digits (shipped inside scikit-learn).
- ``text``: a character corpus from Python's own documentation, with a tokenizer.
- ``audio``: a deterministic synthetic set of tones, chirps, noise and pulses.
- ``retrieval``: a course-written set of questions and passages to score sentence embeddings.
- ``files``: the files in ``data/``, checked against their recorded sha256.
"""

from .audio import AUDIO_CLASSES, AudioSet, synthetic_audio
from .digits import DigitsSplit, digits_loaders, load_digits_split
from .files import DataFileError, shipped_files, verify
from .retrieval import (RetrievalScores, RetrievalSet, evaluate, load_retrieval_set,
                        ranking_agreement, ranking_margin, relevance_margin, similarity)
from .text import CharTokenizer, char_lm_split, load_corpus, random_batch

__all__ = [
    "AUDIO_CLASSES",
    "AudioSet",
    "CharTokenizer",
    "DataFileError",
    "DigitsSplit",
    "char_lm_split",
    "digits_loaders",
    "load_corpus",
    "load_digits_split",
    "random_batch",
    "ranking_agreement",
    "ranking_margin",
    "relevance_margin",
    "similarity",
    "evaluate",
    "load_retrieval_set",
    "RetrievalScores",
    "RetrievalSet",
    "shipped_files",
    "synthetic_audio",
    "verify",
]
