"""The course's retrieval set and its metrics."""

from __future__ import annotations

import pytest
import torch

from course_utils.data import retrieval


@pytest.fixture(scope="module")
def data() -> retrieval.RetrievalSet:
    return retrieval.load_retrieval_set()


def test_set_is_consistent(data):
    assert len(data.passages) == len(data.passage_ids) >= 30
    assert len(data.queries) == len(data.relevant) >= 20
    assert all(rel for rel in data.relevant)
    assert all(len(idx) == len(rel) for idx, rel in zip(data.relevant_index(), data.relevant))


def test_perfect_and_worst_rankings_score_as_expected(data):
    n_q, n_p = len(data.queries), len(data.passages)
    perfect = torch.zeros(n_q, n_p)
    for q, idx in enumerate(data.relevant_index()):
        perfect[q, list(idx)] = 1.0
    s = retrieval.score(perfect, data)
    assert (s.recall_at_1, s.recall_at_3, s.mrr) == (1.0, 1.0, 1.0)
    worst = -perfect
    s = retrieval.score(worst, data)
    assert s.recall_at_1 == 0.0 and s.mrr < 0.1


def test_score_rejects_wrong_shape(data):
    with pytest.raises(ValueError, match="expected"):
        retrieval.score(torch.zeros(2, 2), data)


def test_similarity_is_cosine():
    a = torch.tensor([[3.0, 0.0]])
    b = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    torch.testing.assert_close(retrieval.similarity(a, b), torch.tensor([[1.0, 0.0]]))
    with pytest.raises(ValueError, match="equal width"):
        retrieval.similarity(a, torch.zeros(2, 3))


def test_ranking_agreement():
    sims = torch.tensor([[0.9, 0.5, 0.1], [0.2, 0.8, 0.4]])
    assert retrieval.ranking_agreement(sims, sims, k=2) == 1.0
    swapped = torch.tensor([[0.9, 0.5, 0.1], [0.8, 0.2, 0.4]])
    assert retrieval.ranking_agreement(sims, swapped, k=1) == 0.5
    with pytest.raises(ValueError, match="k must be"):
        retrieval.ranking_agreement(sims, sims, k=4)


def test_evaluate_with_a_keyword_embedder(data):
    """A bag-of-words embedder does worse than perfect but far better than chance."""
    vocab = sorted({w for t in data.passages + data.queries for w in t.lower().split()})
    where = {w: i for i, w in enumerate(vocab)}

    def embed(texts):
        out = torch.zeros(len(texts), len(vocab))
        for r, t in enumerate(texts):
            for w in t.lower().split():
                out[r, where[w]] = 1.0
        return out

    s = retrieval.evaluate(embed, data)
    assert 1 / len(data.passages) < s.mrr < 1.0


def test_corrupt_file_is_reported(tmp_path, monkeypatch):
    from course_utils import config
    from course_utils.data import DataFileError

    (tmp_path / "SHA256SUMS").write_text((config.data_dir() / "SHA256SUMS").read_text())
    (tmp_path / retrieval.RETRIEVAL_FILE).write_text("{}")
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    with pytest.raises(DataFileError, match="corrupt"):
        retrieval.load_retrieval_set()


def test_ranking_margin_is_the_closest_pair_within_the_top_k_plus_one():
    sims = torch.tensor([[0.9, 0.5, 0.48, 0.1], [0.2, 0.8, 0.4, 0.19]])
    # top 2 + 1: row 0 gaps 0.4, 0.02; row 1 gaps 0.4, 0.2; the full order adds 0.38 and 0.01
    assert retrieval.ranking_margin(sims, k=2) == pytest.approx(0.02)
    assert retrieval.ranking_margin(sims, k=1) == pytest.approx(0.4)
    assert retrieval.ranking_margin(sims, k=4) == pytest.approx(0.01)  # the full order
    # a change of every score below half the margin keeps the top k, as the docstring says
    noise = (torch.rand_like(sims) * 2 - 1) * 0.0099
    assert retrieval.ranking_agreement(sims, sims + noise, k=2) == 1.0
    with pytest.raises(ValueError, match="k must be"):
        retrieval.ranking_margin(sims, k=5)
    with pytest.raises(ValueError, match="at least 2 passages"):
        retrieval.ranking_margin(torch.zeros(3))


def test_relevance_margin_ignores_gaps_between_relevant_passages(data):
    n_q, n_p = len(data.queries), len(data.passages)
    sims = torch.zeros(n_q, n_p)
    for q, idx in enumerate(data.relevant_index()):
        sims[q, list(idx)] = 0.5
        sims[q, next(j for j in range(n_p) if j not in idx)] = 0.3  # closest non-relevant passage
    assert retrieval.relevance_margin(sims, data) == pytest.approx(0.2)
    noise = (torch.rand_like(sims) * 2 - 1) * 0.099
    assert retrieval.score(sims + noise, data) == retrieval.score(sims, data)
    with pytest.raises(ValueError, match="expected"):
        retrieval.relevance_margin(torch.zeros(2, 2), data)
