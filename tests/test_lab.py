"""`make lab` works headless: JupyterLab starts, answers on loopback, sees the course kernel, stops."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

from course_utils import config

ROOT = config.REPO_ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    assert proc.returncode is not None
