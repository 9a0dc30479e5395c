"""Shared fixtures: no network for unit tests, fresh compiler state, a headless plot backend."""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterator

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")

_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex
_real_getaddrinfo = socket.getaddrinfo


class NetworkBlocked(RuntimeError):
    """A unit test tried to reach a non-loopback address."""


def _is_loopback(host: object) -> bool:
    if host in ("localhost", "", None):
        return True
    try:
        return ipaddress.ip_address(str(host)).is_loopback
    except ValueError:
        return False


def _guard(address: object) -> None:
    if isinstance(address, tuple) and address and _is_loopback(address[0]):
        return
    if isinstance(address, (str, bytes)):  # AF_UNIX sockets stay local
        return
    raise NetworkBlocked(f"unit tests may not use the network (tried {address!r})")


def _blocked_connect(self: socket.socket, address: object) -> None:
    _guard(address)
    return _real_connect(self, address)


def _blocked_connect_ex(self: socket.socket, address: object) -> int:
    _guard(address)
    return _real_connect_ex(self, address)


def _blocked_getaddrinfo(host: object, *args: object, **kwargs: object) -> list:
    if not _is_loopback(host):
        raise NetworkBlocked(f"unit tests may not resolve host names (tried {host!r})")
    return _real_getaddrinfo(host, *args, **kwargs)


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Block every connection and name lookup except loopback for the test's duration."""
    monkeypatch.setattr(socket.socket, "connect", _blocked_connect)
    monkeypatch.setattr(socket.socket, "connect_ex", _blocked_connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", _blocked_getaddrinfo)
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
