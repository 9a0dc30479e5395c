"""tools/next_release.py picks the newest torch family inside the course's ranges, on canned index
data (no network): the torchvision pairing, yanked and pre-releases, wheels this Python cannot
install, the generated constraints, the Makefile target and the weekly CI job that run it."""

from __future__ import annotations

import json
import sys

import pytest
from packaging.specifiers import SpecifierSet
from packaging.tags import Tag
from packaging.version import Version

from course_utils import config

sys.path.insert(0, str(config.REPO_ROOT / "tools"))
try:
    import next_release as nr
finally:
    sys.path.remove(str(config.REPO_ROOT / "tools"))

#: The tags of a CPython 3.11 on x86_64 Linux (glibc 2.36), as packaging.tags would list a few of them.
TAGS = [Tag("cp311", "cp311", "manylinux_2_28_x86_64"), Tag("py3", "none", "manylinux_2_28_x86_64"),
        Tag("py3", "none", "any")]
PYPROJECT = """
[project]
name = "x"
dependencies = ["torch>=2.11,<3", "torchvision>=0.26", "torchaudio>=2.11", "numpy>=1.26"]
"""
CONSTRAINTS = """# the tested set
numpy==2.4.6
nvidia-cublas==13.1.1.3
torch==2.14.1
torchaudio==2.11.1
torchvision==0.29.1
triton==3.8.0
"""


def wheel(name: str, version: str, tag: str = "cp311-cp311-manylinux_2_28_x86_64", **extra) -> dict:
    return {"filename": f"{name}-{version}-{tag}.whl", "yanked": False, "requires_python": ">=3.10", **extra}


def index(torch=("2.14.1", "2.15.0"), vision=("0.29.1", "0.29.2"), audio=("2.11.1",), more=None) -> dict:
    """A canned JSON-API answer per package: every release with one wheel for this machine, plus
    ``more`` ({name: {version: [file, ...]}})."""
    data = {
        "torch": {v: [wheel("torch", v)] for v in torch},
        "torchvision": {v: [wheel("torchvision", v, "py3-none-manylinux_2_28_x86_64")] for v in vision},
        "torchaudio": {v: [wheel("torchaudio", v, "py3-none-manylinux_2_28_x86_64")] for v in audio},
    }
    for name, releases in (more or {}).items():
        data[name].update(releases)
    return {name: {"releases": releases} for name, releases in data.items()}


def choose(data: dict):
    return nr.choose(lambda name: data[name], PYPROJECT, CONSTRAINTS, tags=TAGS, python="3.11.7")


def test_a_torch_without_its_torchvision_is_skipped_with_the_reason():
    pick = choose(index())
    assert {k: str(v) for k, v in pick.versions.items()} == {
        "torch": "2.14.1", "torchvision": "0.29.2", "torchaudio": "2.11.1"}
    assert pick.newest_torch == Version("2.15.0")
    assert pick.skipped == ["torch 2.15.0 has no torchvision 0.30 on the registry yet (newest: 0.29.2)"]
    lines = pick.lines()
    assert "torchvision 0.29.2 (tested: 0.29.1)" in lines and "torch 2.14.1 (the tested pin)" in lines
    assert not pick.is_tested_set()


def test_the_whole_next_family_is_picked_once_torchvision_is_out():
    pick = choose(index(vision=("0.29.2", "0.30.0"), audio=("2.11.1", "2.15.0")))
    assert [str(pick.versions[k]) for k in nr.FAMILY] == ["2.15.0", "0.30.0", "2.15.0"]
    assert pick.skipped == [] and pick.newest_torch == Version("2.15.0")
    assert "newest torch" not in " ".join(pick.lines())


def test_torchaudio_is_the_newest_not_newer_than_torch():
    pick = choose(index(torch=("2.14.1",), vision=("0.29.1",), audio=("2.11.1", "2.16.0")))
    assert pick.versions["torchaudio"] == Version("2.11.1")
    assert pick.is_tested_set() and pick.lines()[-1].startswith("the newest family is the tested set")


def test_pre_releases_yanked_files_and_foreign_wheels_do_not_count():
    data = index(torch=("2.14.1", "2.15.0"), vision=("0.29.1", "0.30.0"), more={"torch": {
        "2.16.0rc1": [wheel("torch", "2.16.0rc1")],                                  # a release candidate
        "2.15.1": [wheel("torch", "2.15.1", yanked=True)],                          # yanked
        "2.15.2": [wheel("torch", "2.15.2", "cp312-cp312-manylinux_2_28_x86_64")],  # another Python
        "2.15.3": [wheel("torch", "2.15.3", "cp311-cp311-macosx_11_0_arm64")],      # another platform
        "2.15.4": [wheel("torch", "2.15.4", requires_python=">=3.12")],             # needs a newer Python
        "2.15.5": [{"filename": "torch-2.15.5.tar.gz", "yanked": False}],            # a source archive only
        "3.0.0": [wheel("torch", "3.0.0")],                                          # outside <3
    }})
    pick = choose(data)
    assert pick.versions["torch"] == Version("2.15.0") and pick.newest_torch == Version("2.15.0")


