"""The classroom wheelhouse: build once, check, install with no index (course_utils.kit.wheelhouse)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from course_utils import config
from course_utils.kit import wheelhouse

ROOT = config.REPO_ROOT


@pytest.fixture
def small_house(tmp_path: Path) -> tuple[Path, Path]:
    """A wheelhouse of two fake wheels for this platform and Python, and constraints pinning them."""
    folder = tmp_path / "wh"
    folder.mkdir()
    (folder / "foo_bar-1.0-py3-none-any.whl").write_bytes(b"foo wheel")
    (folder / "baz-2.0.tar.gz").write_bytes(b"baz sdist")
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("# pins\nFoo.Bar==1.0\nbaz==2.0  # comment\n")
    wheelhouse.write_manifest(folder, constraints, sysconfig.get_platform(), "{}.{}".format(*sys.version_info[:2]))
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
    """`make setup WHEELHOUSE=DIR` checks the folder and writes hashed requirements; pip installs those alone
    (--require-hashes, --no-index), then the course itself with no source to fetch anything from."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venv, folder = tmp_path / "venv", tmp_path / "wh"
    out = subprocess.run(["make", "-n", "setup", f"VENV={venv}", f"WHEELHOUSE={folder}"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    hashed = venv / "wheelhouse-requirements.txt"
    assert f"course_utils.kit.wheelhouse check {folder} --requirements {hashed}" in out
    pip_lines = [line for line in out.splitlines() if "pip install" in line]
    assert len(pip_lines) == 2
    assert " ".join(wheelhouse.pip_verified(folder, hashed)) in pip_lines[0]
    assert "--no-index --no-build-isolation" in pip_lines[1] and "--find-links" not in pip_lines[1]
    assert '-e ".[dev]"' in pip_lines[1]
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


# --- hardening: nothing but what the manifest lists, verified again when pip installs it ---------------------------

def tiny_wheel(folder: Path, name: str = "tinypkg", version: str = "1.0", body: str = "VALUE = 1\n") -> Path:
    """Write a real, installable pure-Python wheel by hand (no network, no build tool) and return its path."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": body.encode(),
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
              for p, d in files.items()] + [f"{dist}/RECORD,,"]
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for inner, data in files.items():
            archive.writestr(inner, data)
    return path


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def _rewrite(folder: Path, **changes) -> None:
    (folder / "manifest.json").write_text(json.dumps({**_manifest(folder), **changes}))


def test_files_the_manifest_does_not_list_are_refused(small_house):
    """pip reads every archive in a --find-links folder; an unlisted one must stop the check."""
    folder, constraints = small_house
    for stray in ("evil-9.9-py3-none-any.whl", "other-1.0.zip", "odd.whl", "old-0.1.tar.bz2", "x-1.TGZ"):
        (folder / stray).write_bytes(b"not listed")
    (folder / "README.txt").write_text("notes are fine")
    found = "\n".join(wheelhouse.problems(folder, constraints))
    for stray in ("evil-9.9-py3-none-any.whl", "other-1.0.zip", "odd.whl", "old-0.1.tar.bz2", "x-1.TGZ"):
        assert f"{stray}: in the folder but not in the manifest" in found
    assert "README.txt" not in found


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "sub/foo-1.0-py3-none-any.whl", "..",
                                  "", "..\\evil-1.0-py3-none-any.whl", "manifest.json"])
def test_manifest_names_must_be_plain_file_names_inside_the_folder(small_house, capsys, name):
    folder, constraints = small_house
    manifest = _manifest(folder)
    manifest["files"][0]["name"] = name
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(wheelhouse.WheelhouseError, match="not a distribution file name inside the folder"):
        wheelhouse.problems(folder, constraints)
    assert wheelhouse.main(["check", str(folder), "--constraints", str(constraints)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


ODD_MANIFESTS = {
    "empty file": b"",
    "not UTF-8": b'{"files": [{"name": "\xff\xfe"}]}',
    "not JSON": b"{files",
    "a list": b"[]",
    "null": b"null",
    "no files": b'{"files": []}',
    "files not a list": b'{"files": "foo_bar-1.0-py3-none-any.whl"}',
    "an entry that is a string": b'{"files": ["foo_bar-1.0-py3-none-any.whl"]}',
    "missing fields": b'{"files": [{"name": "foo_bar-1.0-py3-none-any.whl"}]}',
    "bytes as text": b'{"files": [{"name": "baz-2.0.tar.gz", "bytes": "9", "sha256": "' + b"a" * 64 + b'"}]}',
    "bad hash format": b'{"files": [{"name": "baz-2.0.tar.gz", "bytes": 9, "sha256": "md5:abc"}]}',
    "a name twice": b'{"files": [' + b",".join([b'{"name": "baz-2.0.tar.gz", "bytes": 9, "sha256": "'
                                               + b"a" * 64 + b'"}'] * 2) + b"]}",
    "target not an object": b'{"target": 3, "files": [{"name": "baz-2.0.tar.gz", "bytes": 9, "sha256": "'
                            + b"a" * 64 + b'"}]}',
}


@pytest.mark.parametrize("kind", ODD_MANIFESTS)
def test_odd_manifests_give_one_clear_line_not_a_traceback(small_house, capsys, kind):
    folder, constraints = small_house
    (folder / "manifest.json").write_bytes(ODD_MANIFESTS[kind])
    with pytest.raises(wheelhouse.WheelhouseError, match="manifest.json"):
        wheelhouse.problems(folder, constraints)
    assert wheelhouse.main(["check", str(folder), "--constraints", str(constraints)]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    assert "Traceback" not in captured.out + captured.err


def test_an_unreadable_constraints_file_is_a_clear_error(small_house, capsys):
    folder, constraints = small_house
    constraints.write_bytes(b"foo==\xff\n")
    assert wheelhouse.main(["check", str(folder), "--constraints", str(constraints)]) == 1
    assert "cannot read" in capsys.readouterr().err
    assert wheelhouse.main(["check", str(folder), "--constraints", str(folder / "nowhere.txt")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_the_manifest_records_the_python_and_platform_it_was_built_for(small_house):
    folder, constraints = small_house
    here = wheelhouse.target_here()
    assert _manifest(folder)["target"] == here
    assert here["python_tag"] == "cp{}{}".format(*sys.version_info[:2]) or sys.implementation.name != "cpython"
    assert here["sys_platform"] == sys.platform
    assert wheelhouse.target_of("manylinux_2_17_x86_64", "3.12") == {
        "python_tag": "cp312", "platform_tag": "manylinux_2_17_x86_64", "sys_platform": "linux", "machine": "x86_64"}
    assert wheelhouse.target_of("macosx_11_0_arm64", "3.11")["sys_platform"] == "darwin"
    assert wheelhouse.target_of("win_amd64", "311")["machine"] == "amd64"
    assert wheelhouse.target_of("linux-x86_64", "3.11")["platform_tag"] == "linux_x86_64"
    with pytest.raises(wheelhouse.WheelhouseError, match="platform tag"):
        wheelhouse.target_of("plan9_mips", "3.11")


def test_check_refuses_a_wheelhouse_for_another_python_or_platform(small_house, capsys):
    """Issue 38: a 3.11 wheelhouse on a 3.12 laptop must fail at `check`, not later inside pip."""
    folder, constraints = small_house
    other_minor = f"3.{sys.version_info[1] + 1}"
    _rewrite(folder, target=wheelhouse.target_of(sysconfig.get_platform(), other_minor))
    assert wheelhouse.main(["check", str(folder), "--constraints", str(constraints)]) == 1
    out = capsys.readouterr().out
    assert "built for cp3" in out and "this machine runs" in out and f"--python-version {other_minor}" not in out
    _rewrite(folder, target=wheelhouse.target_of("macosx_11_0_arm64", "{}.{}".format(*sys.version_info[:2])))
    found = "\n".join(wheelhouse.problems(folder, constraints))
    assert "darwin" in found and "build one for this machine" in found
    # checksums of a wheelhouse for other laptops can still be checked here, before the day
    assert wheelhouse.main(["check", str(folder), "--constraints", str(constraints), "--any-target"]) == 0


def test_old_manifests_without_a_target_are_still_read(small_house):
    folder, constraints = small_house
    manifest = _manifest(folder)
    del manifest["target"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert wheelhouse.problems(folder, constraints) == []  # platform and python: this machine's
    manifest["python"] = f"3.{sys.version_info[1] + 1}"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert any("built for" in line for line in wheelhouse.problems(folder, constraints))


def _pip_install(folder: Path, requirements: Path, target: Path) -> subprocess.CompletedProcess:
    """pip as the Makefile and ``install`` run it: the folder alone, every file checked against its hash."""
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-cache-dir",
                           *wheelhouse.pip_verified(folder, requirements), "--target", str(target)],
                          capture_output=True, text=True, env=env, timeout=300)


def test_pip_installs_only_what_the_check_verified(tmp_path):
    """A real install from a wheelhouse this test builds: a file changed after `check` makes pip refuse it."""
    folder = tmp_path / "wh"
    folder.mkdir()
    tiny_wheel(folder)
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("tinypkg==1.0\n")
    wheelhouse.write_manifest(folder, constraints, sysconfig.get_platform(), "{}.{}".format(*sys.version_info[:2]))
    requirements = tmp_path / "hashed.txt"
    assert wheelhouse.main(["check", str(folder), "--constraints", str(constraints),
                            "--requirements", str(requirements)]) == 0
    digest = _manifest(folder)["files"][0]["sha256"]
    assert requirements.read_text().splitlines()[-1] == f"tinypkg==1.0 --hash=sha256:{digest}"
    first = _pip_install(folder, requirements, tmp_path / "t1")
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "t1" / "tinypkg" / "__init__.py").read_text() == "VALUE = 1\n"
    tiny_wheel(folder, body="VALUE = 'tampered'\n")  # same name, after the check
    second = _pip_install(folder, requirements, tmp_path / "t2")
    assert second.returncode != 0 and "do not match the hashes" in second.stderr.lower(), second.stderr
    assert not (tmp_path / "t2" / "tinypkg").exists()


def test_check_writes_no_requirements_for_a_bad_wheelhouse(small_house, tmp_path):
    folder, constraints = small_house
    (folder / "baz-2.0.tar.gz").write_bytes(b"changed")
    requirements = tmp_path / "hashed.txt"
    assert wheelhouse.main(["check", str(folder), "--constraints", str(constraints),
                            "--requirements", str(requirements)]) == 1
    assert not requirements.exists()


def test_install_runs_pip_on_the_hashed_requirements(small_house, tmp_path, monkeypatch):
    folder, constraints = small_house
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **k: ran.append(cmd))
    wheelhouse.install(folder, tmp_path / "venv", constraints)
    hashed, editable = ran[1], ran[2]
    assert "--require-hashes" in hashed and "--find-links" in hashed
    assert (tmp_path / "venv" / "wheelhouse-requirements.txt").read_text().count("--hash=sha256:") == 2
    assert "--no-index" in editable and "--find-links" not in editable and "--no-build-isolation" in editable
