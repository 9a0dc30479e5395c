"""Files shipped in ``data/``: where they are, and whether they are intact.

``data/SHA256SUMS`` records each shipped file's sha256 (``sha256sum`` format).
A missing or altered file raises ``DataFileError`` naming the file and the
command that restores or rebuilds it. So does a file that matches its checksum but not
the format its loader expects (both were edited, or a bad file was shipped): the loaders
parse inside ``malformed_content`` and check what they read with ``malformed``.
"""

from __future__ import annotations

import hashlib
import pickle
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .. import config

CHECKSUM_FILE = "SHA256SUMS"

#: How to get each shipped file back when it is missing or corrupt.
REBUILD_COMMANDS = {
    "tiny_corpus.txt": "python -m course_utils data rebuild",
    "tiny_gpt.pt": "python tools/train_tiny_gpt.py",
}


class DataFileError(RuntimeError):
    """A shipped data file is missing or does not match its recorded checksum."""

    def __init__(self, name: str, problem: str, fix: str) -> None:
        self.name = name
        self.problem = problem
        self.fix = fix
        super().__init__(f"data/{name}: {problem}. {fix}")


def sha256_of(path: Path) -> str:
    """Return the hex sha256 of the file at ``path``."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def _checksum_line(line: str, number: int) -> tuple[str, str]:
    """Return (name, digest) of one ``sha256sum`` line; DataFileError when it is not one."""
    parts = line.split(maxsplit=1)
    if len(parts) != 2 or not _SHA256_RE.match(parts[0].lower()):
        raise DataFileError(
            CHECKSUM_FILE, f"line {number} is malformed ({line.strip()[:80]!r}): expected "
            "'<64 hex digits>  <file name>'", f"Restore it with `git checkout -- data/{CHECKSUM_FILE}`")
    return parts[1].strip().lstrip("*"), parts[0].lower()


def expected_checksums() -> dict[str, str]:
    """Return {file name: sha256} from ``data/SHA256SUMS``; DataFileError if missing or malformed."""
    path = config.data_dir() / CHECKSUM_FILE
    if not path.exists():
        raise DataFileError(CHECKSUM_FILE, "is missing",
                            f"Restore it with `git checkout -- data/{CHECKSUM_FILE}`")
    try:
        text = path.read_text(encoding="ascii")
    except UnicodeDecodeError as err:
        raise DataFileError(CHECKSUM_FILE, f"is not ASCII text ({err.reason} at byte {err.start})",
                            f"Restore it with `git checkout -- data/{CHECKSUM_FILE}`") from err
    sums = {}
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip() and not line.startswith("#"):
            name, digest = _checksum_line(line, number)
            sums[name] = digest
    return sums


def shipped_files() -> list[str]:
    """Return the names of the files listed in ``data/SHA256SUMS``."""
    return sorted(expected_checksums())


def fix_hint(name: str) -> str:
    """Return the command that brings ``data/<name>`` back."""
    rebuild = REBUILD_COMMANDS.get(name)
    restore = f"Restore it with `git checkout -- data/{name}`"
    return f"{restore}, or rebuild it with `{rebuild}`" if rebuild else restore


def malformed(name: str, expected: str, found: str) -> DataFileError:
    """Return the error for ``data/<name>`` whose content is not what its loader expects.

    ``expected`` says what the loader needs, ``found`` what it got. The file passed its
    checksum, so the checksum line was changed with it: the fix restores both.
    """
    return DataFileError(name, f"is malformed: expected {expected}, found {found}",
                         f"Restore it and its checksum with `git checkout -- data/{name} data/{CHECKSUM_FILE}`")


def _first_line(err: BaseException, limit: int = 160) -> str:
    """``TypeName: first line of the message``, cut to ``limit`` characters."""
    lines = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= limit else text[:limit - 3] + "..."


#: What a damaged file raises while it is parsed (json, text decoding, torch.load, indexing).
PARSE_ERRORS = (ValueError, KeyError, IndexError, TypeError, AttributeError, EOFError,
                pickle.UnpicklingError, RuntimeError)


@contextmanager
def malformed_content(name: str, expected: str) -> Iterator[None]:
    """Turn a parse error raised in the block into ``malformed(name, expected, ...)``.

    DataFileError passes through unchanged, so checks inside the block keep their message.
    """
    try:
        yield
    except DataFileError:
        raise
    except PARSE_ERRORS as err:
        raise malformed(name, expected, _first_line(err)) from err


def load_tensors(name: str, keys: Sequence[str]) -> dict[str, Any]:
    """Return the dict saved with ``torch.save`` in ``data/<name>``, after verifying its sha256.

    Read with ``weights_only=True`` (tensors and plain containers, no code). Raises
    DataFileError when the file cannot be read as such a dict or lacks one of ``keys``.
    """
    import torch

    path = verify(name)
    expected = f"a dict saved by torch.save with keys {', '.join(keys)}"
    with malformed_content(name, expected):
        saved = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(saved, dict):
        raise malformed(name, expected, f"a {type(saved).__name__}")
    missing = [k for k in keys if k not in saved]
    if missing:
        raise malformed(name, expected, f"no {', '.join(missing)} (keys: {', '.join(map(str, saved))})")
    return saved


def verify(name: str) -> Path:
    """Return the path of ``data/<name>`` after checking it exists and matches its sha256."""
    sums = expected_checksums()
    if name not in sums:
        raise DataFileError(name, f"is not a shipped file (known: {', '.join(sorted(sums))})",
                            "check the name")
    path = config.data_dir() / name
    if not path.exists():
        raise DataFileError(name, f"is missing (looked for {path})", fix_hint(name))
    actual = sha256_of(path)
    if actual != sums[name]:
        raise DataFileError(
            name, f"is corrupt: sha256 {actual[:12]}... does not match the recorded "
            f"{sums[name][:12]}...", fix_hint(name))
    return path
