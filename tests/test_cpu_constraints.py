"""`make setup TORCH=cpu`'s plumbing (tools/cpu_constraints.py, and the Makefile lines once they are in):
torch's CPU-only builds at the tested versions, the CUDA build's own pins gone, everything else as tested.

PyTorch's CPU index is out of reach here, so pip is asked only what it would do with the files, against
folders of stand-in wheels; the Makefile is run with a stand-in Python that records what it was asked.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from course_utils import config

ROOT = config.REPO_ROOT
sys.path.insert(0, str(ROOT / "tools"))
try:
    import cpu_constraints as cc
finally:
    sys.path.remove(str(ROOT / "tools"))

TESTED = (ROOT / "constraints.txt").read_text(encoding="utf-8")
SMALL = "# pins\nnumpy==2.4.0\ntorch==2.14.1\nnvidia-cublas==13.1.1.3\ncuda-toolkit==13.0.3.0\ntriton==3.8.0\n" \
        "torchvision==0.29.1\ntorchaudio==2.11.1\ntorchao==0.18.0\n"


def pins(text: str) -> dict[str, str]:
    return cc._pins(text)


def test_the_torch_family_gets_its_cpu_builds_at_the_tested_versions():
    tested = pins(TESTED)
    family = cc.cpu_pins(TESTED)
    assert list(family) == ["torch", "torchvision", "torchaudio"]
    for name, version in family.items():
        assert version == tested[name].split("+")[0] + "+cpu"


def test_cpu_constraints_drop_only_the_cuda_builds_pins():
    out = cc.cpu_constraints(SMALL)
    assert pins(out) == {"numpy": "2.4.0", "torch": "2.14.1+cpu", "torchvision": "0.29.1+cpu",
                         "torchaudio": "2.11.1+cpu", "torchao": "0.18.0"}  # torchao is no torch build: kept
    tested, cpu = pins(TESTED), pins(cc.cpu_constraints(TESTED))
    dropped = set(tested) - set(cpu)
    assert dropped and all(n.startswith(("nvidia-", "cuda-", "triton")) for n in dropped), dropped
    assert {n: v for n, v in cpu.items() if n not in cc.TORCH_FAMILY} == {
        n: v for n, v in tested.items() if n not in cc.TORCH_FAMILY and n not in dropped}


def test_the_cpu_pins_refuse_pypis_cuda_build():
    """A resolver cannot keep or fetch PyPI's torch 2.14.1 (the CUDA build) under these pins."""
    for line in cc.torch_requirements(TESTED).splitlines()[1:]:
        req = Requirement(line)
        version = next(iter(req.specifier)).version
        assert req.specifier.contains(version) and not req.specifier.contains(version.split("+")[0])


def test_a_local_label_is_replaced_and_bad_input_is_a_clear_error():
    assert cc.cpu_version("2.14.1+cu130") == "2.14.1+cpu" and cc.cpu_version("2.14.1") == "2.14.1+cpu"
    with pytest.raises(ValueError, match="not a version"):
        cc.cpu_version("+cpu")
    with pytest.raises(ValueError, match="the constraints pin no torchvision, torchaudio"):
        cc.cpu_pins("torch==2.14.1\n")


def test_main_writes_both_files_and_prints_them(tmp_path, capsys):
    assert cc.main(["--dest", str(tmp_path / "out")], platform="linux") == 0
    req = (tmp_path / "out" / cc.REQUIREMENTS).read_text()
    assert "torch==2.14.1+cpu" in req.splitlines() and cc.CPU_INDEX in req
    assert (tmp_path / "out" / cc.CONSTRAINTS).read_text() == cc.cpu_constraints(TESTED)
    capsys.readouterr()
    assert cc.main(["--print"], platform="linux") == 0
    shown = capsys.readouterr().out
    assert f"## {cc.REQUIREMENTS}" in shown and f"## {cc.CONSTRAINTS}" in shown
    assert cc.main(["--constraints", str(tmp_path / "missing.txt")], platform="linux") == 1
    assert "cpu_constraints:" in capsys.readouterr().err


def test_macos_needs_no_cpu_build(capsys):
    assert cc.main(["--print"], platform="darwin") == 2
    assert "PyPI's torch wheel for macOS has no CUDA" in capsys.readouterr().err


# ---- pip reads the files as meant ---------------------------------------------------------------

