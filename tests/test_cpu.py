"""CPU classes, CPU profiles and the oneDNN probe (course_utils.cpu)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest
import torch

from course_utils import cpu
from course_utils.kit import cpu_profiles

AVX512_VNNI = {"avx2": True, "avx512_f": True, "avx512_vnni": True, "avx_vnni": True}


@pytest.mark.parametrize(
    ("arch", "caps", "capability", "system", "expected_class", "has_dot"),
    [
        ("x86_64", AVX512_VNNI, "AVX512", "linux", "x86-avx512-vnni", True),
        ("x86_64", {**AVX512_VNNI, "amx_tile": True, "amx_int8": True}, "AVX512", "linux", "x86-amx", True),
        ("x86_64", {"avx2": True, "avx512_f": True}, "AVX512", "linux", "x86-avx512", False),
        # the avx2 profile on an AVX-512 VNNI machine: the kernels see AVX2 only
        ("x86_64", AVX512_VNNI, "AVX2", "linux", "x86-avx2", False),
        # a laptop with AVX-VNNI but no AVX-512
        ("x86_64", {"avx2": True, "avx_vnni": True}, "AVX2", "win32", "x86-avx2-vnni", True),
        ("AMD64", {"avx2": True}, "AVX2", "win32", "x86-avx2", False),
        ("x86_64", {"avx2": True}, "DEFAULT", "linux", "x86-baseline", False),
        ("aarch64", {"asimddp": True}, "DEFAULT", "linux", "arm64", True),
        ("aarch64", {}, "DEFAULT", "linux", "arm64", False),
        ("arm64", {}, "DEFAULT", "darwin", "arm64-apple", True),
        ("riscv64", {}, "DEFAULT", "linux", "other", False),
    ],
)
def test_classify(arch, caps, capability, system, expected_class, has_dot):
    cls, dot = cpu.classify(arch, caps, capability, system=system)
    assert cls == expected_class
    assert (dot is not None) == has_dot


def test_a_profile_names_the_dot_product_set_it_hides_from_the_kernels():
    # The avx2 profile on an AVX-512 VNNI machine: ATen sees AVX2, but CPUID-driven libraries still see VNNI.
    dot = cpu.classify("x86_64", AVX512_VNNI, "AVX2")[1]
    hidden = cpu.hidden_int8_dot("x86_64", AVX512_VNNI, dot)
    assert dot is None and hidden == "AVX-512 VNNI (VPDPBUSD)"
    facts = cpu.CpuInfo(arch="x86_64", name="test", features=(), torch_capability="AVX2", profile="avx2",
                        cpu_class="x86-avx2", int8_dot=dot, hidden_int8_dot=hidden)
    assert "none in ATen, FBGEMM and Inductor (profile avx2)" in facts.line() and "AVX-512 VNNI" in facts.line()
    # Nothing hidden: the real CPU's set is the one torch sees, or it has none.
    assert cpu.hidden_int8_dot("x86_64", AVX512_VNNI, "AVX-512 VNNI (VPDPBUSD)") is None
    assert cpu.hidden_int8_dot("x86_64", {"avx2": True}, None) is None
    plain = cpu.CpuInfo(arch="x86_64", name="test", features=(), torch_capability="AVX2", profile=None,
                        cpu_class="x86-avx2", int8_dot=None)
    assert plain.int8_dot_text().startswith("none (int8 products go through 16-bit pairs")


def test_info_agrees_with_torch():
    facts = cpu.info()
    assert facts.torch_capability == torch.backends.cpu.get_cpu_capability()
    assert facts.cpu_class == cpu.classify(facts.arch, cpu.capabilities(), facts.torch_capability)[0]
    assert facts.cpu_class in facts.line() and facts.torch_capability in facts.line()
    if platform.machine() == "x86_64":
        assert "avx2" in cpu.capabilities()  # cpuinfo reads the flags on every x86-64 Linux CPU


def test_profile_env_applies_and_rejects_unknown_names():
    env = cpu_profiles.profile_env("avx2", base={"PATH": "/bin"})
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and "ONEDNN_MAX_CPU_ISA" not in env
    assert env["COURSE_CPU_PROFILE"] == "avx2" and env["PATH"] == "/bin"
    with pytest.raises(ValueError, match="unknown CPU profile 'avx3'.*avx2"):
        cpu_profiles.profile_env("avx3")


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the avx2 profile is for x86-64 CPUs")
def test_avx2_profile_caps_torch_in_a_child_process():
    code = ("import torch; from course_utils import cpu; "
            "print(torch.backends.cpu.get_cpu_capability(), cpu.info().cpu_class, cpu.info().profile)")
    out = subprocess.run([sys.executable, "-m", "course_utils", "cpu", "--profile", "avx2", "--",
                          sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    last = out.stdout.strip().splitlines()[-1].split()
    if cpu.capabilities().get("avx2"):
        assert last == ["AVX2", "x86-avx2", "avx2"]


def test_profile_command_reports_errors(capsys):
    assert cpu_profiles.main(["--profile", "avx2", "--", "/nonexistent/command"]) == 127
    assert "cannot run" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cpu_profiles.main(["--profile", "avx2"])  # no command
    with pytest.raises(SystemExit):
        cpu_profiles.main(["--profile", "sse9", "--", "true"])


def test_exit_status_of_the_command_is_returned():
    assert cpu_profiles.main(["--profile", "avx2", "--", sys.executable, "-c", "raise SystemExit(3)"]) == 3


@pytest.mark.skipif(platform.machine() != "x86_64", reason="oneDNN's verbose ISA line is checked on x86-64")
def test_onednn_report_names_the_isa_and_follows_the_profile(monkeypatch):
    native = cpu.onednn_report()
    assert native["isa"] not in ("", "not reported") and "Intel" not in native["isa"], native
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    capped = cpu.onednn_report()
    assert "AVX-512" not in capped["isa"] and "AVX2" in capped["isa"], capped


def test_classify_only_returns_declared_classes():
    seen = {cpu.classify(arch, caps, cap, system=system)[0]
            for arch in ("x86_64", "aarch64", "arm64", "riscv64")
            for caps in ({}, {"avx2": True, "avx_vnni": True}, {"avx512_f": True, "amx_tile": True}, AVX512_VNNI)
            for cap in ("AVX512", "AVX2", "DEFAULT") for system in ("linux", "darwin")}
    assert seen <= set(cpu.CLASSES)


def test_per_class_ranges_name_known_classes():
    import json

    from course_utils import config
    from course_utils.kit import report

    ranges = json.loads((config.data_dir() / report.RANGES_FILE).read_text())["expected"]
    for name, entry in ranges.items():
        for key in entry:
            if key.startswith("cpu:"):
                assert key[4:] in cpu.CLASSES, f"{name}: unknown CPU class in {key!r}"
                lo, hi = entry[key]
                assert lo <= hi, name


@pytest.mark.parametrize(("caps", "arch", "word"), [
    ({"avx2": True}, "x86_64", "AVX2 kernels"),
    ({"avx2": True, "avx_vnni": True}, "x86_64", "AVX-VNNI"),
    (AVX512_VNNI, "x86_64", "AVX-512 VNNI"),
    ({"avx2": True, "avx512_f": True, "amx_tile": True}, "x86_64", "AMX"),
    ({"asimddp": True}, "aarch64", "dot-product"),
])
def test_onnxruntime_kernel_family_follows_the_flags(caps, arch, word):
    assert word in cpu.onnxruntime_kernels(caps, arch)


@pytest.mark.parametrize(("caps", "arch", "word"), [
    ({"avx2": True}, "x86_64", "AVX2"),
    (AVX512_VNNI, "x86_64", "AVX-512 float"),
    ({"avx2": True, "avx512_f": True, "amx_tile": True}, "x86_64", "AVX-512 float"),
    ({}, "x86_64", "SSE"),
    ({"asimddp": True}, "aarch64", "NEON"),
])
def test_onnxruntime_float_kernel_family_follows_the_flags(caps, arch, word):
    said = cpu.onnxruntime_kernels(caps, arch, dtype="float32")
    assert word in said and "VNNI" not in said and "AMX" not in said


def test_onnxruntime_kernels_refuses_an_unknown_dtype():
    with pytest.raises(ValueError, match="dtype must be"):
        cpu.onnxruntime_kernels({}, "x86_64", dtype="fp8")


def test_l2_cache_size_is_plausible_where_known():
    size = cpu.l2_cache_bytes()
    assert size == 0 or 64 * 1024 <= size <= 64 * 2**20


def test_last_level_cache_reads_the_highest_data_cache_linux_lists(tmp_path):
    from course_utils.cpu import last_level_cache

    for i, (level, kind, size) in enumerate([("1", "Data", "48K"), ("1", "Instruction", "32K"),
                                             ("2", "Unified", "2048K"), ("3", "Unified", "105M")]):
        folder = tmp_path / f"index{i}"
        folder.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (folder / name).write_text(value + "\n")
    assert last_level_cache(tmp_path) == (3, 105 * 2**20)
    (tmp_path / "index3" / "size").write_text("odd\n")  # unreadable sizes are skipped, not guessed
    assert last_level_cache(tmp_path) == (2, 2048 * 2**10)
    assert last_level_cache(tmp_path / "missing") is None  # macOS, Windows: nothing listed


@pytest.mark.parametrize("profile, emulator, expected", [
    ("", "", None),                                    # the real CPU, no profile
    ("avx2", "", "avx2"),                              # settings only: oneDNN and ORT still see the real CPU
    ("haswell", "qemu-x86_64 -cpu Haswell", None),     # emulated: every library sees the emulated CPU
])
def test_settings_only_profile_names_a_profile_only_where_libraries_still_see_the_real_cpu(
        monkeypatch, profile, emulator, expected):
    monkeypatch.setenv("COURSE_CPU_PROFILE", profile)
    monkeypatch.setenv("COURSE_EMULATOR", emulator)
    assert cpu.settings_only_profile() == expected
