"""The pretrained sentence encoder: intact weights, offline loading, correct pooling."""

from __future__ import annotations

import pytest
import torch

from course_utils.models import minilm


@pytest.fixture(scope="module")
def mini() -> minilm.MiniLM:
    return minilm.load_minilm()


def test_weights_match_the_recorded_sha256():
    assert minilm.verify_weights() == minilm.WEIGHTS_SHA256


def test_recorded_sha256_is_the_one_in_data_readme():
    from course_utils import config

    assert minilm.WEIGHTS_SHA256 in (config.data_dir() / "README.md").read_text()


def test_altered_weights_are_refused(tmp_path, monkeypatch):
    fake = tmp_path / "model.safetensors"
    fake.write_bytes(b"not the weights")
    monkeypatch.setattr(minilm, "weights_path", lambda: fake)
    with pytest.raises(minilm.MiniLMUnavailable, match="reinstall"):
        minilm.verify_weights()


def test_missing_package_gives_the_install_command(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(minilm.MiniLMUnavailable, match="make setup"):
        minilm.model_dir()


def test_model_shape_size_and_normalised_output(mini):
    n_params = sum(p.numel() for p in mini.model.parameters())
    assert 22_000_000 < n_params < 23_000_000
    emb = mini.encode(["The cat sat on the mat.", "Stock prices fell sharply today."])
    assert emb.shape == (2, minilm.EMBED_DIM)
    torch.testing.assert_close(emb.norm(dim=-1), torch.ones(2))


def test_embeddings_do_not_depend_on_padding(mini):
    short = "Short."
    alone = mini.encode([short])
    padded = mini.encode([short, "A much longer sentence that forces a lot of padding onto the short one."])[:1]
    torch.testing.assert_close(alone, padded, atol=1e-5, rtol=1e-5)


def test_similar_sentences_score_higher(mini):
    emb = mini.encode(["How do I bake bread?", "A recipe for baking a loaf of bread.",
                       "The stock market closed lower."])
    assert emb[0] @ emb[1] > emb[0] @ emb[2] + 0.3


def test_matches_sentence_transformers(mini):
    st = pytest.importorskip("sentence_transformers")
    ref_model = st.SentenceTransformer(str(minilm.model_dir()), device="cpu")
    sentences = ["Offline models are handy.", "PyTorch compiles graphs with Inductor."]
    ref = ref_model.encode(sentences, convert_to_tensor=True)
    torch.testing.assert_close(mini.encode(sentences), ref.cpu(), atol=1e-5, rtol=1e-4)


def test_tokenize_rejects_bad_input(mini):
    with pytest.raises(TypeError, match="list of sentences"):
        mini.tokenize("one string")
    with pytest.raises(ValueError, match="at least one"):
        mini.tokenize([])
    with pytest.raises(TypeError, match="str"):
        mini.tokenize(["ok", 3])
    ids, mask = mini.tokenize(["pad me"], pad_to=16)
    assert ids.shape == mask.shape == (1, 16) and ids.dtype == torch.int64


def test_encode_accepts_a_replacement_model(mini):
    calls = []

    def fake(ids, mask):
        calls.append(ids.shape[0])
        return torch.zeros(ids.shape[0], minilm.EMBED_DIM)

    out = mini.encode(["a", "b", "c"], batch_size=2, model=fake)
    assert out.shape == (3, minilm.EMBED_DIM) and calls == [2, 1]
    with pytest.raises(ValueError, match="batch_size"):
        mini.encode(["a"], batch_size=0)
