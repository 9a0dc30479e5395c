"""`make workshop-check NETNS=1`: an empty network namespace where Linux allows one, and a plain
fallback (the Python guard, said out loud) where it does not."""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest

from course_utils.kit import netns, runner, workshop

INSIDE = """
import errno, socket
from course_utils.kit import netns, offline
offline.uninstall()  # show the namespace itself, not the Python guard, stops traffic
assert netns.network_removed(), socket.if_nameindex()
server = socket.create_server(("127.0.0.1", 0))
socket.create_connection(server.getsockname(), timeout=5).close()
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    udp.connect(("192.0.2.1", 9))  # a route lookup only; no packet is sent
except OSError as err:
    assert err.errno == errno.ENETUNREACH, err
else:
    raise AssertionError("a route to another machine exists")
print("isolated")
"""


@pytest.fixture(scope="module")
def prefix() -> list[str]:
    command, why = netns.wrap()
    if command is None:
        pytest.skip(f"no network namespace on this machine: {why}")
    return command


def test_the_namespace_has_loopback_and_nothing_else(prefix):
    out = subprocess.run([*prefix, sys.executable, "-c", INSIDE], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "isolated", out.stderr[-2000:]


def test_a_notebook_kernel_starts_and_runs_inside_the_namespace(prefix, tmp_path):
    """A new namespace starts with loopback down, and a kernel cannot start without it."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "from course_utils.kit import netns, offline\nassert netns.network_removed() and offline.is_installed()")]
    path = tmp_path / "01_inside.ipynb"
    nbformat.write(nb, path)
    code = (f"from pathlib import Path; from course_utils.kit import runner; "
            f"r = runner.run_notebook(Path({str(path)!r}), offline=True); print(r.ok, r.error)")
    out = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0 and out.stdout.split()[:1] == ["True"], out.stdout + out.stderr[-2000:]


def test_wrap_says_why_not_without_unshare(monkeypatch):
    monkeypatch.setattr(netns.shutil, "which", lambda name: None)
    command, why = netns.wrap()
    assert command is None and "unshare" in why
    monkeypatch.setattr(netns.sys, "platform", "darwin")
    command, why = netns.wrap()
    assert command is None and "Linux" in why and "darwin" in why


def test_wrap_says_why_when_unshare_is_refused(monkeypatch, tmp_path):
    fake = tmp_path / "unshare"
    fake.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(netns.shutil, "which", lambda name: str(fake))
    command, why = netns.wrap()
    assert command is None and "Operation not permitted" in why


def _fake_check(monkeypatch):
    monkeypatch.setattr("course_utils.kit.doctor.run_checks", lambda: [])
    ran = runner.NotebookRun("01_x.ipynb", True, 1.0, "quick")
    monkeypatch.setattr(workshop, "run_course", lambda paths, **kw: [ran])


def test_workshop_check_falls_back_to_the_guard_and_says_so(monkeypatch, tmp_path, capsys):
    _fake_check(monkeypatch)
    monkeypatch.setattr(netns, "network_removed", lambda: False)
    monkeypatch.setattr(netns, "wrap", lambda: (None, "`unshare` is not installed"))
    assert workshop.main(["--netns", str(tmp_path / "01_x.ipynb"), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no network namespace: `unshare` is not installed. Falling back to the Python guard" in out
    assert "not a sandbox" in out and "(Python guard only)" in out


def test_workshop_check_reports_a_removed_network(monkeypatch, tmp_path, capsys):
    _fake_check(monkeypatch)
    monkeypatch.setattr(netns, "network_removed", lambda: True)
    assert workshop.main(["--netns", str(tmp_path / "01_x.ipynb"), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert workshop.NETWORK_REMOVED in out and "READY" in out and "(network removed)" in out


def test_workshop_check_reruns_itself_inside_the_namespace(monkeypatch, tmp_path, capsys):
    calls = []
    monkeypatch.setattr(netns, "network_removed", lambda: False)
    monkeypatch.setattr(netns, "wrap", lambda: (["unshare", "-rn", "py", "-m", "course_utils.kit.netns"],
                                                "unshare -rn"))
    monkeypatch.setattr(workshop.subprocess, "call", lambda cmd: calls.append(cmd) or 0)
    assert workshop.main(["--netns", "--out", str(tmp_path)]) == 0
    assert calls == [["unshare", "-rn", "py", "-m", "course_utils.kit.netns", sys.executable, "-m",
                      "course_utils", "workshop-check", "--out", str(tmp_path)]]
    assert "inside an empty network namespace (unshare -rn)" in capsys.readouterr().out
