import socket

import pytest
import torch

from course_utils.data import (AUDIO_CLASSES, CharTokenizer, DataFileError, char_lm_split,
                               digits_loaders, load_corpus, load_digits_split, random_batch,
                               shipped_files, synthetic_audio, verify)
from course_utils.data import text as text_mod


def test_network_is_blocked_while_loading():
    """Every test here runs under the no_network fixture; make sure it is really active."""
    from conftest import NetworkBlocked

    with pytest.raises(NetworkBlocked):
        socket.getaddrinfo("pypi.org", 443)
    sock = socket.socket()
    try:
        with pytest.raises(NetworkBlocked):
            sock.connect(("192.0.2.1", 9))  # never sent: the guard raises first
    finally:
        sock.close()


def test_digits_split_shapes_and_ranges():
    split = load_digits_split()
    assert split.x_train.shape[1:] == (1, 8, 8) and split.x_train.dtype == torch.float32
    assert len(split.x_train) + len(split.x_test) == 1797
    assert 0.0 <= split.x_train.min() and split.x_train.max() <= 1.0
    assert set(split.y_test.tolist()) == set(range(10))  # stratified: every class in test


def test_digits_split_is_reproducible_and_disjoint():
    a, b = load_digits_split(seed=3), load_digits_split(seed=3)
    assert torch.equal(a.x_test, b.x_test)
    train = {tuple(x.flatten().tolist()) for x in a.x_train}
    overlap = sum(tuple(x.flatten().tolist()) in train for x in a.x_test)
    assert overlap < 10  # the data set has a few duplicate images, nothing more


def test_digits_loaders():
    train, test = digits_loaders(batch_size=32)
    xb, yb = next(iter(train))
    assert xb.shape == (32, 1, 8, 8) and yb.shape == (32,)
    assert sum(len(y) for _, y in test) == len(load_digits_split().y_test)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.5])
def test_digits_bad_fraction(bad):
    with pytest.raises(ValueError, match="test_fraction"):
        load_digits_split(test_fraction=bad)


def test_shipped_files_verify():
    assert "tiny_corpus.txt" in shipped_files()
    for name in shipped_files():
        assert verify(name).exists()


def test_corpus_is_ascii_english_and_sized():
    text = load_corpus()
    assert 100_000 < len(text) <= text_mod.CORPUS_MAX_CHARS
    assert text.isascii() and "assert" in text


def test_missing_file_names_it_and_the_fix(data_copy):
    (data_copy / "tiny_corpus.txt").unlink()
    with pytest.raises(DataFileError) as info:
        load_corpus()
    msg = str(info.value)
    assert "data/tiny_corpus.txt" in msg and "missing" in msg
    assert "git checkout -- data/tiny_corpus.txt" in msg
    assert "python -m course_utils data rebuild" in msg


def test_corrupt_file_is_detected(data_copy):
    path = data_copy / "tiny_corpus.txt"
    path.write_text(path.read_text()[:-10] + "corrupted!")
    with pytest.raises(DataFileError, match="corrupt: sha256"):
        load_corpus()


def test_rebuild_restores_a_corrupt_corpus(data_copy):
    path = data_copy / "tiny_corpus.txt"
    original = path.read_bytes()
    path.write_text("oops")
    try:
        status = text_mod.rebuild_corpus()
    except DataFileError as err:  # another Python's docs give other text: must say so
        assert "git checkout" in str(err)
        assert path.read_text() == "oops"  # nothing overwritten
        return
    assert "wrote" in status and path.read_bytes() == original


def test_unknown_shipped_name():
    with pytest.raises(DataFileError, match="not a shipped file"):
        verify("nope.bin")


def test_tokenizer_round_trip_and_errors():
    tok = CharTokenizer.from_text("hello world")
    assert tok.vocab_size == len(set("hello world"))
    assert tok.decode(tok.encode("low hello")) == "low hello"
    assert tok.decode(torch.tensor(tok.encode("he"))) == "he"
    with pytest.raises(ValueError, match="'z'"):
        tok.encode("zebra")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([99])
    assert CharTokenizer.from_dict(tok.to_dict()) == tok
    with pytest.raises(ValueError, match="empty"):
        CharTokenizer.from_text("")


