import pytest
import torch
from torch import nn

from course_utils import size
from course_utils.models import GPTConfig, TinyGPT


def test_serialized_size_tracks_dtype():
    model = nn.Linear(256, 256)
    fp32 = size.serialized_bytes(model)
    assert fp32 > 256 * 257 * 4  # the raw numbers plus a small header
    assert fp32 < 256 * 257 * 4 * 1.1
    half = size.serialized_bytes(model.to(torch.float16))
    assert half == pytest.approx(fp32 / 2, rel=0.1)
    assert size.serialized_mb(model) == pytest.approx(half / 1e6)


def test_serialized_size_of_state_dict_and_file(tmp_path):
    model = nn.Linear(8, 8)
    path = tmp_path / "m.pt"
    torch.save(model.state_dict(), path)
    assert size.serialized_bytes(path) == path.stat().st_size
    assert size.serialized_bytes(model.state_dict()) == size.serialized_bytes(model)


def test_serialized_size_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError):
        size.serialized_bytes(tmp_path / "missing.pt")
    with pytest.raises(TypeError, match="module, a state dict or a path"):
        size.serialized_bytes(42)


def test_count_parameters_counts_tied_weights_once():
    gpt = TinyGPT(GPTConfig(vocab_size=10, block_size=4, n_layer=1, n_head=1, n_embd=8))
    unique = sum(p.numel() for p in gpt.parameters())
    assert size.count_parameters(gpt) == unique
    lin = nn.Linear(3, 2)
    lin.bias.requires_grad_(False)
    assert size.count_parameters(lin) == 8
    assert size.count_parameters(lin, trainable_only=True) == 6
    with pytest.raises(TypeError):
        size.count_parameters("model")


def test_parameter_dtypes():
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    dtypes = size.parameter_dtypes(model)
    assert dtypes["float32"] == 6 + 4 + 4  # linear, bn affine, bn running stats
    assert dtypes["int64"] == 1  # num_batches_tracked


def test_torchao_int8_weights_are_measured_inside_inference_mode():
    quant = pytest.importorskip("torchao.quantization")
    model = nn.Sequential(nn.Linear(256, 256))
    fp32 = size.serialized_bytes(model)
    quant.quantize_(model, quant.Int8WeightOnlyConfig())
    with torch.inference_mode():
        int8 = size.serialized_bytes(model)
    assert int8 < 0.4 * fp32
