"""Shared fixtures: no network for unit tests, fresh compiler state, a headless plot backend."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from course_utils.kit import offline

NetworkBlocked = offline.NetworkBlocked

os.environ.setdefault("MPLBACKEND", "Agg")

# tests/data holds fixtures (executed notebook copies read by test_verdicts.py), not course notebooks:
# nbval must not collect and execute them. (A conftest.py inside tests/data would shadow this one's
# module name for `from conftest import ...`.)
collect_ignore_glob = ["data/*"]


@pytest.fixture(autouse=True)
def no_network() -> Iterator[None]:
    """Block every connection, datagram and name lookup except loopback for the test's duration."""
    with offline.blocked():
        yield


@pytest.fixture(autouse=True)
def fresh_compiler() -> Iterator[None]:
    """Reset Dynamo before and after each test so compiled state never leaks between tests."""
    import torch

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def results_file(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """Point COURSE_RESULTS at a fresh file and return its path."""
    path = tmp_path / "results.jsonl"
    monkeypatch.setenv("COURSE_RESULTS", str(path))
    return path


@pytest.fixture
def data_copy(tmp_path, monkeypatch):
    """A private copy of data/ that tests may damage (``COURSE_DATA_DIR`` points at it)."""
    import shutil

    from course_utils import config

    dst = tmp_path / "data"
    shutil.copytree(config.data_dir(), dst)
    monkeypatch.setenv("COURSE_DATA_DIR", str(dst))
    return dst


@pytest.fixture
def replace_data_file(data_copy):
    """Return ``replace(name, content)``: write ``content`` as ``data_copy/name`` and record its sha256 in
    the copy's SHA256SUMS, as a careless edit of both would, so only the loaders can catch it."""
    import hashlib

    from course_utils.data.files import verify

    def replace(name: str, content: bytes) -> None:
        (data_copy / name).write_bytes(content)
        sums = data_copy / "SHA256SUMS"
        digest = hashlib.sha256(content).hexdigest()
        lines = [f"{digest}  {name}" if ln.split()[-1] == name else ln for ln in sums.read_text().splitlines()]
        sums.write_text("\n".join(lines) + "\n")
        assert verify(name) == data_copy / name  # the checksum no longer catches it

    return replace
