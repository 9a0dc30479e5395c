"""Refuse network access from Python, except loopback: "nothing downloads at run time", enforced.

The unit tests block the network through this module; ``make workshop-check`` runs every
notebook with it switched on in the kernel (``COURSE_OFFLINE=1`` and
``tools/offline/sitecustomize.py`` on ``PYTHONPATH``), so a cell that tries to download
fails loudly instead of working only on a connected machine. Loopback stays open: the
serving notebook talks to its own server on 127.0.0.1.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_REAL = {"connect": socket.socket.connect, "connect_ex": socket.socket.connect_ex,
         "getaddrinfo": socket.getaddrinfo}


class NetworkBlocked(RuntimeError):
    """Code tried to reach a non-loopback address while the network was blocked."""


def is_loopback(host: object) -> bool:
    """True for localhost, an empty host and loopback IP addresses."""
    if host in ("localhost", "", None):
        return True
    try:
        return ipaddress.ip_address(str(host)).is_loopback
    except ValueError:
        return False


def check_address(address: object) -> None:
    """Raise NetworkBlocked unless ``address`` is loopback or a local (AF_UNIX) socket path."""
    if isinstance(address, tuple) and address and is_loopback(address[0]):
        return
    if isinstance(address, (str, bytes)):
        return
    raise NetworkBlocked(f"the course runs offline; something tried to connect to {address!r}")


def guarded_connect(self: socket.socket, address: Any) -> None:
    """``socket.connect`` that refuses non-loopback addresses."""
    check_address(address)
    return _REAL["connect"](self, address)


def guarded_connect_ex(self: socket.socket, address: Any) -> int:
    """``socket.connect_ex`` that refuses non-loopback addresses."""
    check_address(address)
    return _REAL["connect_ex"](self, address)


def guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> list:
    """``socket.getaddrinfo`` that refuses to resolve anything but loopback names."""
    if not is_loopback(host):
        raise NetworkBlocked(f"the course runs offline; something tried to look up {host!r}")
    return _REAL["getaddrinfo"](host, *args, **kwargs)


def install() -> None:
    """Block the network for the rest of this process (idempotent)."""
    socket.socket.connect = guarded_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = guarded_connect_ex  # type: ignore[method-assign]
    socket.getaddrinfo = guarded_getaddrinfo


def uninstall() -> None:
    """Restore the real socket functions."""
    socket.socket.connect = _REAL["connect"]  # type: ignore[method-assign]
    socket.socket.connect_ex = _REAL["connect_ex"]  # type: ignore[method-assign]
    socket.getaddrinfo = _REAL["getaddrinfo"]


@contextmanager
def blocked() -> Iterator[None]:
    """Block the network inside a ``with`` block, then put back whatever was there before."""
    before = (socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo)
    install()
    try:
        yield
    finally:
        socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = before  # type: ignore[method-assign]
