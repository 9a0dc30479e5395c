"""Files shipped in ``data/``: where they are, and whether they are intact.

``data/SHA256SUMS`` records each shipped file's sha256 (``sha256sum`` format).
A missing or altered file raises ``DataFileError`` naming the file and the
command that restores or rebuilds it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

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


def expected_checksums() -> dict[str, str]:
    """Return {file name: sha256} from ``data/SHA256SUMS``."""
    path = config.data_dir() / CHECKSUM_FILE
    if not path.exists():
        raise DataFileError(CHECKSUM_FILE, "is missing",
                            f"restore it with `git checkout -- data/{CHECKSUM_FILE}`")
    sums = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            digest, name = line.split(maxsplit=1)
            sums[name.lstrip("*")] = digest
    return sums


def shipped_files() -> list[str]:
    """Return the names of the files listed in ``data/SHA256SUMS``."""
    return sorted(expected_checksums())


def fix_hint(name: str) -> str:
    """Return the command that brings ``data/<name>`` back."""
    rebuild = REBUILD_COMMANDS.get(name)
    restore = f"Restore it with `git checkout -- data/{name}`"
    return f"{restore}, or rebuild it with `{rebuild}`" if rebuild else restore


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
