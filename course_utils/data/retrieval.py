"""A small labelled retrieval set, written for the course, to measure embedding quality.

``data/retrieval_set.json`` holds short passages on everyday topics and
questions, each with the id of the passage that answers it. When a notebook
changes the sentence encoder (export, ONNX, quantization) it checks that the
new model still finds the right passages and ranks them as the original does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .files import malformed, malformed_content, verify

RETRIEVAL_FILE = "retrieval_set.json"
#: The layout ``load_retrieval_set`` needs, as its errors name it.
RETRIEVAL_LAYOUT = ('a JSON object whose "passages" is a non-empty list of {"id": string, "text": string} '
                    'and whose "queries" is a non-empty list of {"text": string, "relevant": '
                    'a non-empty list of passage ids}')

#: A function from a list of texts to a (len(texts), dim) tensor of normalised embeddings.
EmbedFn = Callable[[Sequence[str]], torch.Tensor]


@dataclass(frozen=True)
class RetrievalSet:
    """Passages (ids and texts) and queries with the ids of their relevant passages."""

    passage_ids: list[str]
    passages: list[str]
    queries: list[str]
    relevant: list[set[str]]

    def relevant_index(self) -> list[set[int]]:
        """Return, per query, the positions of its relevant passages in ``passages``."""
        where = {pid: i for i, pid in enumerate(self.passage_ids)}
        return [{where[p] for p in rel} for rel in self.relevant]


@dataclass(frozen=True)
class RetrievalScores:
    """Recall@1, recall@3 and mean reciprocal rank over the queries (all in [0, 1])."""

    recall_at_1: float
    recall_at_3: float
    mrr: float


def _entries(raw: Any, key: str, fields: dict[str, type]) -> list[dict[str, Any]]:
    """Return ``raw[key]`` after checking it is a non-empty list of objects whose ``fields``
    have the given types; DataFileError naming the first entry that does not."""
    items = raw.get(key) if isinstance(raw, dict) else None
    if not isinstance(items, list) or not items:
        found = f"a {type(raw).__name__}" if not isinstance(raw, dict) else f"{key!r}: {str(items)[:60]}"
        raise malformed(RETRIEVAL_FILE, RETRIEVAL_LAYOUT, found)
    for n, item in enumerate(items):
        for field, kind in fields.items():
            if not isinstance(item, dict) or not isinstance(item.get(field), kind):
                raise malformed(RETRIEVAL_FILE, RETRIEVAL_LAYOUT,
                                f"{key}[{n}] = {str(item)[:60]} without a {kind.__name__} {field!r}")
    return items


def _relevant(queries: list[dict[str, Any]], ids: list[str]) -> list[set[str]]:
    """Return each query's set of relevant passage ids, checked against the passages' ``ids``."""
    relevant = []
    for n, q in enumerate(queries):
        rel = q["relevant"]
        if not rel or not all(isinstance(pid, str) for pid in rel):
            raise malformed(RETRIEVAL_FILE, RETRIEVAL_LAYOUT, f"queries[{n}] relevant = {str(rel)[:60]}")
        relevant.append(set(rel))
    unknown = set().union(*relevant) - set(ids)
    if unknown:
        raise malformed(RETRIEVAL_FILE, "queries whose relevant ids are passage ids",
                        f"unknown passages {sorted(unknown)}")
    return relevant


def load_retrieval_set() -> RetrievalSet:
    """Load and check ``data/retrieval_set.json`` (sha256 verified, layout and ids consistent).

    Raises DataFileError naming the file, what was expected and how to restore it.
    """
    path = verify(RETRIEVAL_FILE)
    with malformed_content(RETRIEVAL_FILE, "UTF-8 JSON"):
        raw = json.loads(path.read_text(encoding="utf-8"))
    passages = _entries(raw, "passages", {"id": str, "text": str})
    queries = _entries(raw, "queries", {"text": str, "relevant": list})
    ids = [p["id"] for p in passages]
    if len(set(ids)) != len(ids):
        duplicates = sorted({pid for pid in ids if ids.count(pid) > 1})
        raise malformed(RETRIEVAL_FILE, "unique passage ids", f"duplicates {duplicates}")
    return RetrievalSet(passage_ids=ids, passages=[p["text"] for p in passages],
                        queries=[q["text"] for q in queries], relevant=_relevant(queries, ids))


def similarity(query_emb: torch.Tensor, passage_emb: torch.Tensor) -> torch.Tensor:
    """Cosine similarity matrix (queries × passages) of two sets of embeddings."""
    if query_emb.ndim != 2 or passage_emb.ndim != 2 or query_emb.shape[1] != passage_emb.shape[1]:
        raise ValueError(f"need two 2-D embedding matrices of equal width, got "
                         f"{tuple(query_emb.shape)} and {tuple(passage_emb.shape)}")
    q = torch.nn.functional.normalize(query_emb.float(), dim=-1)
    p = torch.nn.functional.normalize(passage_emb.float(), dim=-1)
    return q @ p.T


def score(sims: torch.Tensor, data: RetrievalSet) -> RetrievalScores:
    """Score a (queries × passages) similarity matrix against the labels."""
    if sims.shape != (len(data.queries), len(data.passages)):
        raise ValueError(f"similarity matrix has shape {tuple(sims.shape)}, expected "
                         f"{(len(data.queries), len(data.passages))}")
    order = sims.argsort(dim=1, descending=True).tolist()
    hits1 = hits3 = 0
    rr = 0.0
    for ranked, rel in zip(order, data.relevant_index()):
        first = next(rank for rank, idx in enumerate(ranked) if idx in rel)
        hits1 += first == 0
        hits3 += first < 3
        rr += 1.0 / (first + 1)
    n = len(order)
    return RetrievalScores(recall_at_1=hits1 / n, recall_at_3=hits3 / n, mrr=rr / n)


def evaluate(embed: EmbedFn, data: RetrievalSet | None = None) -> RetrievalScores:
    """Embed the passages and queries with ``embed`` and score the retrieval."""
    data = data or load_retrieval_set()
    return score(similarity(embed(data.queries), embed(data.passages)), data)


def ranking_agreement(sims_a: torch.Tensor, sims_b: torch.Tensor, k: int = 3) -> float:
    """Fraction of queries whose top-``k`` passages (in order) are the same under both models."""
    if sims_a.shape != sims_b.shape:
        raise ValueError(f"shapes differ: {tuple(sims_a.shape)} vs {tuple(sims_b.shape)}")
    if not 1 <= k <= sims_a.shape[1]:
        raise ValueError(f"k must be between 1 and {sims_a.shape[1]}, got {k}")
    top_a = sims_a.topk(k, dim=1).indices
    top_b = sims_b.topk(k, dim=1).indices
    return (top_a == top_b).all(dim=1).float().mean().item()


def ranking_margin(sims: torch.Tensor, k: int = 3) -> float:
    """Smallest gap between neighbouring scores in any query's top ``k`` + 1 passages.

    Two passages swap places only if their scores move towards each other by more than the gap
    between them, so a change of every score by less than half this margin leaves every query's
    top ``k`` (in order) as it was. ``k`` equal to the number of passages covers the full order.
    """
    if sims.ndim != 2 or sims.shape[1] < 2:
        raise ValueError(f"need a (queries x passages) matrix with at least 2 passages, got {tuple(sims.shape)}")
    if not 1 <= k <= sims.shape[1]:
        raise ValueError(f"k must be between 1 and {sims.shape[1]}, got {k}")
    top = sims.float().topk(min(k + 1, sims.shape[1]), dim=1).values
    return (top[:, :-1] - top[:, 1:]).min().item()


def relevance_margin(sims: torch.Tensor, data: RetrievalSet) -> float:
    """Smallest gap between a relevant passage's score and a non-relevant passage's score.

    Recall and MRR depend only on where each query's relevant passages rank among the others, so
    a change of every score by less than half this margin leaves them exactly as they were.
    """
    if sims.shape != (len(data.queries), len(data.passages)):
        raise ValueError(f"similarity matrix has shape {tuple(sims.shape)}, expected "
                         f"{(len(data.queries), len(data.passages))}")
    gaps = []
    for row, rel in zip(sims.float(), data.relevant_index()):
        others = [j for j in range(len(row)) if j not in rel]
        if others:
            gaps.append((row[list(rel)][:, None] - row[others][None, :]).abs().min())
    if not gaps:
        raise ValueError("every passage is relevant to every query: nothing can change rank")
    return torch.stack(gaps).min().item()
