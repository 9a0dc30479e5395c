# Google Colab only: the next lines set the course up when this notebook runs in Colab (they clone the
# course's tagged release, install it beside Colab's own torch and make data/ available). Anywhere
# else this cell prints one line and does nothing. `python -m course_utils.kit.colab sync` writes it
# into every notebook, from course_utils/kit/colab_cell.py: edit it there, never in a notebook.
import sys

if "google.colab" in sys.modules:
    import importlib.metadata
    import os
    import pathlib
    import re
    import subprocess
    import tempfile

    COURSE_REPOSITORY = "https://github.com/YOUR-ORG/YOUR-REPOSITORY"
    COURSE_RELEASE = "v0.1.0"
    TORCH_FLOOR = (2, 11)
    SETUPTOOLS_FLOOR = 77  # what pyproject.toml's build needs; an older one is replaced in pip's build env

    def _version(dist):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    def _release(version, parts):
        return tuple(int(p) for p in re.findall(r"\d+", version or "0.0.0")[:parts])

    home = pathlib.Path(os.environ.get("COURSE_COLAB_HOME", "/content/pytorch2-course"))
    repository = os.environ.get("COURSE_COLAB_REPOSITORY", COURSE_REPOSITORY)
    if not (home / "course_utils").is_dir():
        if "YOUR-ORG" in repository:
            raise SystemExit("This copy of the course names no repository to install from: set "
                             "[project.urls] Repository in pyproject.toml and run "
                             "`python -m course_utils.kit.colab sync`, or set COURSE_COLAB_REPOSITORY.")
        subprocess.run(["git", "clone", "--quiet", "--depth", "1", "--branch", COURSE_RELEASE,
                        repository, str(home)], check=True)
    if _version("pytorch2-course") is None:
        torch_version = _version("torch")
        found = _release(torch_version, 2)
        # Keep Colab's torch (a CUDA build matched to its GPU) unless it is older than the course's floor.
        keep = [f"{d}=={_version(d)}" for d in ("torch", "torchvision", "torchaudio")
                if _version(d) is not None and found >= TORCH_FLOOR]
        if found < TORCH_FLOOR:
            print(f"Colab's torch {torch_version} is older than the course's floor "
                  f"{'.'.join(map(str, TORCH_FLOOR))}: pip installs a newer one (several minutes).")
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as pins:
            pins.write("\n".join(keep) + "\n")
        # Build with the runtime's setuptools when it is new enough (nothing to download); else pip fetches one.
        isolation = [] if _release(_version("setuptools"), 1) < (SETUPTOOLS_FLOOR,) else ["--no-build-isolation"]
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *isolation,
                        "-c", pins.name, "-e", str(home)], check=True)
    if str(home) not in sys.path:
        sys.path.insert(0, str(home))  # the editable install is seen by new processes; this one needs the path
    os.chdir(home / "notebooks")
    print(f"Colab: the course {COURSE_RELEASE} is installed from {home} (torch {_version('torch')}); "
          f"its data/ is {home / 'data'}.")
else:
    print("Not running in Google Colab: this cell has nothing to do here.")
