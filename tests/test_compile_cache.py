"""One persistent compile cache: the course kernel, the notebook runner and the test suite all point
Inductor at the same folder in the user's cache (never the temporary directory a reboot may empty),
one per torch release and Python, unless the learner chose one with TORCHINDUCTOR_CACHE_DIR."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from course_utils import config
from course_utils.kit import lab, runner

ROOT = config.REPO_ROOT

#: Runs in a fresh Python: what each of the three places would give its kernels.
PROBE = """
import json, os
import conftest  # the root conftest, as pytest loads it: sets the variable for the suite
from course_utils.kit import kernel, runner
suite = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
with runner._environment(quick=True, blocked=False, results=None):
    notebook_runner = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
print(json.dumps({"suite": suite, "runner": notebook_runner,
                  "kernel": kernel.environment().get("TORCHINDUCTOR_CACHE_DIR")}))
"""


def _probe(env: dict[str, str]) -> dict[str, str]:
    """Return the folder that the test suite, the runner and the kernel each choose under ``env``."""
    dropped = ("TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME", *(v for v, _ in config.ISA_VARIABLES))
    clean = {k: v for k, v in os.environ.items() if k not in dropped}
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_kernel_runner_and_tests_share_one_folder_in_the_users_cache(tmp_path):
    home = tmp_path / "home"
    seen = _probe({"HOME": str(home)})
    expected = str(home / ".cache" / "pytorch2-course" / "inductor" / config.build_tag())
    assert seen == {"suite": expected, "runner": expected, "kernel": expected}  # no CPU profile's settings
    xdg = tmp_path / "xdg"
    seen = _probe({"HOME": str(home), "XDG_CACHE_HOME": str(xdg)})
    assert set(seen.values()) == {str(xdg / "pytorch2-course" / "inductor" / config.build_tag())}


def test_a_folder_the_learner_chose_wins_everywhere(tmp_path):
    mine = tmp_path / "my-inductor-cache"
    seen = _probe({"HOME": str(tmp_path / "home"), "TORCHINDUCTOR_CACHE_DIR": str(mine)})
    assert set(seen.values()) == {str(mine)}


def test_the_default_is_not_under_the_temporary_directory():
    environ = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    folder = config.inductor_cache_dir(environ)
    assert folder.is_absolute() and folder.parts[-3:] == ("pytorch2-course", "inductor", config.cache_tag(environ))
    for tmp in {Path(tempfile.gettempdir()).resolve(), Path("/tmp"), Path("/var/tmp")}:
        assert not folder.resolve().is_relative_to(tmp), f"{folder} is under {tmp}: a reboot may empty it"


def test_user_cache_home_follows_the_xdg_rule():
    assert config.user_cache_home({"XDG_CACHE_HOME": "/srv/cache", "HOME": "/h"}) == Path("/srv/cache")
    # an empty or relative XDG_CACHE_HOME is ignored, as the XDG Base Directory rule says
    assert config.user_cache_home({"XDG_CACHE_HOME": "", "HOME": "/h"}) == Path("/h/.cache")
    assert config.user_cache_home({"XDG_CACHE_HOME": "cache", "HOME": "/h"}) == Path("/h/.cache")
    assert config.inductor_cache_dir({"TORCHINDUCTOR_CACHE_DIR": "~/ic", "HOME": "/h"}) == Path.home() / "ic"


def test_a_cpu_profile_gets_a_folder_of_its_own_everywhere(tmp_path):
    """Torch's cache misses ATEN_CPU_CAPABILITY: one folder for two profiles built AVX2 code for 'default'."""
    home = tmp_path / "home"
    base = home / ".cache" / "pytorch2-course" / "inductor"
    seen = _probe({"HOME": str(home), "ATEN_CPU_CAPABILITY": "default"})
    assert set(seen.values()) == {str(base / f"{config.build_tag()}-aten-default")}
    seen = _probe({"HOME": str(home), "ATEN_CPU_CAPABILITY": "avx2", "TORCHINDUCTOR_CPP_MARCH": "haswell"})
    assert set(seen.values()) == {str(base / f"{config.build_tag()}-aten-avx2-march-haswell")}
    assert config.cache_tag({"TORCHINDUCTOR_CPP_MARCH": " x86-64 v3/.."}) == f"{config.build_tag()}-march-x86_64_v3_.."