def test_char_lm_split_and_batches():
    tok, train, val = char_lm_split(val_fraction=0.1)
    assert tok.vocab_size > 50
    assert len(val) == pytest.approx(0.1 * (len(train) + len(val)), abs=1)
    gen = torch.Generator().manual_seed(0)
    x, y = random_batch(train, batch_size=4, block_size=16, generator=gen)
    assert x.shape == y.shape == (4, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are inputs shifted by one
    with pytest.raises(ValueError, match="block_size"):
        random_batch(torch.arange(5), 2, 8)


def test_synthetic_audio_is_deterministic_and_balanced():
    a = synthetic_audio(n_per_class=5, seed=1)
    b = synthetic_audio(n_per_class=5, seed=1)
    assert torch.equal(a.waveforms, b.waveforms) and torch.equal(a.labels, b.labels)
    assert a.waveforms.shape == (5 * len(AUDIO_CLASSES), a.sample_rate // 2)
    assert torch.bincount(a.labels).tolist() == [5] * len(AUDIO_CLASSES)
    assert a.waveforms.abs().max() <= 1.0
    assert not torch.equal(a.waveforms, synthetic_audio(n_per_class=5, seed=2).waveforms)


def test_synthetic_audio_classes_are_learnable_with_torchaudio():
    """A linear classifier on log-mel features separates the classes: the set is usable for teaching."""
    import torchaudio
    from sklearn.linear_model import LogisticRegression

    train = synthetic_audio(n_per_class=20, seed=0)
    test = synthetic_audio(n_per_class=10, seed=1)
    mel = torchaudio.transforms.MelSpectrogram(sample_rate=train.sample_rate, n_mels=32)

    def features(waves):
        spec = torch.log(mel(waves) + 1e-6)  # (N, mels, frames)
        spec = spec - spec.mean(dim=(1, 2), keepdim=True)  # loudness-invariant
        energy = spec.logsumexp(1)  # per frame: steady for tones, gated for pulses
        return torch.cat([spec.mean(-1), spec.std(-1), energy.std(-1, keepdim=True)], dim=1).numpy()

    clf = LogisticRegression(max_iter=2000).fit(features(train.waveforms), train.labels.numpy())
    assert clf.score(features(test.waveforms), test.labels.numpy()) > 0.9


def test_synthetic_audio_bad_input():
    with pytest.raises(ValueError):
        synthetic_audio(n_per_class=0)
    with pytest.raises(ValueError):
        synthetic_audio(sample_rate=10)


# --- a file that matches its checksum but not the format the loader expects (issue 15, item 6) ---


def _assert_names_file_and_fix(err: DataFileError, name: str) -> None:
    msg = str(err)
    assert f"data/{name}" in msg and f"git checkout -- data/{name}" in msg and "expected" in msg, msg


@pytest.mark.parametrize("content", ["caf\u00e9 au lait\n".encode(), b"\xff\xfe\x00binary", b"", b"\n  \n"])
def test_a_corpus_that_is_not_ascii_text_is_reported(data_copy, content, replace_data_file):
    replace_data_file("tiny_corpus.txt", content)
    with pytest.raises(DataFileError) as info:
        load_corpus()
    _assert_names_file_and_fix(info.value, "tiny_corpus.txt")


BAD_RETRIEVAL_SETS = {
    "not json": b"{not json",
    "not utf-8": b'{"passages": "\xff"}',
    "a list": b"[]",
    "no queries": b'{"passages": [{"id": "p", "text": "t"}]}',
    "passages not a list": b'{"passages": 5, "queries": []}',
    "passage without text": b'{"passages": [{"id": "p"}], "queries": [{"text": "q", "relevant": ["p"]}]}',
    "passage not an object": b'{"passages": ["p"], "queries": [{"text": "q", "relevant": ["p"]}]}',
    "text not a string": b'{"passages": [{"id": "p", "text": 5}], "queries": [{"text": "q", "relevant": ["p"]}]}',
    "relevant not a list": b'{"passages": [{"id": "p", "text": "t"}], "queries": [{"text": "q", "relevant": 5}]}',
    "relevant unhashable": b'{"passages": [{"id": "p", "text": "t"}], "queries": [{"text": "q", "relevant": [[1]]}]}',
    "no relevant passage": b'{"passages": [{"id": "p", "text": "t"}], "queries": [{"text": "q", "relevant": []}]}',
    "no passages": b'{"passages": [], "queries": []}',
    "no queries at all": b'{"passages": [{"id": "p", "text": "t"}], "queries": []}',
    "unknown passage": b'{"passages": [{"id": "p", "text": "t"}], "queries": [{"text": "q", "relevant": ["z"]}]}',
    "duplicate ids": (b'{"passages": [{"id": "p", "text": "t"}, {"id": "p", "text": "u"}],'
                      b' "queries": [{"text": "q", "relevant": ["p"]}]}'),
}


@pytest.mark.parametrize("case", sorted(BAD_RETRIEVAL_SETS))
def test_a_malformed_retrieval_set_is_reported(data_copy, case, replace_data_file):
    from course_utils.data import load_retrieval_set

    replace_data_file("retrieval_set.json", BAD_RETRIEVAL_SETS[case])
    with pytest.raises(DataFileError) as info:
        load_retrieval_set()
    _assert_names_file_and_fix(info.value, "retrieval_set.json")


def test_a_minimal_well_formed_retrieval_set_loads(data_copy, replace_data_file):
    from course_utils.data import load_retrieval_set

    replace_data_file("retrieval_set.json",
                              b'{"passages": [{"id": "p", "text": "t"}], "queries": [{"text": "q", "relevant": ["p"]}]}')
    data = load_retrieval_set()
    assert data.passage_ids == ["p"] and data.relevant == [{"p"}]


@pytest.mark.parametrize("line", ["justonefield", "nothex  tiny_corpus.txt", "abc123  tiny_corpus.txt"])
def test_a_malformed_checksum_line_is_reported(data_copy, line):
    sums = data_copy / "SHA256SUMS"
    sums.write_text(sums.read_text() + line + "\n")
    with pytest.raises(DataFileError) as info:
        load_corpus()
    msg = str(info.value)
    assert "data/SHA256SUMS" in msg and "line 4" in msg and "git checkout -- data/SHA256SUMS" in msg


def test_a_truncated_tensor_file_is_reported(data_copy, replace_data_file):
    from course_utils.data.files import load_tensors

    original = (data_copy / "tiny_gpt.pt").read_bytes()
    replace_data_file("tiny_gpt.pt", original[: len(original) // 2])
    with pytest.raises(DataFileError) as info:
        load_tensors("tiny_gpt.pt", ("state_dict",))
    _assert_names_file_and_fix(info.value, "tiny_gpt.pt")
    assert "git checkout -- data/tiny_gpt.pt data/SHA256SUMS" in str(info.value)  # both were changed


def test_a_tensor_file_with_the_wrong_keys_or_type_is_reported(data_copy, replace_data_file):
    import io

    from course_utils.data.files import load_tensors

    for saved, problem in (({"weights": torch.zeros(2)}, "state_dict"), (torch.zeros(2), "Tensor")):
        buf = io.BytesIO()
        torch.save(saved, buf)
        replace_data_file("tiny_gpt.pt", buf.getvalue())
        with pytest.raises(DataFileError, match=problem) as info:
            load_tensors("tiny_gpt.pt", ("format", "state_dict"))
        _assert_names_file_and_fix(info.value, "tiny_gpt.pt")


def test_the_shipped_tensor_file_loads_with_its_keys():
    from course_utils.data.files import load_tensors

    ckpt = load_tensors("tiny_gpt.pt", ("format", "config", "state_dict", "tokenizer"))
    assert isinstance(ckpt["state_dict"], dict)