def fake_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """Write a minimal (empty) wheel of ``name`` ``version`` into ``folder``; return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr(f"{dist}/METADATA", meta)
        whl.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{dist}/RECORD", "")
    return path


def pip_dry_run(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``pip install --dry-run --no-index`` with no pip configuration of this machine's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--disable-pip-version-check",
                           *args], capture_output=True, text=True, env=env, timeout=300)


def test_pip_takes_the_cpu_wheels_even_beside_the_cuda_ones(tmp_path):
    """An index holding both builds (as PyPI plus the CPU index would): the requirements pick +cpu."""
    dest = tmp_path / "files"
    cc.write(TESTED, dest)
    index = tmp_path / "index"
    family = cc.cpu_pins(TESTED)
    for name, version in family.items():
        fake_wheel(index, name, version)
        fake_wheel(index, name, version.split("+")[0])
    out = pip_dry_run("--no-deps", "--find-links", str(index), "-r", str(dest / cc.REQUIREMENTS))
    assert out.returncode == 0, out.stdout + out.stderr
    would = next(line for line in out.stdout.splitlines() if line.startswith("Would install"))
    assert sorted(would.split()[2:]) == sorted(f"{n}-{v}" for n, v in family.items())


@pytest.mark.skipif(importlib.metadata.version("torch") != pins(TESTED)["torch"],
                    reason="needs PyPI's torch at constraints.txt's version (make test-min has the floor, TORCH=cpu a CPU build)")
def test_under_the_cpu_constraints_an_installed_cuda_torch_does_not_count(tmp_path):
    """This environment's torch is PyPI's 2.14.1: it satisfies constraints.txt, but not the CPU file."""
    dest = tmp_path / "files"
    cc.write(TESTED, dest)
    empty = tmp_path / "empty"
    empty.mkdir()
    kept = pip_dry_run("--no-deps", "--find-links", str(empty), "-c", str(ROOT / "constraints.txt"), "torch")
    assert kept.returncode == 0 and "Requirement already satisfied: torch" in kept.stdout, kept.stdout + kept.stderr
    refused = pip_dry_run("--no-deps", "--find-links", str(empty), "-c", str(dest / cc.CONSTRAINTS), "torch")
    assert refused.returncode != 0, refused.stdout


# ---- the Makefile ---------------------------------------------------------------------------------

def run_make(makefile: Path, venv: Path, *args: str, dry: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``make`` on ``makefile`` in the checkout with ``VENV=venv``, whose Python only records its arguments."""
    return subprocess.run(["make", "--no-print-directory", "-f", str(makefile), f"VENV={venv}",
                           *(["-n"] if dry else []), *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def stand_in_venv(folder: Path) -> Path:
    """Make ``folder/bin/python``: a script that appends its arguments to ``folder/log`` and succeeds."""
    (folder / "bin").mkdir(parents=True)
    python = folder / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho "$*" >> "{folder}/log"\n')
    python.chmod(0o755)
    return folder


def check_makefile(makefile: Path, tmp_path: Path) -> None:
    """The TORCH=cpu lines: what `make -n setup TORCH=cpu` prints, the choice kept, a bad TORCH refused."""
    venv = stand_in_venv(tmp_path / "venv")
    dry = run_make(makefile, venv, "setup", "TORCH=cpu", dry=True)
    assert dry.returncode == 0, dry.stderr
    assert (f"{venv}/bin/python -m pip install --quiet --no-compile --no-deps --index-url https://download.pytorch.org/whl/cpu "
            "-r build/torch-cpu-requirements.txt") in dry.stdout
    assert f'{venv}/bin/python -m pip install --quiet --no-compile -c build/constraints-cpu.txt -e ".[dev]"' in dry.stdout
    assert "-c constraints.txt" not in dry.stdout
    assert run_make(makefile, venv, "setup", "TORCH=cpu").returncode == 0
    assert (venv / ".course-torch").read_text().strip() == "cpu"
    first = (venv / "log").read_text()
    assert "tools/cpu_constraints.py --dest build" in first and "--index-url https://download.pytorch.org/whl/cpu" in first
    assert run_make(makefile, venv, "setup").returncode == 0
    assert (venv / "log").read_text() == first, "a second `make setup` installed again"
    assert run_make(makefile, venv, "setup", "TORCH=default").returncode == 0
    assert "-c constraints.txt -e .[dev]" in (venv / "log").read_text()[len(first):]
    bad = run_make(makefile, venv, "setup", "TORCH=gpu")
    assert bad.returncode != 0 and "TORCH=gpu is not understood" in bad.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_make_setup_torch_cpu(tmp_path):
    makefile = ROOT / "Makefile"
    if "TORCH_CPU_INDEX" not in makefile.read_text(encoding="utf-8"):
        pytest.skip("the Makefile has no TORCH=cpu lines yet")
    check_makefile(makefile, tmp_path)
