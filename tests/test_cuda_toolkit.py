"""Finding the CUDA toolkit for AOTInductor's CUDA packages (course_utils.deploy.cuda_toolkit), on fake folder trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from course_utils.deploy import cuda_toolkit


def toolkit(root: Path, name: str, stub: bool = False) -> Path:
    home = root / name
    (home / "include").mkdir(parents=True)
    (home / "include" / "cuda.h").write_text("/* fake */\n")
    if stub:
        (home / "lib64" / "stubs").mkdir(parents=True)
        (home / "lib64" / "stubs" / "libcuda.so").write_text("")
    return home


def test_candidates_order_torch_guess_env_nvcc_then_versions_newest_first(tmp_path):
    for name in ("cuda-12.8", "cuda-13.0", "cuda-12.10"):
        (tmp_path / name).mkdir()
    real = tmp_path / "cuda-13.0" / "bin"
    real.mkdir()
    (real / "nvcc").write_text("")
    link = tmp_path / "nvcc"
    link.symlink_to(real / "nvcc")
    found = cuda_toolkit.candidates("/guess", {"CUDA_HOME": "/env", "CUDA_PATH": "/env"}, nvcc=str(link),
                                    roots=[tmp_path])
    assert found == [Path("/guess"), Path("/env"), tmp_path / "cuda-13.0", tmp_path / "cuda",
                     tmp_path / "cuda-12.10", tmp_path / "cuda-12.8"]


def test_a_wrong_guess_is_passed_over_for_the_folder_with_cuda_h(tmp_path):
    (tmp_path / "usr_local").mkdir()  # what torch guesses when nvcc is /usr/local/bin/nvcc: no cuda.h there
    home = toolkit(tmp_path, "cuda-13.0")
    assert cuda_toolkit.find_cuda_home([tmp_path / "usr_local", home]) == home
    assert cuda_toolkit.find_cuda_home([tmp_path / "usr_local"]) is None


def test_libcuda_prefers_the_drivers_dev_link_then_the_stub_then_a_link_to_so_1(tmp_path):
    home = toolkit(tmp_path, "cuda", stub=True)
    driver = tmp_path / "driver"
    driver.mkdir()
    (driver / "libcuda.so.1").write_text("")
    assert cuda_toolkit.libcuda_dir(home, listed=[driver / "libcuda.so.1"]) == home / "lib64" / "stubs"
    (driver / "libcuda.so").write_text("")
    assert cuda_toolkit.libcuda_dir(home, listed=[driver / "libcuda.so"]) == driver

    bare = toolkit(tmp_path, "bare")
    made = cuda_toolkit.libcuda_dir(bare, listed=[driver / "libcuda.so.1"], link_dir=tmp_path / "links")
    assert made == tmp_path / "links" and (made / "libcuda.so").resolve() == (driver / "libcuda.so.1").resolve()
    # a second call replaces the link instead of failing on it
    assert cuda_toolkit.libcuda_dir(bare, listed=[driver / "libcuda.so.1"], link_dir=tmp_path / "links") == made
    assert cuda_toolkit.libcuda_dir(bare, listed=[], link_dir=tmp_path / "none") is None


def test_prepare_points_torch_and_gcc_at_the_toolkit(tmp_path, monkeypatch):
    from torch.utils import cpp_extension

    home = toolkit(tmp_path, "cuda-13.0", stub=True)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", "/usr/local")
    monkeypatch.setattr(cuda_toolkit, "find_cuda_home", lambda: home)
    monkeypatch.setattr(cuda_toolkit, "_ldconfig_libcuda", lambda: [])
    monkeypatch.setenv("LIBRARY_PATH", "/already")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    assert cuda_toolkit.prepare() is None
    import os

    assert cpp_extension.CUDA_HOME == str(home) and os.environ["CUDA_HOME"] == str(home)
    assert os.environ["LIBRARY_PATH"] == os.pathsep.join([str(home / "lib64" / "stubs"), "/already"])
    assert cuda_toolkit.prepare() is None  # a second call does not add the folder twice
    assert os.environ["LIBRARY_PATH"].count("stubs") == 1


@pytest.mark.parametrize("home, words", [(None, "no CUDA toolkit headers"), ("bare", "no libcuda.so to link")])
def test_prepare_says_why_it_cannot(tmp_path, monkeypatch, home, words):
    from torch.utils import cpp_extension

    folder = toolkit(tmp_path, "bare") if home else None
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    monkeypatch.setattr(cuda_toolkit, "find_cuda_home", lambda: folder)
    monkeypatch.setattr(cuda_toolkit, "_ldconfig_libcuda", lambda: [])
    problem = cuda_toolkit.prepare()
    assert problem and words in problem
    assert cpp_extension.CUDA_HOME is None  # nothing changed
