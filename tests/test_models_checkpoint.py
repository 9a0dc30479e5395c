"""The shipped tiny GPT checkpoint: safe loading, integrity, and text a reader recognises."""

import re

import pytest
import torch

from course_utils.data import DataFileError, load_corpus
from course_utils.data.files import REBUILD_COMMANDS, verify
from course_utils.models.checkpoint import load_tiny_gpt


def test_checkpoint_is_shipped_small_and_loads_with_weights_only():
    path = verify("tiny_gpt.pt")
    assert path.stat().st_size < 5_000_000
    raw = torch.load(path, weights_only=True)
    assert raw["format"] == "course_utils.tiny_gpt/1" and raw["train"]["seed"] == 0
    model, tok = load_tiny_gpt()
    assert model.config.block_size >= 512 and tok.vocab_size == model.config.vocab_size
    assert not model.training
    assert "tiny_gpt.pt" in REBUILD_COMMANDS


def test_sampled_text_is_mostly_real_words():
    model, tok = load_tiny_gpt()
    words = set(re.findall(r"[a-z]+", load_corpus().lower()))
    gen = torch.Generator().manual_seed(0)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ids = model.generate(torch.tensor([tok.encode("The ")] * 4), 120, temperature=0.7, generator=gen)
    finally:
        torch.set_num_threads(old)
    found = [w for row in ids for w in re.findall(r"[a-z]+", tok.decode(row).lower()) if len(w) > 1]
    known = sum(w in words for w in found) / len(found)
    assert len(found) > 40 and known > 0.6, (known, tok.decode(ids[0]))


def test_a_corrupt_or_foreign_file_is_refused(tmp_path, monkeypatch):
    bad = tmp_path / "other.pt"
    torch.save({"format": "something else"}, bad)
    with pytest.raises(ValueError, match="not a tiny GPT checkpoint"):
        load_tiny_gpt(bad)
    (tmp_path / "SHA256SUMS").write_text("0" * 64 + "  tiny_gpt.pt\n")
    (tmp_path / "tiny_gpt.pt").write_bytes(b"tampered")
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    with pytest.raises(DataFileError, match="python tools/train_tiny_gpt.py"):
        load_tiny_gpt()


def _checkpoint() -> dict:
    return torch.load(verify("tiny_gpt.pt"), weights_only=True)


def _damaged():
    """(name, change to the saved dict, words the error must contain) for damage a checksum cannot see."""
    def wrong_shape(ck):
        name = next(iter(ck["state_dict"]))
        ck["state_dict"][name] = torch.zeros(3, 3)

    return [
        ("missing key", lambda ck: ck.pop("tokenizer"), "tokenizer"),
        ("bad config", lambda ck: ck["config"].update(no_such_field=1), "config"),
        ("wrong shape", wrong_shape, "weights shaped"),
        ("bad tokenizer", lambda ck: ck.update(tokenizer={"chars": 5}), "tokenizer"),
        ("wrong vocabulary", lambda ck: ck.update(tokenizer={**ck["tokenizer"], "chars": "ab"}), "characters"),
    ]


@pytest.mark.parametrize("name, damage, words", _damaged(), ids=[d[0] for d in _damaged()])
def test_a_damaged_checkpoint_gets_one_clear_error(data_copy, replace_data_file, name, damage, words):
    """Shipped file with its checksum line updated (DataFileError with the fix), or a file passed by path (ValueError)."""
    import io

    ck = _checkpoint()
    damage(ck)
    buf = io.BytesIO()
    torch.save(ck, buf)
    replace_data_file("tiny_gpt.pt", buf.getvalue())
    with pytest.raises(ValueError, match=words) as by_path:
        load_tiny_gpt(data_copy / "tiny_gpt.pt")
    assert "not a tiny GPT checkpoint" in str(by_path.value) and not isinstance(by_path.value, DataFileError)
    with pytest.raises(DataFileError, match=words) as shipped:
        load_tiny_gpt()
    assert "git checkout -- data/tiny_gpt.pt" in str(shipped.value)


def test_a_truncated_checkpoint_by_path_gets_a_clear_error(tmp_path):
    half = tmp_path / "half.pt"
    raw = verify("tiny_gpt.pt").read_bytes()
    half.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="expected a file written by torch.save"):
        load_tiny_gpt(half)
