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

from course_utils import config
from course_utils.kit import lab, runner

ROOT = config.REPO_ROOT

#: Runs in a fresh Python: what each of the three places would give its kernels.
PROBE = """
import json, os
import conftest  # the root conftest, as pytest loads it: sets the variable for the suite
from course_utils.kit import lab, runner
suite = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
with runner._environment(quick=True, blocked=False, results=None):
    notebook_runner = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
print(json.dumps({"suite": suite, "runner": notebook_runner,
                  "kernel": lab.kernel_env().get("TORCHINDUCTOR_CACHE_DIR")}))
"""


def _probe(env: dict[str, str]) -> dict[str, str]:
    """Return the folder that the test suite, the runner and the kernel each choose under ``env``."""
    clean = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME")}
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_kernel_runner_and_tests_share_one_folder_in_the_users_cache(tmp_path):
    home = tmp_path / "home"
    seen = _probe({"HOME": str(home)})
    expected = str(home / ".cache" / "pytorch2-course" / "inductor" / config.build_tag())
    assert seen == {"suite": expected, "runner": expected, "kernel": expected}
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
    assert folder.is_absolute() and folder.parts[-3:] == ("pytorch2-course", "inductor", config.build_tag())
    for tmp in {Path(tempfile.gettempdir()).resolve(), Path("/tmp"), Path("/var/tmp")}:
        assert not folder.resolve().is_relative_to(tmp), f"{folder} is under {tmp}: a reboot may empty it"


def test_user_cache_home_follows_the_xdg_rule():
    assert config.user_cache_home({"XDG_CACHE_HOME": "/srv/cache", "HOME": "/h"}) == Path("/srv/cache")
    # an empty or relative XDG_CACHE_HOME is ignored, as the XDG Base Directory rule says
    assert config.user_cache_home({"XDG_CACHE_HOME": "", "HOME": "/h"}) == Path("/h/.cache")
    assert config.user_cache_home({"XDG_CACHE_HOME": "cache", "HOME": "/h"}) == Path("/h/.cache")
    assert config.inductor_cache_dir({"TORCHINDUCTOR_CACHE_DIR": "~/ic", "HOME": "/h"}) == Path.home() / "ic"


def test_the_installed_kernel_carries_the_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "chosen"))
    spec = json.loads((lab.install_kernel(prefix=str(tmp_path / "prefix")) / "kernel.json").read_text())
    assert spec["env"]["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "chosen")
    assert spec["env"]["OMP_WAIT_POLICY"] == "PASSIVE"  # the thread policy is still there


def test_a_cold_run_still_gets_an_empty_cache(monkeypatch, tmp_path):
    """`make report-cold` and workshop-check's cold figure: the runner's empty folder wins over the default."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)  # the default below is HOME's, as on most machines
    monkeypatch.setenv("HOME", str(tmp_path))
    with runner._empty_caches(True), runner._environment(quick=True, blocked=False, results=None):
        folder = os.environ["TORCHINDUCTOR_CACHE_DIR"]
        assert "course-cold-" in folder and not os.listdir(folder)
    with runner._environment(quick=True, blocked=False, results=None):
        default = tmp_path / ".cache" / "pytorch2-course" / "inductor" / config.build_tag()
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
