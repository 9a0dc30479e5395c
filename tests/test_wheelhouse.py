"""The classroom wheelhouse: build once, check, install with no index (course_utils.kit.wheelhouse)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from course_utils import config
from course_utils.kit import wheelhouse

ROOT = config.REPO_ROOT


@pytest.fixture
def small_house(tmp_path: Path) -> tuple[Path, Path]:
    """A wheelhouse of two fake wheels for this platform, and constraints pinning them."""
    folder = tmp_path / "wh"
    folder.mkdir()
    (folder / "foo_bar-1.0-py3-none-any.whl").write_bytes(b"foo wheel")
    (folder / "baz-2.0.tar.gz").write_bytes(b"baz sdist")
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("# pins\nFoo.Bar==1.0\nbaz==2.0  # comment\n")
    wheelhouse.write_manifest(folder, constraints, sysconfig.get_platform(), "3.11")
    return folder, constraints


def test_names_and_pins_are_read_the_way_pip_normalises_them(tmp_path):
    assert wheelhouse.distribution_of("Foo_Bar-1.0-cp311-cp311-manylinux_2_28_x86_64.whl") == ("foo-bar", "1.0")
    assert wheelhouse.distribution_of("baz-2.0.tar.gz") == ("baz", "2.0")
    assert wheelhouse.distribution_of("manifest.json") is None
    constraints = tmp_path / "c.txt"
    constraints.write_text("A_b==1\n# x==2\nc==3 ; sys_platform == 'linux'\n")
    assert wheelhouse.pinned(constraints) == {"a-b": "1", "c": "3"}


def test_a_complete_wheelhouse_has_no_problems_and_a_manifest(small_house):
    folder, constraints = small_house
    manifest = json.loads((folder / "manifest.json").read_text())
    assert {f["name"] for f in manifest["files"]} == {"foo_bar-1.0-py3-none-any.whl", "baz-2.0.tar.gz"}
    assert all(len(f["sha256"]) == 64 for f in manifest["files"])
    assert wheelhouse.problems(folder, constraints) == []


def test_missing_damaged_and_unpinned_files_are_named(small_house):
    folder, constraints = small_house
    constraints.write_text(constraints.read_text() + "qux==3.1\n")
    (folder / "baz-2.0.tar.gz").write_bytes(b"baz sdist, changed")
    (folder / "foo_bar-1.0-py3-none-any.whl").unlink()
    found = "\n".join(wheelhouse.problems(folder, constraints))
    assert "foo_bar-1.0-py3-none-any.whl: listed in the manifest but missing" in found
    assert "baz-2.0.tar.gz: damaged" in found
    assert "qux==3.1: pinned in constraints.txt but not in the wheelhouse" in found


def test_no_folder_or_no_manifest_says_how_to_get_one(tmp_path):
    with pytest.raises(wheelhouse.WheelhouseError, match="make wheelhouse"):
        wheelhouse.problems(tmp_path / "nowhere", tmp_path / "c.txt")
    (tmp_path / "wh").mkdir()
    (tmp_path / "wh" / "manifest.json").write_text("{not json")
    with pytest.raises(wheelhouse.WheelhouseError, match="missing or damaged"):
        wheelhouse.problems(tmp_path / "wh", tmp_path / "c.txt")


def test_install_refuses_an_incomplete_wheelhouse_before_running_pip(small_house, tmp_path, monkeypatch):
    folder, constraints = small_house
    constraints.write_text(constraints.read_text() + "qux==3.1\n")
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: ran.append(a))
    with pytest.raises(wheelhouse.WheelhouseError, match="qux==3.1"):
        wheelhouse.install(folder, tmp_path / "venv", constraints)
    assert not ran and not (tmp_path / "venv").exists()


def test_check_command_exit_status_and_lines(small_house, capsys):
    folder, constraints = small_house
    assert wheelhouse.main(["check", str(folder), "--constraints", str(constraints)]) == 0
    assert "wheelhouse complete" in capsys.readouterr().out
    constraints.write_text(constraints.read_text() + "qux==3.1\n")
    assert wheelhouse.main(["check", str(folder), "--constraints", str(constraints)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  qux==3.1" in out and "NOT complete" in out
    assert wheelhouse.main(["check", str(folder.parent / "elsewhere")]) == 1
    assert "no wheelhouse at" in capsys.readouterr().err


def test_make_installs_from_the_wheelhouse_alone_when_given_one(tmp_path):
    """`make setup WHEELHOUSE=DIR` checks the folder, then gives every pip call --no-index."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venv = tmp_path / "venv"
    out = subprocess.run(["make", "-n", "setup", f"VENV={venv}", f"WHEELHOUSE={tmp_path / 'wh'}"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    pip_lines = [line for line in out.splitlines() if "pip install" in line]
    assert len(pip_lines) == 2 and all(f"--no-index --find-links {tmp_path / 'wh'}" in line for line in pip_lines)
    assert f"course_utils.kit.wheelhouse check {tmp_path / 'wh'}" in out
    plain = subprocess.run(["make", "-n", "setup", f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout
    assert "--no-index" not in plain and "wheelhouse" not in plain


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("COURSE_SLOW") != "1", reason="slow (builds a 3-4 GB wheelhouse and a "
                    "fresh environment): set COURSE_SLOW=1; the scheduled CI job does")
def test_a_fresh_environment_from_the_wheelhouse_runs_notebook_00_with_the_network_removed(tmp_path):
    """Where Linux allows it, the install and the notebook run in an empty network namespace; elsewhere
    (a container without the right) pip still has no index to reach, and the course kernel's offline
    guard blocks downloads."""
    from course_utils.kit import netns, offline

    wrapped, why = netns.wrap(sys.executable)
    print(f"network namespace: {'yes' if wrapped else 'no, ' + why}")
    folder, venv = tmp_path / "wh", tmp_path / "venv"
    # building is the one step that needs the network: without the tests' offline guard
    online = {**os.environ, "COURSE_OFFLINE": "0",
              "PYTHONPATH": os.pathsep.join(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                            if p and Path(p).resolve() != offline.SITE_DIR.resolve())}
    wheelhouse.build(folder, ROOT / "constraints.txt", env=online)
    assert wheelhouse.problems(folder, ROOT / "constraints.txt") == []
    seconds = wheelhouse.install(folder, venv, ROOT / "constraints.txt", use_netns=wrapped is not None)
    assert seconds > 0
    env = {**os.environ, "COURSE_QUICK": "1", **offline.child_env()}
    run = subprocess.run([*(wrapped or []), str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p",
                          "no:cacheprovider", "notebooks/00_setup.ipynb"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def test_its_checksum_is_the_data_package_s(tmp_path):
    """wheelhouse.sha256 repeats data.files.sha256_of so that it needs no torch; both must agree."""
    from course_utils.data.files import sha256_of

    path = tmp_path / "blob"
    path.write_bytes(bytes(range(256)) * 5000)
    assert wheelhouse.sha256(path) == sha256_of(path)