def test_installable_orders_newest_first_and_applies_the_range():
    releases = {v: [wheel("torch", v)] for v in ("2.10.0", "2.12.1", "2.11.0", "2.13.0", "not-a-version")}
    got = nr.installable(releases, SpecifierSet(">=2.11,<2.13"), tags=TAGS, python="3.11.7")
    assert got == [Version("2.12.1"), Version("2.11.0")]


def test_no_family_is_an_error_that_says_why():
    with pytest.raises(nr.NoFamily, match=r"torch 2.15.0 has no torchvision 0.30"):
        choose(index(torch=("2.15.0",), vision=("0.29.2",)))
    with pytest.raises(nr.NoFamily, match="no torch release"):
        choose(index(torch=("2.10.0",)))


def test_generated_constraints_replace_the_family_and_drop_torchs_build_pins():
    text = nr.next_constraints(CONSTRAINTS, choose(index()))
    pins = nr.read_pins(text)
    assert pins == {"numpy": "2.4.6", "torch": "2.14.1", "torchvision": "0.29.2", "torchaudio": "2.11.1"}
    assert "#   skipped: torch 2.15.0 has no torchvision 0.30" in text  # the reason travels with the file


def test_declared_ranges_read_pyproject():
    ranges = nr.declared_ranges(PYPROJECT)
    assert ranges["torch"] == SpecifierSet(">=2.11,<3") and ranges["torchaudio"] == SpecifierSet(">=2.11")
    with pytest.raises(KeyError, match="torchaudio"):
        nr.declared_ranges('[project]\nname = "x"\ndependencies = ["torch>=2.11", "torchvision>=0.26"]\n')
    real = nr.declared_ranges((config.REPO_ROOT / "pyproject.toml").read_text())
    assert Version(nr.read_pins((config.REPO_ROOT / "constraints.txt").read_text())["torch"]) in real["torch"]


def test_torchvision_rule_matches_the_tested_pins():
    pins = nr.read_pins((config.REPO_ROOT / "constraints.txt").read_text())
    assert nr.torchvision_minor(Version(pins["torch"])) == Version(pins["torchvision"]).release[:2]
    with pytest.raises(ValueError, match="torch 2.N"):
        nr.torchvision_minor(Version("3.0.0"))


def test_main_writes_only_on_change_and_reports(tmp_path, monkeypatch, capsys):
    data = index()
    monkeypatch.setattr(nr, "fetch_json", lambda index, timeout=60.0: (lambda name: data[name]))
    monkeypatch.setattr(nr, "sys_tags", lambda: iter(TAGS))
    out, report = tmp_path / "c.txt", tmp_path / "r.json"
    assert nr.main(["--out", str(out), "--report", str(report)]) == 0
    assert "wrote" in capsys.readouterr().err
    assert json.loads(report.read_text())["newest_torch"] == "2.15.0"
    before = out.stat().st_mtime_ns
    assert nr.main(["--out", str(out)]) == 0
    assert "unchanged" in capsys.readouterr().err and out.stat().st_mtime_ns == before


def test_main_says_when_the_index_cannot_be_read(tmp_path, monkeypatch, capsys):
    def offline(name):
        raise OSError("network is unreachable")

    monkeypatch.setattr(nr, "fetch_json", lambda index, timeout=60.0: offline)
    assert nr.main(["--out", str(tmp_path / "c.txt")]) == 1
    assert "could not read the index" in capsys.readouterr().err and not (tmp_path / "c.txt").exists()


def test_make_target_and_weekly_job_run_it():
    makefile = (config.REPO_ROOT / "Makefile").read_text()
    assert "tools/next_release.py" in makefile and "\ntest-next:" in makefile
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the workflow")
    flow = yaml.safe_load((config.REPO_ROOT / ".github" / "workflows" / "ci.yml").read_text())
    on = flow.pop(True, flow.get("on"))
    job = flow["jobs"]["next-release"]
    assert on["schedule"] and "schedule" in job["if"] and "pull_request" not in job["if"]
    assert any("make test-next" in step.get("run", "") for step in job["steps"])
