"""The course's device code on a real CUDA GPU (skipped, saying why, without one).

``tests/test_device.py`` fakes every accelerator; these tests need the real thing and run in the GPU
check (``python -m course_utils.kit.gpu_check``, ``make gpu-check``): the device choice and its
description, the memory figure, the timing helpers' synchronisation, Inductor writing Triton for a
CUDA tensor, and the course's tiny GPT giving the CPU's logits on the GPU.
"""

from __future__ import annotations

import pytest
import torch

from course_utils import bench, compat, device

pytestmark = pytest.mark.skipif(not device.has_cuda(), reason="needs a CUDA GPU (run by the GPU check)")


def test_course_device_cuda_is_the_gpu_and_is_described(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "cuda")
    assert device.get_device().type == "cuda"
    text = device.accelerator_description()
    assert text.startswith(("CUDA: ", "ROCm/HIP: ")), text
    if not device.is_rocm():
        assert "(sm_" in text and device.torch_build().startswith("CUDA ")
    memory = device.accelerator_memory()
    assert memory is not None and memory.total_bytes > 2**30


def test_a_timing_covers_the_gpu_work_it_queued():
    """A large matrix product queued on the GPU: synchronised timing sees its cost, not a launch."""
    x = torch.randn(4096, 4096, device="cuda")
    small = bench.time_fn(lambda: x[:64, :64] @ x[:64, :64], label="small", min_run_time=0.1)
    large = bench.time_fn(lambda: x @ x @ x @ x, label="large", min_run_time=0.1)
    assert large.median_s > 2 * small.median_s, (large, small)
    device.synchronize("cuda")


def test_inductor_writes_triton_for_a_cuda_tensor_and_matches_eager():
    def chain(t: torch.Tensor) -> torch.Tensor:
        return torch.relu(t * 2 + 1).sin()

    torch._dynamo.reset()
    x = torch.randn(1024, 1024, device="cuda")
    out, code = compat.run_and_get_code(torch.compile(chain), x)
    torch.testing.assert_close(out, chain(x))
    assert any("triton" in c for c in code), "Inductor wrote no Triton kernel for a CUDA tensor"


def test_the_tiny_gpt_gives_the_cpu_logits_on_the_gpu():
    from course_utils.models.checkpoint import load_tiny_gpt

    model, tok = load_tiny_gpt()
    model.eval()
    idx = torch.arange(24).unsqueeze(0) % tok.vocab_size  # (1, 24) token ids
    with torch.inference_mode():
        cpu = model(idx)
        gpu = model.to("cuda")(idx.to("cuda")).cpu()
    torch.testing.assert_close(gpu, cpu, atol=2e-3, rtol=2e-3)


def test_compat_answers_on_this_torch():
    found = compat.features()
    assert found and all(isinstance(v, bool) for v in found.values())
