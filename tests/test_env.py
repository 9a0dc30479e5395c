import torch

from course_utils.kit import env


def test_report_lists_versions_hardware_and_toolchain():
    rows = env.report()
    for key in ("python", "torch", "torchvision", "torchaudio", "onnx", "onnxruntime", "cpu",
                "cores", "torch threads", "cuda", "inductor c++"):
        assert key in rows, key
    assert rows["torch"] == env.package_version("torch")
    assert rows["torch threads"] == str(torch.get_num_threads())
    assert rows["cuda"] == "none" or "sm_" in rows["cuda"]


def test_format_report_has_one_line_per_row():
    rows = {"a": "1", "longer key": "2"}
    text = env.format_report(rows)
    assert text.splitlines() == ["a           1", "longer key  2"]


def test_package_version_of_missing_package_is_none():
    assert env.package_version("no-such-package-for-the-course") is None
