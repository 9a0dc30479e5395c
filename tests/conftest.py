"""Shared fixtures: no network for unit tests, fresh compiler state, a headless plot backend."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from course_utils.kit import offline

NetworkBlocked = offline.NetworkBlocked

os.environ.setdefault("MPLBACKEND", "Agg")


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
