"""Build and run the course's LibTorch trainer (``cpp/libtorch_mlp``) from Python, and read what it wrote.

The C++ program trains the digits MLP (``course_utils.models.MLP``) with ``torch::nn``,
``torch::optim`` and autograd, and runs a saved model under ``torch::InferenceMode``:

- ``build_trainer``: build it with ``cmake_build.build_project`` (``build/libtorch_mlp/<torch install>``).
- ``write_dataset``: hand it a train/test split, as four files in the course's tensor format.
- ``train``: run ``libtorch_mlp train`` and return a ``TrainRun`` (losses, epoch seconds, accuracy).
- ``parse_train_output``: the same, from the lines the program printed.
- ``load_weights``: its weights file as a state dict, read with ``torch.load(..., weights_only=True)``.
- ``infer``: run ``libtorch_mlp infer`` on a tensor and return the logits.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import config
from .cmake_build import Build, build_project, run_program
from .tensor_file import read_tensor, write_tensor

#: The C++ sources (main.cpp, CMakeLists.txt).
SOURCE_DIR = config.REPO_ROOT / "cpp" / "libtorch_mlp"
#: Name of the executable CMake produces.
BINARY_NAME = "libtorch_mlp"
#: The files ``write_dataset`` writes and ``libtorch_mlp train`` reads, in this order.
DATASET_FILES = ("x_train.bin", "y_train.bin", "x_test.bin", "y_test.bin")

_EPOCH = re.compile(r"^epoch (\d+) loss (\S+) seconds (\S+)$")
_ACCURACY = re.compile(r"^test accuracy (\d+)/(\d+)$")


@dataclass(frozen=True)
class TrainRun:
    """What one ``libtorch_mlp train`` run printed: per-epoch mean loss and seconds, test hits out of total."""

    losses: list[float]
    epoch_seconds: list[float]
    correct: int
    total: int
    weights: Path | None = None

    @property
    def accuracy(self) -> float:
        """Return the test accuracy, ``correct / total``."""
        return self.correct / self.total


def build_trainer(build_dir: str | Path | None = None, *, force: bool = False, timeout_s: float = 600) -> Build:
    """Return the ``Build`` of the LibTorch trainer, configuring and compiling it when needed
    (``cmake_build.build_project``: CppToolchainMissing without cmake or a compiler)."""
    return build_project(SOURCE_DIR, BINARY_NAME, build_dir, force=force, timeout_s=timeout_s)


def write_dataset(folder: str | Path, x_train: torch.Tensor, y_train: torch.Tensor,
                  x_test: torch.Tensor, y_test: torch.Tensor) -> Path:
    """Return ``folder`` after writing the split as ``DATASET_FILES`` (labels as float32).

    Raises ValueError when images and labels differ in number, or a label is not a whole
    number in [0, 2**24) (the integers float32 stores exactly).
    """
    for x, y, part in ((x_train, y_train, "train"), (x_test, y_test, "test")):
        if len(x) != len(y):
            raise ValueError(f"{part}: {len(x)} images but {len(y)} labels")
        if y.is_floating_point() and not torch.equal(y, y.round()):
            raise ValueError(f"{part}: labels must be whole numbers")
        if len(y) and (y.min() < 0 or y.max() >= 2**24):
            raise ValueError(f"{part}: labels must lie in [0, 2**24)")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, t in zip(DATASET_FILES, (x_train, y_train, x_test, y_test)):
        write_tensor(folder / name, t)
    return folder


def parse_train_output(text: str, weights: Path | None = None) -> TrainRun:
    """Return the ``TrainRun`` that ``libtorch_mlp train``'s printed ``text`` describes.

    Raises ValueError when the epochs are missing or out of order, or the accuracy line is missing.
    """
    losses, seconds, accuracy = [], [], None
    for line in text.splitlines():
        if match := _EPOCH.match(line.strip()):
            if int(match.group(1)) != len(losses) + 1:
                raise ValueError(f"epoch lines out of order at {line.strip()!r}")
            losses.append(float(match.group(2)))
            seconds.append(float(match.group(3)))
        elif match := _ACCURACY.match(line.strip()):
            accuracy = int(match.group(1)), int(match.group(2))
    if not losses:
        raise ValueError("the output has no 'epoch N loss L seconds S' lines")
    if accuracy is None or accuracy[1] == 0:
        raise ValueError("the output has no 'test accuracy C/N' line")
    return TrainRun(losses, seconds, accuracy[0], accuracy[1], weights)


def train(binary: str | Path, data_dir: str | Path, weights: str | Path, *, epochs: int, lr: float = 1e-3,
          batch: int = 64, seed: int = 0, hidden: int = 128, depth: int = 2, threads: int | None = None,
          timeout_s: float = 600) -> TrainRun:
    """Return the ``TrainRun`` of ``libtorch_mlp train`` on ``data_dir`` (see ``write_dataset``),
    saving the weights to ``weights``. ``threads`` (default: torch's current number) sets the
    C++ side's intra-op threads. Raises cmake_build.ProgramFailed with its message when it fails.
    """
    threads = torch.get_num_threads() if threads is None else threads
    out = run_program([binary, "train", data_dir, weights, "--epochs", str(epochs), "--lr", repr(float(lr)),
                       "--batch", str(batch), "--seed", str(seed), "--hidden", str(hidden),
                       "--depth", str(depth), "--threads", str(threads)], timeout_s=timeout_s)
    return parse_train_output(out, Path(weights))


def load_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Return the state dict in a weights file the C++ program saved, read with ``weights_only=True``.

    The program saves a tuple of (name, tensor) pairs (see its ``save_weights`` for why not a dict).
    Raises ValueError when the file holds anything else.
    """
    loaded = torch.load(path, weights_only=True)
    if not isinstance(loaded, tuple) or not all(
            isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], torch.Tensor)
            for p in loaded):
        raise ValueError(f"{path} does not hold (name, tensor) pairs; got {type(loaded).__name__}")
    return dict(loaded)


def infer(binary: str | Path, weights: str | Path, x: torch.Tensor, *, work_dir: str | Path | None = None,
          timeout_s: float = 120) -> torch.Tensor:
    """Return the logits ``libtorch_mlp infer`` computes for ``x`` with the model in ``weights``.

    Input and output travel through files in a private folder inside ``work_dir`` (default: next
    to the binary), removed afterwards. Raises cmake_build.ProgramFailed when the program fails.
    """
    work = Path(work_dir) if work_dir is not None else Path(binary).parent
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work, prefix="infer-") as private:
        in_path = write_tensor(Path(private) / "input.bin", x)
        out_path = Path(private) / "output.bin"
        run_program([binary, "infer", weights, in_path, out_path], timeout_s=timeout_s)
        return read_tensor(out_path)
