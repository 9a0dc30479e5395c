"""The Open-in-Colab first cell: one source in every notebook, a no-op off Colab, and its install path.

The install path is exercised offline: a local git repository stands in for the course's GitHub
repository (a copy of this checkout's tracked files, tagged with the release the cell installs), a
fresh virtual environment stands in for Colab's runtime (its "preinstalled" packages are this
`.venv`'s, minus the course itself, reached through a ``.pth`` file, and a ``google.colab`` module is
put in ``sys.modules`` at start-up), and pip may not use an index (``PIP_NO_INDEX=1``). Notebook 00
then runs there in quick mode, importing ``course_utils`` from the clone the cell made.

What this cannot show: pip downloading what Colab lacks (ray, gradio, onnxruntime, ...), and
Colab's own torch build; the course has not been run in Colab itself.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import pytest

from course_utils import config
from course_utils.kit import colab, sources

FAKE_COLAB = "import sys, types; sys.modules.setdefault('google.colab', types.ModuleType('google.colab'))"
OFF_COLAB_LINE = "Not running in Google Colab: this cell has nothing to do here.\n"


def run_cell(tmp_path: Path, *, fake_colab: bool, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run the cell in a fresh interpreter in ``tmp_path`` and print the directory it ends in."""
    prelude = FAKE_COLAB + "\n" if fake_colab else ""
    script = prelude + colab.cell_text() + "\nimport os\nprint('cwd=' + os.getcwd())\n"
    return subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120, check=False)


def test_every_notebook_carries_the_same_cell_first():
    assert colab.check(sources.notebooks()) == []


def test_the_cell_states_pyprojects_floor_release_and_repository():
    text = colab.cell_text()
    assert colab.cell_floor(text) == colab.torch_floor()
    assert colab.cell_setuptools_floor(text) == colab.setuptools_floor()
    assert f'COURSE_RELEASE = "{colab.release()}"' in text
    assert f'COURSE_REPOSITORY = "{colab.repository()}"' in text


def test_off_colab_the_cell_prints_one_line_and_touches_nothing(tmp_path):
    done = run_cell(tmp_path, fake_colab=False, env={"COURSE_COLAB_HOME": str(tmp_path / "home")})
    assert done.returncode == 0, done.stderr
    assert done.stdout == OFF_COLAB_LINE + f"cwd={tmp_path}\n"
    assert list(tmp_path.iterdir()) == []


def test_in_colab_with_the_course_installed_it_only_changes_into_the_notebooks(tmp_path):
    # this .venv has the course installed (editable) and REPO_ROOT holds it: nothing to clone or install
    done = run_cell(tmp_path, fake_colab=True, env={"COURSE_COLAB_HOME": str(config.REPO_ROOT)})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"Colab: the course {colab.release()} is installed from {config.REPO_ROOT}")
    assert lines[-1] == f"cwd={config.REPO_ROOT / 'notebooks'}"
    assert list(tmp_path.iterdir()) == []


def test_in_colab_without_a_repository_url_it_says_what_to_set(tmp_path):
    done = run_cell(tmp_path, fake_colab=True, env={"COURSE_COLAB_HOME": str(tmp_path / "home"),
                                                    "COURSE_COLAB_REPOSITORY": colab.PLACEHOLDER_REPOSITORY})
    assert done.returncode != 0
    assert "names no repository to install from" in done.stderr
    assert "COURSE_COLAB_REPOSITORY" in done.stderr


def test_sync_inserts_before_the_first_code_cell_and_check_finds_each_drift(tmp_path):
    nb_path = tmp_path / "99_example.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 99 · Example"), nbformat.v4.new_code_cell("x = 1"),
                nbformat.v4.new_code_cell("print(x)")]
    nbformat.write(nb, nb_path)
    assert colab.check([nb_path]) == [f"99_example.ipynb: no code cell tagged '{colab.TAG}'"]

    assert colab.sync([nb_path]) == [nb_path]
    synced = nbformat.read(nb_path, as_version=4)
    assert [c.cell_type for c in synced.cells] == ["markdown", "code", "code", "code"]
    assert synced.cells[1].source == colab.cell_text()
    assert synced.cells[1].outputs[0]["text"] == OFF_COLAB_LINE
    assert colab.check([nb_path]) == []
    assert sources.out_of_sync([nb_path]) == []          # the twin was written too
    assert colab.sync([nb_path]) == []                    # idempotent

    synced.cells[1].source += "\n# edited by hand"
    synced.cells.insert(1, nbformat.v4.new_code_cell("y = 2"))
    nbformat.write(synced, nb_path)
    found = colab.check([nb_path])
    assert any("first code cell is cell 2" in f for f in found), found
    assert any("differs from colab_cell.py" in f for f in found), found
    colab.sync([nb_path])
    assert colab.check([nb_path]) == []
    assert sum(colab.TAG in c.metadata.get("tags", []) for c in nbformat.read(nb_path, as_version=4).cells) == 1


def test_sync_and_check_reject_what_is_not_a_notebook(tmp_path, capsys):
    assert colab.main(["check", str(tmp_path / "missing.ipynb")]) == 2
    assert "not a notebook" in capsys.readouterr().err


