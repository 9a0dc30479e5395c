"""What CPU profiles cannot fake, checked on an emulated AVX2 CPU (qemu's Haswell: no AVX-512, no VNNI).

Libraries that pick kernels from CPUID (ONNX Runtime's MLAS, the route of ``torch._int_mm``)
ignore the environment settings of the ``avx2`` profile, so these tests run small programs
under ``qemu-x86_64 -cpu Haswell``. ``.ci/run`` installs Debian's qemu-user; without it the
tests skip, saying so.
"""

from __future__ import annotations

import json
import logging
import platform
import shlex
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from course_utils import cpu
from course_utils.kit import cpu_profiles

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64" or shutil.which("qemu-x86_64") is None,
    reason="needs an x86-64 machine with qemu-x86_64 (Debian: apt-get install qemu-user) to emulate an AVX2 CPU",
)

def run_emulated(code: str, timeout: float = 600) -> str:
    """Run ``code`` in this environment's Python on the emulated Haswell CPU; return its stdout."""
    env = cpu_profiles.profile_env("haswell")
    out = subprocess.run([*shlex.split(env["COURSE_EMULATOR"]), sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=timeout, env=env, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_the_emulated_cpu_is_an_avx2_class_and_torch_int_mm_skips_onednn():
    facts = json.loads(run_emulated(
        "import json; from course_utils import cpu; i = cpu.info(); "
        "print(json.dumps({'cls': i.cpu_class, 'cap': i.torch_capability, 'onednn': cpu.onednn_report()}))"
    ).strip().splitlines()[-1])
    assert facts["cls"] == "x86-avx2" and facts["cap"] == "AVX2"
    # without AVX-512 VNNI torch computes int8 GEMMs in its own loop (notebook 08 explains the cost)
    assert facts["onednn"]["int_mm"].startswith("torch's own loop"), facts


@pytest.fixture(scope="module")
def digits_qdq(tmp_path_factory):
    """A briefly trained digits CNN as ONNX, statically quantized two ways, plus test images."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from course_utils.data import digits_loaders
    from course_utils.models import SmallResNet

    folder = tmp_path_factory.mktemp("qdq")
    torch.manual_seed(0)
    train, test = digits_loaders(batch_size=64)
    model = SmallResNet(width=32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(2):
        for images, labels in train:
            opt.zero_grad()
            F.cross_entropy(model(images), labels).backward()
            opt.step()
    model.eval()
    x_test = torch.cat([images for images, _ in test])
    calib = torch.cat([images for images, _ in train])[:512]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x_test[:8],), str(folder / "fp32.onnx"), dynamo=True, external_data=False,
                          verbose=False, input_names=["image"], output_names=["logits"],
                          dynamic_shapes=({0: torch.export.Dim("batch", max=4096)},))

    class Calibration(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(calib.split(64))

        def get_next(self):
            batch = next(self.batches, None)
            return None if batch is None else {"image": batch.numpy()}

    logging.disable(logging.WARNING)
    try:
        for name, reduce_range in (("full", False), ("reduced", True)):
            quantize_static(str(folder / "fp32.onnx"), str(folder / f"{name}.onnx"), Calibration(),
                            quant_format=QuantFormat.QDQ, per_channel=True, reduce_range=reduce_range,
                            weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
    finally:
        logging.disable(logging.NOTSET)
    np.save(folder / "x.npy", x_test.numpy())
    return folder


LOGITS = """
import sys, numpy as np, onnxruntime as ort
folder = sys.argv[1] if len(sys.argv) > 1 else {folder!r}
x = np.load(folder + "/x.npy")
out = {{n: ort.InferenceSession(f"{{folder}}/{{n}}.onnx", providers=["CPUExecutionProvider"]).run(None, {{"image": x}})[0]
        for n in ("full", "reduced")}}
np.savez(folder + "/{tag}.npz", **out)
"""


def test_onnx_runtime_u8s8_saturates_without_vnni_and_reduce_range_fixes_it(digits_qdq):
    folder = str(digits_qdq)
    subprocess.run([sys.executable, "-c", LOGITS.format(folder=folder, tag="native")], check=True, timeout=300)
    run_emulated(LOGITS.format(folder=folder, tag="haswell"))
    native, haswell = np.load(f"{folder}/native.npz"), np.load(f"{folder}/haswell.npz")
    scale = float(np.abs(native["full"]).max())
    # 7-bit weights: every u8 x s8 pair sum fits in int16, so AVX2 computes what VNNI computes
    assert np.abs(native["reduced"] - haswell["reduced"]).max() <= 1e-4 * scale
    if cpu.info().int8_dot:  # this machine adds in 32 bits; the emulated AVX2 path saturates 16-bit pairs
        assert np.abs(native["full"] - haswell["full"]).max() > 0.01 * scale
