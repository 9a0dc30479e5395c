"""Refuse network access from Python, except loopback: "nothing downloads at run time", enforced.

The guard is a Python audit hook (PEP 578). CPython raises an audit event inside every socket
operation that can reach another machine, whichever way it is called (``socket.socket``,
``_socket.socket``, ``socket.create_connection``, asyncio, urllib, httpx ...), and the hook
refuses the ones that leave loopback:

- connections and datagrams: ``connect``, ``connect_ex``, ``sendto``, ``sendmsg``;
- name lookups: ``getaddrinfo``, ``gethostbyname``, ``gethostbyname_ex``, ``gethostbyaddr``,
  ``getnameinfo`` (loopback names and this machine's own name are allowed).

Where it is on: every unit test (``tests/conftest.py``); and every Python process started with
``child_env()`` in its environment, which ``tools/offline/sitecustomize.py`` reads at start-up.
The root ``conftest.py`` sets it for everything ``make test`` starts (the notebook kernels too),
and ``make workshop-check`` for its kernels.

What it is not: a sandbox. It patches nothing; it sees only the audit events that Python's own
socket module raises in *this* process, and only the outgoing ones listed above. These paths are
not stopped:

- native code that calls the operating system itself: C/C++ extensions and the libraries they
  link (libcurl, gRPC's core, torch's C++ ``TCPStore`` and gloo), ``ctypes`` calls to libc's
  ``connect`` or ``getaddrinfo``; none of them raises a Python audit event;
- event loops written in C, such as uvloop (libuv opens and resolves its own sockets); asyncio's
  default loop goes through the socket module and is caught;
- other processes: programs that are not Python (``curl``, ``git``, a shell's ``/dev/tcp``) and
  Python processes started without ``child_env()`` (an environment that was replaced, or
  ``python -I``, ``-E`` or ``-S``, which skip ``PYTHONPATH`` or ``sitecustomize``);
- incoming traffic and its replies: ``bind``, ``listen`` and ``accept`` are not checked, so a
  server bound to ``0.0.0.0`` is reachable from the network, and ``send`` on a connected socket
  carries no address; sockets connected before the guard was on, or received as a file
  descriptor, keep working;
- anything relayed by a local listener: loopback and Unix-domain sockets are allowed, so a
  proxy, tunnel or daemon listening on this machine (an HTTP proxy on 127.0.0.1, ``ssh -D``,
  Docker's socket) can carry traffic out;
- code that switches it off: any code in the process can call ``uninstall()``.

It catches accidental downloads, which is what a course needs day to day. Where "it ran with no
network" must be a fact (an exam, CI, a readiness check you will rely on), remove the network
for real in an empty Linux network namespace: ``make workshop-check NETNS=1``, or for any command
``unshare -rn python -m course_utils.kit.netns CMD ...`` (``course_utils.kit.netns``).
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from .. import config

#: Folder with the sitecustomize.py that installs the guard when COURSE_OFFLINE=1.
SITE_DIR = config.REPO_ROOT / "tools" / "offline"

_state: dict[str, Any] = {"on": False, "hooked": False, "hostname": None}


class NetworkBlocked(RuntimeError):
    """Code tried to reach a non-loopback address while the network was blocked."""


def is_loopback(host: object) -> bool:
    """Return True for localhost, an empty host and loopback IP addresses (IPv4-mapped too)."""
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if host in ("localhost", "", None):
        return True
    try:
        ip = ipaddress.ip_address(str(host).split("%")[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def is_local_name(host: object) -> bool:
    """Return True when looking ``host`` up stays on this machine: loopback or its own name."""
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    own = _state["hostname"]
    return is_loopback(host) or (isinstance(host, str) and own is not None and host.lower() == own)


def check_address(address: object) -> None:
    """Return None when ``address`` is loopback or a local (AF_UNIX) path; else raise NetworkBlocked."""
    if isinstance(address, tuple) and address and is_loopback(address[0]):
        return
    if isinstance(address, (str, bytes)):
        return
    raise NetworkBlocked(f"the course runs offline; something tried to reach {address!r}")


def check_lookup(host: object) -> None:
    """Return None when ``host`` is a local name; else raise NetworkBlocked."""
    if not is_local_name(host):
        raise NetworkBlocked(f"the course runs offline; something tried to look up {host!r}")


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """The audit hook: check the socket events that can leave this machine, while switched on."""
    if not _state["on"] or not event.startswith("socket."):
        return
    if event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
        if args[1] is not None:  # sendmsg on a connected socket has no address
            check_address(args[1])
    elif event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr"):
        check_lookup(args[0])
    elif event == "socket.getnameinfo":
        check_lookup(args[0][0] if isinstance(args[0], tuple) and args[0] else args[0])


def install() -> None:
    """Block the network for the rest of this process (idempotent)."""
    if not _state["hooked"]:
        _state["hostname"] = socket.gethostname().lower()
        sys.addaudithook(_audit)  # audit hooks cannot be removed; uninstall() switches it off
        _state["hooked"] = True
    _state["on"] = True


def uninstall() -> None:
    """Let network calls through again."""
    _state["on"] = False


def is_installed() -> bool:
    """Return True while the guard refuses network access in this process."""
    return bool(_state["on"])


@contextmanager
def blocked() -> Iterator[None]:
    """Block the network inside a ``with`` block, then put back whatever was there before."""
    before = _state["on"]
    install()
    try:
        yield
    finally:
        _state["on"] = before


def child_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the variables that start Python child processes (notebook kernels) with the guard on.

    ``COURSE_OFFLINE=1``, and ``PYTHONPATH`` with ``tools/offline`` (its sitecustomize.py) and
    the repository first, then whatever ``environ`` (default ``os.environ``) already had.
    """
    return {"COURSE_OFFLINE": "1", "PYTHONPATH": config.child_pythonpath(SITE_DIR, environ=environ)}
