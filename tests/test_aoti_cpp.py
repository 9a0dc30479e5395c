"""The C++ AOTInductor loader: the tensor file format, the toolchain check, a real build and run."""

import os
import sys

import pytest
import torch

from course_utils.deploy import aoti_cpp
from course_utils.models import MLP


def test_tensor_file_round_trip(tmp_path):
    for t in (torch.randn(3, 5), torch.arange(6.0).reshape(1, 2, 3), torch.tensor(2.5), torch.empty(0, 4)):
        back = aoti_cpp.read_tensor(aoti_cpp.write_tensor(tmp_path / "t.bin", t))
        assert back.dtype == torch.float32 and back.shape == t.shape
        torch.testing.assert_close(back, t, rtol=0, atol=0)


def test_malformed_tensor_file_is_refused(tmp_path):
    (tmp_path / "bad.bin").write_bytes(b"NOTATENSOR")
    with pytest.raises(ValueError, match="not a tensor file"):
        aoti_cpp.read_tensor(tmp_path / "bad.bin")
    path = aoti_cpp.write_tensor(tmp_path / "cut.bin", torch.randn(4, 4))
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(ValueError, match="needs 64 bytes"):
        aoti_cpp.read_tensor(path)


def test_missing_cmake_gives_a_clear_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no cmake, no compiler
    reason = aoti_cpp.toolchain_problem()
    assert reason is not None and "cmake was not found" in reason and "install" in reason.lower()
    with pytest.raises(aoti_cpp.CppToolchainMissing, match="cmake"):
        aoti_cpp.build_loader(tmp_path / "build")


def test_missing_compiler_gives_a_clear_reason(monkeypatch, tmp_path):
    cmake = aoti_cpp.find_tools()["cmake"] if aoti_cpp.toolchain_problem() is None else None
    if cmake is None:
        pytest.skip("cmake is not installed here")
    (tmp_path / "cmake").symlink_to(cmake)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    assert "no C++ compiler" in aoti_cpp.toolchain_problem()


def test_loader_env_puts_the_wheel_lib_first():
    env = aoti_cpp.loader_env({"EXTRA": "1"})
    var = "DYLD_LIBRARY_PATH" if sys.platform == "darwin" else "LD_LIBRARY_PATH"
    assert env[var].split(os.pathsep)[0] == str(aoti_cpp.torch_lib_dir())
    assert env["EXTRA"] == "1"
    assert (aoti_cpp.torch_lib_dir()).is_dir()


@pytest.fixture(scope="module")
def small_package(tmp_path_factory):
    torch.manual_seed(0)
    model = MLP(16, 32, 4, depth=1).eval()
    x = torch.randn(3, 16)
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(model, (x,), dynamic_shapes={"x": {0: batch}})
    path = tmp_path_factory.mktemp("aoti") / "mlp.pt2"
    torch._inductor.aoti_compile_and_package(ep, package_path=str(path))
    return model, path