def test_the_installed_kernel_chooses_the_folder_when_it_starts(tmp_path, monkeypatch):
    """kernel.json starts course_utils.kit.kernel, which sets the folder from the kernel's own environment."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    folder = lab.install_kernel(prefix=str(tmp_path / "prefix"))
    spec = json.loads((folder / "kernel.json").read_text())
    assert spec["argv"][spec["argv"].index("-m") + 1] == "course_utils.kit.kernel"
    assert "TORCHINDUCTOR_CACHE_DIR" not in spec["env"] and spec["env"]["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    manager = KernelManager(kernel_name=lab.KERNEL_NAME,
                            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(folder.parent)]))
    manager.start_kernel()
    client = manager.client()
    client.start_channels()
    printed: list[dict] = []
    try:
        client.wait_for_ready(timeout=120)
        reply = client.execute_interactive("import os; print(os.environ['TORCHINDUCTOR_CACHE_DIR'], "
                                           "os.environ['OMP_WAIT_POLICY'])", timeout=60,
                                           output_hook=lambda msg: printed.append(msg))
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    assert reply["content"]["status"] == "ok"
    text = "".join(m["content"].get("text", "") for m in printed if m["msg_type"] == "stream")
    expected = tmp_path / "home" / ".cache" / "pytorch2-course" / "inductor" / f"{config.build_tag()}-aten-default"
    assert text.split() == [str(expected), "PASSIVE"]


def test_a_cold_run_still_gets_an_empty_cache(monkeypatch, tmp_path):
    """`make report-cold` and workshop-check's cold figure: the runner's empty folder wins over the default."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)  # the default below is HOME's, as on most machines
    monkeypatch.setenv("HOME", str(tmp_path))
    with runner._empty_caches(True), runner._environment(quick=True, blocked=False, results=None):
        folder = os.environ["TORCHINDUCTOR_CACHE_DIR"]
        assert "course-cold-" in folder and not os.listdir(folder)
    with runner._environment(quick=True, blocked=False, results=None):
        default = tmp_path / ".cache" / "pytorch2-course" / "inductor" / config.cache_tag()
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(default)


def test_each_torch_release_and_python_gets_a_folder_of_its_own(monkeypatch):
    """A cache shared by torch 2.14.1/Python 3.11 and torch 2.11.0/Python 3.12 crashed the second."""
    import importlib.metadata
    import sys

    environ = {"HOME": "/h"}
    here = config.inductor_cache_dir(environ)
    assert here.name == f"torch-{importlib.metadata.version('torch')}-py{sys.version_info[0]}.{sys.version_info[1]}"
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.11.0+cu130")
    assert config.inductor_cache_dir(environ) == here.parent / f"torch-2.11.0+cu130-py{sys.version_info[0]}.{sys.version_info[1]}"


#: Compiles one small graph in a fresh Python and says whether it worked and whether torch's FX graph
#: cache answered; Inductor's C++ build errors surface as BackendCompilerFailed around a CppCompileError.
COMPILE_ONCE = """
import json, torch
from torch._dynamo.utils import counters
failed = None
try:
    torch.compile(lambda x: (x.sin() * 2 + 1).relu())(torch.randn(1000))
except Exception as error:
    failed = f"{type(error).__name__}: {str(error)[:300]}"
print(json.dumps({"failed": failed, "fx_hits": counters["inductor"]["fxgraph_cache_hit"]}))
"""


def test_torchs_own_cache_keys_miss_aten_cpu_capability(tmp_path):
    """The fact behind cache_tag() and notebook 01's section 7, checked against the installed torch.

    One cache folder, compiled once as this CPU allows (vector code), then once under
    ATEN_CPU_CAPABILITY=default: torch hands the second process the first one's graph, whose C++ does
    not build without AVX2. When a torch release keys its cache on the capability, this test fails:
    then the '-aten-' folder suffix is no longer needed and notebook 01 should stop saying so.
    """
    import platform

    from course_utils import inductor_code

    if platform.machine().lower() not in ("x86_64", "amd64") or os.environ.get("ATEN_CPU_CAPABILITY"):
        pytest.skip("the check needs an x86 CPU running with torch's own capability choice")
    if not inductor_code.vectorises_here():
        pytest.skip("Inductor writes no vector code on this CPU, so both runs build the same C++")
    env = {k: v for k, v in os.environ.items() if k not in dict(config.ISA_VARIABLES)}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "one-folder")

    def compile_once(extra: dict[str, str]) -> dict:
        proc = subprocess.run([sys.executable, "-c", COMPILE_ONCE], cwd=ROOT, env={**env, **extra},
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    first = compile_once({})
    assert first["failed"] is None, first
    second = compile_once({"ATEN_CPU_CAPABILITY": "default"})
    assert second["failed"] is not None, (
        f"torch {torch_version()} now compiles for ATEN_CPU_CAPABILITY=default from a folder filled "
        f"with vector code ({second}): its cache keys on the capability, so notebook 01 section 7 and "
        "config.ISA_VARIABLES's comment are out of date")
    assert "CppCompileError" in second["failed"] or "Vectorized" in second["failed"], second


def torch_version() -> str:
    """Return the installed torch's version without importing it into the test process."""
    import importlib.metadata

    return importlib.metadata.version("torch")