def _origin(tmp_path: Path) -> Path:
    """A git repository holding this checkout's tracked files (as they are now), tagged with the release."""
    origin = tmp_path / "origin"
    tracked = subprocess.run(["git", "-C", str(config.REPO_ROOT), "ls-files", "-z"], capture_output=True,
                             check=True).stdout.decode().split("\0")
    for rel in filter(None, tracked):
        src = config.REPO_ROOT / rel
        if src.is_file():
            (origin / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, origin / rel)
    git = ["git", "-C", str(origin), "-c", "user.name=test", "-c", "user.email=test@example.invalid"]
    subprocess.run(["git", "init", "--quiet", str(origin)], check=True)
    subprocess.run([*git, "add", "--all"], check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "the course"], check=True)
    subprocess.run([*git, "tag", colab.release()], check=True)
    return origin


def _colab_like_venv(tmp_path: Path) -> Path:
    """A fresh venv whose "preinstalled" packages are this .venv's (pip and setuptools included, the course
    not), with google.colab set. Without pip of its own, so the runtime's recent setuptools builds the course
    (the cell's no-build-isolation path: an isolated build would need an index)."""
    venv = tmp_path / "colab-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    preinstalled = tmp_path / "preinstalled"
    preinstalled.mkdir()
    ours = Path(sysconfig.get_path("purelib"))
    for entry in ours.iterdir():
        name = entry.name.lower()
        if name.startswith(("pytorch2_course", "__editable__", "course_utils")) or name.endswith(".pth"):
            continue
        (preinstalled / entry.name).symlink_to(entry)
    (site / "colab_runtime.pth").write_text(f"{preinstalled}\n{FAKE_COLAB}\n", encoding="utf-8")
    return python


def test_notebook_00_runs_after_the_cell_installs_the_course_from_a_local_release(tmp_path, monkeypatch):
    from nbclient import NotebookClient

    origin = _origin(tmp_path)
    python = _colab_like_venv(tmp_path)
    kernels = tmp_path / "jupyter" / "kernels" / "colab-sim"
    kernels.mkdir(parents=True)
    spec = {"argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Colab (simulated)", "language": "python"}
    (kernels / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    home = tmp_path / "content" / "pytorch2-course"
    for key in [k for k in os.environ if k.startswith(("COURSE_", "PYTHONPATH"))]:
        monkeypatch.delenv(key)
    for key, value in {"JUPYTER_PATH": str(tmp_path / "jupyter"), "COURSE_QUICK": "1",
                       "COURSE_COLAB_HOME": str(home), "COURSE_COLAB_REPOSITORY": str(origin),
                       "COURSE_RESULTS": str(tmp_path / "results.jsonl"), "COURSE_PROGRESS": "/dev/null",
                       "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}.items():
        monkeypatch.setenv(key, value)

    nb = nbformat.read(config.REPO_ROOT / "notebooks" / "00_setup.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(
        "import course_utils, os, torch\nprint(course_utils.__file__)\nprint(os.getcwd())\nprint(torch.__file__)"))
    run_dir = tmp_path / "opened"
    run_dir.mkdir()
    NotebookClient(nb, kernel_name="colab-sim", timeout=600, resources={"metadata": {"path": str(run_dir)}}).execute()

    setup = next(c for c in nb.cells if colab.TAG in c.metadata.get("tags", []))
    printed = "".join(o.get("text", "") for o in setup.outputs)
    assert f"Colab: the course {colab.release()} is installed from {home}" in printed, printed
    assert (home / "data").is_dir() and (home / ".git").is_dir()
    module, cwd, torch_file = "".join(o.get("text", "") for o in nb.cells[-1].outputs).split()
    assert Path(module).is_relative_to(home), module
    assert cwd == str(home / "notebooks")
    assert Path(torch_file).resolve().is_relative_to(Path(sysconfig.get_path("purelib")).resolve())
    # pip kept the "preinstalled" torch: nothing torch-like was installed into the fresh environment
    fresh_site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                     capture_output=True, text=True, check=True).stdout.strip())
    assert not [p.name for p in fresh_site.iterdir() if p.name.lower().startswith("torch")]
    assert [p.name for p in fresh_site.glob("*.dist-info")] == [f"pytorch2_course-{colab.project()['version']}.dist-info"]
    # a new process in that environment finds the course through the editable install the cell made
    where = subprocess.run([str(python), "-c", "import course_utils; print(course_utils.__file__)"],
                           capture_output=True, text=True, check=True, cwd=tmp_path).stdout.strip()
    assert Path(where).is_relative_to(home), where


@pytest.mark.parametrize(("text", "floor"), [("torch>=3.0", (3, 0)), ("torch >= 2.11, <3", (2, 11))])
def test_torch_floor_reads_the_requirement(tmp_path, text, floor):
    (tmp_path / "pyproject.toml").write_text(
        f'[project]\nname = "x"\nversion = "1.2.3"\ndependencies = ["numpy", "{text}"]\n', encoding="utf-8")
    assert colab.torch_floor(tmp_path) == floor
    assert colab.release(tmp_path) == "v1.2.3"
    assert colab.repository(tmp_path) == colab.PLACEHOLDER_REPOSITORY
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "1"\ndependencies = ["numpy"]\n',
                                             encoding="utf-8")
    with pytest.raises(ValueError, match="no `torch>=X.Y`"):
        colab.torch_floor(tmp_path)
