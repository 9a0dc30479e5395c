"""tools/compile_bytecode.py: the bytecode `make setup` writes after ``pip install --no-compile``."""

import subprocess
import sys

from course_utils import config

SCRIPT = config.REPO_ROOT / "tools" / "compile_bytecode.py"


def test_every_module_it_can_compile_gets_its_pyc_and_one_it_cannot_is_left_out(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("X = 1\n")
    (tmp_path / "pkg" / "good.py").write_text("def f():\n    return 2\n")
    (tmp_path / "pkg" / "future_syntax.py").write_text("def f(:\n")  # what this Python cannot compile
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "left out" in out.stdout and str(tmp_path) in out.stdout
    cache = tmp_path / "pkg" / "__pycache__"
    for name in ("__init__", "good"):
        assert (cache / f"{name}.{sys.implementation.cache_tag}.pyc").is_file()
    assert not list(cache.glob("future_syntax.*"))


def test_a_folder_that_compiles_cleanly_gets_no_note(tmp_path):
    (tmp_path / "m.py").write_text("Y = 3\n")
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"bytecode written for {tmp_path}"
    assert (tmp_path / "__pycache__" / f"m.{sys.implementation.cache_tag}.pyc").is_file()


def test_the_default_folders_are_this_pythons_site_packages():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import compile_bytecode
    finally:
        sys.path.remove(str(SCRIPT.parent))
    folders = compile_bytecode.site_packages()
    assert folders and all(f.is_dir() and "site-packages" in f.parts for f in folders)


def test_packages_own_test_suites_are_left_out_even_below_a_folder_named_tests(tmp_path):
    root = tmp_path / "tests" / "site"  # a "tests" folder above the one compiled does not count
    for rel in ("pkg/__init__.py", "pkg/tests/test_x.py", "pkg/sub/test/helper.py", "pkg/testing.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("Z = 4\n")
    out = subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    tag = sys.implementation.cache_tag
    assert (root / "pkg" / "__pycache__" / f"__init__.{tag}.pyc").is_file()
    assert (root / "pkg" / "__pycache__" / f"testing.{tag}.pyc").is_file()
    assert not (root / "pkg" / "tests" / "__pycache__").exists()
    assert not (root / "pkg" / "sub" / "test" / "__pycache__").exists()


def test_third_party_escape_warnings_are_silenced_as_pip_silences_them(tmp_path):
    # '\(' in a plain string: a DeprecationWarning up to Python 3.11, a SyntaxWarning from 3.12;
    # "-W always" would print either, and the forked or fork-server workers do the compiling.
    for i in range(4):
        (tmp_path / f"esc{i}.py").write_text("import re\nPAT = re.compile('a \\(b\\)')\n")
    out = subprocess.run([sys.executable, "-W", "always", str(SCRIPT), str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Warning" not in out.stderr, out.stderr
    for i in range(4):
        assert (tmp_path / "__pycache__" / f"esc{i}.{sys.implementation.cache_tag}.pyc").is_file()
