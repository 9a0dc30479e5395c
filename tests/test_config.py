import os
from pathlib import Path

import pytest

from course_utils import config


@pytest.mark.parametrize("raw", ["1", "true", "YES", " on "])
def test_quick_mode_on(monkeypatch, raw):
    monkeypatch.setenv("COURSE_QUICK", raw)
    assert config.is_quick()
    assert config.pick(1, 2) == 1
    assert config.mode_name() == "quick"


@pytest.mark.parametrize("raw", ["", "0", "false", "off"])
def test_quick_mode_off(monkeypatch, raw):
    monkeypatch.setenv("COURSE_QUICK", raw)
    assert not config.is_quick()
    assert config.pick(1, 2) == 2
    assert config.mode_name() == "full"


def test_quick_mode_unset_is_full(monkeypatch):
    monkeypatch.delenv("COURSE_QUICK", raising=False)
    assert not config.is_quick()


def test_quick_mode_typo_is_an_error(monkeypatch):
    monkeypatch.setenv("COURSE_QUICK", "ture")
    with pytest.raises(ValueError, match="COURSE_QUICK"):
        config.is_quick()


def test_default_paths_live_in_the_repo(monkeypatch):
    for var in ("COURSE_DATA_DIR", "COURSE_CACHE_DIR", "COURSE_BUILD_DIR"):
        monkeypatch.delenv(var, raising=False)
    assert config.data_dir() == config.REPO_ROOT / "data"
    assert (config.data_dir() / "SHA256SUMS").exists()
    assert config.cache_dir(create=False) == config.REPO_ROOT / ".cache"
    assert config.build_dir(create=False) == config.REPO_ROOT / "build"


def test_paths_follow_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("COURSE_BUILD_DIR", str(tmp_path / "b"))
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path / "d"))
    assert config.cache_dir() == tmp_path / "c" and (tmp_path / "c").is_dir()
    assert config.build_dir() == tmp_path / "b" and (tmp_path / "b").is_dir()
    assert config.data_dir() == tmp_path / "d"


def test_results_path(monkeypatch, tmp_path):
    monkeypatch.delenv("COURSE_RESULTS", raising=False)
    assert config.results_path() is None
    monkeypatch.setenv("COURSE_RESULTS", str(tmp_path / "r.jsonl"))
    assert config.results_path() == Path(tmp_path / "r.jsonl")


def test_build_and_cache_dirs_are_git_ignored():
    ignored = (config.REPO_ROOT / ".gitignore").read_text().split()
    assert ".cache/" in ignored and "build/" in ignored


def test_package_exports_every_submodule_lazily():
    import importlib

    import course_utils

    assert set(course_utils.__all__) - {"__version__"} == course_utils._SUBMODULES
    for name in course_utils._SUBMODULES:
        assert getattr(course_utils, name) is importlib.import_module(f"course_utils.{name}")
    # every module and sub-package of the top level is listed, with its one line in the docstring
    top = {p.stem for p in (config.REPO_ROOT / "course_utils").glob("*.py") if not p.stem.startswith("_")}
    top |= {p.parent.name for p in (config.REPO_ROOT / "course_utils").glob("*/__init__.py")}
    assert top == course_utils._SUBMODULES, f"listed but missing, or missing from _SUBMODULES: {top ^ course_utils._SUBMODULES}"
    for name in top:
        assert f"- ``{name}``: " in course_utils.__doc__, f"course_utils/__init__.py's docstring does not describe {name}"


def test_environment_puts_values_back(monkeypatch):
    monkeypatch.setenv("COURSE_QUICK", "1")
    monkeypatch.delenv("COURSE_RESULTS", raising=False)
    with config.environment(COURSE_QUICK="0", COURSE_RESULTS="/tmp/x.jsonl"):
        assert config.is_quick() is False and os.environ["COURSE_RESULTS"] == "/tmp/x.jsonl"
    assert config.is_quick() is True and "COURSE_RESULTS" not in os.environ


def test_teaching_helpers_never_import_the_course_kit():
    """The kit runs the course and may use the helpers; the helpers (what notebooks import) never use the kit."""
    import ast

    package = config.REPO_ROOT / "course_utils"
    offenders = []
    for path in package.rglob("*.py"):
        rel = path.relative_to(package)
        if rel.parts[0] == "kit" or rel.name == "__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")] + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(n == "kit" or n.endswith(".kit") or ".kit." in n or n.startswith("kit.") for n in names):
                offenders.append(f"{rel}:{node.lineno}")
    assert not offenders, f"teaching helpers import course_utils.kit: {offenders}"


def test_precompiled_headers_lists_gch_and_pch_files_only(tmp_path):
    """GCC's .gch and clang's/Apple's .pch count, at any depth; other files and folders do not."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    gch, pch = tmp_path / "a" / "cpp_prefix.h.gch", tmp_path / "a" / "b" / "cpp_prefix.h.pch"
    for f in (gch, pch, tmp_path / "a" / "cpp_prefix.h", tmp_path / "lock"):
        f.write_bytes(b"x")
    (tmp_path / "folder.gch").mkdir()  # a folder named like a header is not one
    assert config.precompiled_headers(tmp_path) == sorted([gch, pch])
    assert config.precompiled_headers(tmp_path / "missing") == []


def test_precompiled_headers_defaults_to_torchs_folder(monkeypatch, tmp_path):
    (tmp_path / "h.gch").write_bytes(b"x")
    monkeypatch.setattr(config, "precompiled_header_dir", lambda: tmp_path)
    assert config.precompiled_headers() == [tmp_path / "h.gch"]