@pytest.mark.skipif(aoti_cpp.toolchain_problem() is not None, reason="no cmake or C++ compiler here")
def test_real_build_matches_python(tmp_path, small_package):
    model, package = small_package
    build = aoti_cpp.build_loader()
    assert build.binary.exists() and os.access(build.binary, os.X_OK)
    again = aoti_cpp.build_loader()
    assert not again.rebuilt, "a binary newer than its sources must not be rebuilt"
    runner = torch._inductor.aoti_load_package(str(package))
    for batch in (1, 5):
        x = torch.randn(batch, 16)
        out_cpp = aoti_cpp.run_loader(build.binary, package, x, work_dir=tmp_path)
        with torch.inference_mode():
            out_py = runner(x)
        assert out_cpp.shape == (batch, 4)
        torch.testing.assert_close(out_cpp, out_py, rtol=0, atol=1e-5)
        torch.testing.assert_close(out_cpp, model(x).detach(), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(aoti_cpp.toolchain_problem() is not None, reason="no cmake or C++ compiler here")
def test_loader_failure_is_reported(tmp_path, small_package):
    _, package = small_package
    build = aoti_cpp.build_loader()
    with pytest.raises(aoti_cpp.LoaderFailed, match="aoti_loader"):
        aoti_cpp.run_loader(build.binary, tmp_path / "missing.pt2", torch.randn(2, 16), work_dir=tmp_path)


# --- concurrent runs sharing a work folder (issue 15, item 6) ---

FAKE_LOADER = """#!{python}
# Stands in for the C++ loader: waits, reads its input tensor file, writes 2 * input + 1 (or fails).
# Plain Python (no torch import), so it starts fast; the file format is aoti_cpp's.
import struct
import sys
import time

package, src, dst = sys.argv[1:4]
if package.endswith("fail.pt2"):
    sys.exit("fake loader: cannot load " + package)
time.sleep(0.5)  # long enough for a second call to overwrite a shared input file
data = open(src, "rb").read()
(ndim,) = struct.unpack_from("<q", data, 8)
offset = 16 + 8 * ndim
values = struct.unpack(f"<{{(len(data) - offset) // 4}}f", data[offset:])
with open(dst, "wb") as fh:
    fh.write(data[:offset] + struct.pack(f"<{{len(values)}}f", *(2 * v + 1 for v in values)))
"""


@pytest.fixture
def fake_loader(tmp_path):
    """A script with the C++ loader's command line, so run_loader is tested without a build."""
    if sys.platform == "win32":
        pytest.skip("the fake loader is a script with a #! line")
    path = tmp_path / "bin" / "fake_loader"
    path.parent.mkdir()
    path.write_text(FAKE_LOADER.format(python=sys.executable))
    path.chmod(0o755)
    return path


def test_concurrent_runs_in_one_work_folder_each_get_their_own_output(tmp_path, fake_loader):
    from concurrent.futures import ThreadPoolExecutor

    work = tmp_path / "work"
    inputs = [torch.full((2, 3), float(i)) for i in range(4)]
    with ThreadPoolExecutor(len(inputs)) as pool:
        outs = list(pool.map(lambda x: aoti_cpp.run_loader(fake_loader, tmp_path / "m.pt2", x, work_dir=work),
                             inputs))
    for x, out in zip(inputs, outs):
        torch.testing.assert_close(out, x * 2 + 1, rtol=0, atol=0)
    assert list(work.iterdir()) == [], "run_loader left files behind"


def test_a_failed_run_leaves_no_files_behind(tmp_path, fake_loader):
    work = tmp_path / "work"
    with pytest.raises(aoti_cpp.LoaderFailed, match="cannot load"):
        aoti_cpp.run_loader(fake_loader, tmp_path / "fail.pt2", torch.ones(2), work_dir=work)
    assert list(work.iterdir()) == []


def test_a_timed_out_run_leaves_no_files_behind(tmp_path, fake_loader):
    import subprocess

    work = tmp_path / "work"
    with pytest.raises(subprocess.TimeoutExpired):
        aoti_cpp.run_loader(fake_loader, tmp_path / "m.pt2", torch.ones(2), work_dir=work, timeout_s=0.1)
    assert list(work.iterdir()) == []


def test_run_loader_keeps_other_files_in_the_work_folder(tmp_path, fake_loader):
    work = tmp_path / "work"
    work.mkdir()
    (work / "input.bin").write_bytes(b"someone else's")
    out = aoti_cpp.run_loader(fake_loader, tmp_path / "m.pt2", torch.zeros(3), work_dir=work)
    torch.testing.assert_close(out, torch.ones(3), rtol=0, atol=0)
    assert [p.name for p in work.iterdir()] == ["input.bin"]
    assert (work / "input.bin").read_bytes() == b"someone else's"


@pytest.mark.skipif(aoti_cpp.toolchain_problem() is not None, reason="no cmake or C++ compiler here")
def test_real_loader_runs_concurrently_in_one_work_folder(tmp_path, small_package):
    from concurrent.futures import ThreadPoolExecutor

    model, package = small_package
    build = aoti_cpp.build_loader()
    inputs = [torch.randn(batch, 16) for batch in (1, 2, 3, 4)]
    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(lambda x: aoti_cpp.run_loader(build.binary, package, x, work_dir=tmp_path), inputs))
    for x, out in zip(inputs, outs):
        torch.testing.assert_close(out, model(x).detach(), rtol=1e-4, atol=1e-5)
    assert list(tmp_path.iterdir()) == []


def test_a_folder_configured_with_another_compiler_still_builds(tmp_path):
    """CMake drops its cache on a compiler change and then misses CMAKE_PREFIX_PATH: start clean."""
    if aoti_cpp.toolchain_problem():
        pytest.skip(aoti_cpp.toolchain_problem())
    import shutil as _shutil
    import subprocess as _subprocess

    other = _shutil.which("c++") or _shutil.which("g++")
    build_dir = tmp_path / "build"
    tools = aoti_cpp.find_tools()
    _subprocess.run([tools["cmake"], "-S", str(aoti_cpp.SOURCE_DIR), "-B", str(build_dir),
                     f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                     f"-DCMAKE_CXX_COMPILER={other}", "-DCMAKE_BUILD_TYPE=Release"],
                    check=True, capture_output=True)
    (build_dir / aoti_cpp.COMPILER_STAMP).write_text("-DCMAKE_CXX_COMPILER=/some/other/compiler\n")
    build = aoti_cpp.build_loader(build_dir, force=True)
    assert build.rebuilt and build.binary.exists()
    stamp = (build_dir / aoti_cpp.COMPILER_STAMP).read_text()
    assert stamp == "\n".join(aoti_cpp.cmake_compiler_args(tools["cxx"])) + "\n"
    assert not aoti_cpp._forget_other_compiler(build_dir, aoti_cpp.cmake_compiler_args(tools["cxx"]))
    assert aoti_cpp._forget_other_compiler(build_dir, ["-DCMAKE_CXX_COMPILER=clang++"])
    assert not (build_dir / "CMakeCache.txt").exists()


