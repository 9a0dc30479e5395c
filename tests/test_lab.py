"""`make lab` works headless: JupyterLab starts, answers on loopback, sees the course kernel, stops."""

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from course_utils import config
from course_utils.kit import lab
from course_utils.serving.server.runner import free_port

ROOT = config.REPO_ROOT
NEWS_PLUGIN = "@jupyterlab/apputils-extension:notification"
#: `make test-min`'s floor environment is for tests only (its recipe does not write lab settings).
FLOOR_ENV = bool(os.environ.get("COURSE_CONSTRAINTS"))


def get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def test_make_lab_adds_allow_root_only_for_root():
    out = subprocess.run(["make", "-n", "lab"], cwd=ROOT, capture_output=True, text=True, check=True)
    lab_line = [ln for ln in out.stdout.splitlines() if "jupyter lab" in ln][-1]
    assert "--ServerApp.root_dir=notebooks" in lab_line
    assert ("--allow-root" in lab_line) == (os.geteuid() == 0)


def test_jupyterlab_starts_headless_and_serves_the_course(tmp_path):
    port, token = free_port(), "course-test-token"
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}",
           "--ip=127.0.0.1", f"--IdentityProvider.token={token}",
           "--ServerApp.root_dir=notebooks"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    log = (tmp_path / "lab.log").open("w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        base = f"http://127.0.0.1:{port}"
        status = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status = get_json(f"{base}/api/status?token={token}")
                break
            except OSError:
                time.sleep(0.5)
        assert status is not None, (tmp_path / "lab.log").read_text()
        assert "started" in status
        specs = get_json(f"{base}/api/kernelspecs?token={token}")["kernelspecs"]
        assert "pytorch2-course" in specs, f"course kernel not registered: {sorted(specs)}"
        contents = get_json(f"{base}/api/contents?token={token}")["content"]
        assert "00_setup.ipynb" in {c["name"] for c in contents}
        if not FLOOR_ENV:  # the course's override reaches the running JupyterLab: no news pop-up
            plugin = get_json(f"{base}/lab/api/settings/{NEWS_PLUGIN}?token={token}")
            assert plugin["schema"]["properties"]["fetchNews"]["default"] == "false"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    assert proc.returncode is not None


def test_lab_override_names_a_real_setting_of_the_installed_jupyterlab():
    schema = json.loads((Path(sys.prefix) / "share" / "jupyter" / "lab" / "schemas" / "@jupyterlab"
                         / "apputils-extension" / "notification.json").read_text())
    allowed = {choice["const"] for choice in schema["properties"]["fetchNews"]["oneOf"]}
    assert lab.OVERRIDES == {NEWS_PLUGIN: {"fetchNews": "false"}} and "false" in allowed


def test_write_overrides_merges_into_an_environment(tmp_path):
    path = lab.overrides_path(tmp_path)
    assert path == tmp_path / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    assert lab.write_overrides(tmp_path) == path
    assert json.loads(path.read_text()) == {NEWS_PLUGIN: {"fetchNews": "false"}}
    path.write_text(json.dumps({"@jupyterlab/apputils-extension:themes": {"theme": "JupyterLab Dark"},
                                NEWS_PLUGIN: {"fetchNews": "true", "doNotDisturbMode": True}}))
    lab.write_overrides(tmp_path)
    lab.write_overrides(tmp_path)  # idempotent
    assert json.loads(path.read_text()) == {
        "@jupyterlab/apputils-extension:themes": {"theme": "JupyterLab Dark"},
        NEWS_PLUGIN: {"fetchNews": "false", "doNotDisturbMode": True}}
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        lab.write_overrides(tmp_path)
    assert path.read_text() == "{not json"


@pytest.mark.skipif(FLOOR_ENV, reason="make test-min's environment is for tests; learners open JupyterLab from .venv")
def test_this_environment_has_the_override():
    """`make setup` writes it (python -m course_utils.kit.lab) into the environment it builds."""
    path = lab.overrides_path()
    assert path.exists(), f"{path} is missing: run `make setup`"
    assert json.loads(path.read_text())[NEWS_PLUGIN]["fetchNews"] == "false"


def test_make_setup_writes_the_override():
    out = subprocess.run(["make", "-n", "-B", "setup"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "-m course_utils.kit.lab" in out.stdout


def test_course_kernel_carries_the_thread_policy(tmp_path):
    """The installed kernel runs this Python with the policy's variables (idle threads sleep)."""
    from course_utils.threads import KERNEL_ENV

    folder = lab.install_kernel(prefix=str(tmp_path))
    spec = json.loads((folder / "kernel.json").read_text())
    assert folder.name == lab.KERNEL_NAME
    assert spec["argv"][0] == sys.executable
    assert spec["env"] == lab.kernel_env() and KERNEL_ENV["OMP_WAIT_POLICY"] == "PASSIVE"
    assert spec["env"].items() >= KERNEL_ENV.items()  # the policy; the cache is picked at start (test_compile_cache.py)


def test_makefile_names_the_same_kernel():
    text = (ROOT / "Makefile").read_text()
    assert f"KERNEL_NAME := {lab.KERNEL_NAME}#" in text