# --- the shared CMake helper (cmake_build) that builds both C++ programs ---

def test_aoti_names_are_the_shared_helper_s():
    from course_utils.deploy import cmake_build, tensor_file

    assert aoti_cpp.find_tools is cmake_build.find_tools and aoti_cpp.toolchain_problem is cmake_build.toolchain_problem
    assert aoti_cpp.write_tensor is tensor_file.write_tensor and aoti_cpp.read_tensor is tensor_file.read_tensor
    assert issubclass(aoti_cpp.LoaderFailed, cmake_build.ProgramFailed)
    assert aoti_cpp.CppToolchainMissing is cmake_build.CppToolchainMissing


def test_build_dirs_are_per_program_and_per_torch_install():
    from course_utils.deploy import cmake_build

    a, b = cmake_build.default_build_dir("aoti_loader"), cmake_build.default_build_dir("libtorch_mlp")
    assert a == aoti_cpp.default_build_dir() and a.parent.name == "aoti_loader" and b.parent.name == "libtorch_mlp"
    assert a.name == b.name and a.name.startswith(f"torch-{torch.__version__.replace('+', '_')}-")


def test_build_project_refuses_a_folder_without_cmakelists(tmp_path):
    from course_utils.deploy import cmake_build

    if cmake_build.toolchain_problem():
        pytest.skip(cmake_build.toolchain_problem())
    with pytest.raises(FileNotFoundError, match="no CMakeLists.txt"):
        cmake_build.build_project(tmp_path, "nothing", tmp_path / "build")


def _probe_project(tmp_path, main_cpp: str):
    """A one-file CMake project "probe" under tmp_path/src whose main.cpp is ``main_cpp``."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.18)\nproject(probe CXX)\n"
                                           "add_executable(probe main.cpp)\n")
    (source / "main.cpp").write_text(main_cpp)
    return source


def test_build_project_reports_a_compile_error_and_builds_a_fixed_project(tmp_path):
    from course_utils.deploy import cmake_build

    if cmake_build.toolchain_problem():
        pytest.skip(cmake_build.toolchain_problem())
    source = _probe_project(tmp_path, "int main() { return missing_name; }\n")
    with pytest.raises(RuntimeError, match="missing_name"):
        cmake_build.build_project(source, "probe", tmp_path / "build")
    (source / "main.cpp").write_text('#include <cstdio>\nint main() { std::puts("probe ran"); return 0; }\n')
    build = cmake_build.build_project(source, "probe", tmp_path / "build")
    assert build.rebuilt and cmake_build.run_program([build.binary]) == "probe ran\n"
    assert not cmake_build.build_project(source, "probe", tmp_path / "build").rebuilt


def test_two_builds_of_one_folder_at_once_build_it_once(tmp_path):
    """A notebook and a test (or two test workers) may ask for the same program together."""
    from concurrent.futures import ThreadPoolExecutor

    from course_utils.deploy import cmake_build

    if cmake_build.toolchain_problem():
        pytest.skip(cmake_build.toolchain_problem())
    source = _probe_project(tmp_path, '#include <cstdio>\nint main() { std::puts("once"); return 0; }\n')
    with ThreadPoolExecutor(2) as pool:
        builds = list(pool.map(lambda _: cmake_build.build_project(source, "probe", tmp_path / "build"), range(2)))
    assert sorted(b.rebuilt for b in builds) == [False, True]
    assert cmake_build.run_program([builds[0].binary]) == "once\n"


def test_a_change_in_cpp_common_makes_every_program_stale(tmp_path):
    import os
    import time

    from course_utils.deploy import cmake_build

    project, common = tmp_path / "prog", tmp_path / "common"
    project.mkdir()
    common.mkdir()
    (project / "main.cpp").write_text("int main() {}\n")
    (common / "shared.h").write_text("// shared\n")
    binary = tmp_path / "build" / "prog"
    binary.parent.mkdir()
    binary.write_text("binary")
    built = time.time() - 100
    os.utime(binary, (built, built))
    for path in (project / "main.cpp", common / "shared.h"):
        os.utime(path, (built - 10, built - 10))
    assert cmake_build._is_fresh(binary, project)
    os.utime(common / "shared.h", (built + 10, built + 10))  # edited after the binary was built
    assert not cmake_build._is_fresh(binary, project)
    assert (config_common := cmake_build.config.REPO_ROOT / "cpp" / "common" / "tensor_file.h").is_file(), config_common
