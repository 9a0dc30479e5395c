"""The offline guard: every way Python reaches past loopback is refused; loopback still works.

The guard is on for every unit test (tests/conftest.py) and, through ``offline.child_env()``
(set by the root conftest.py and by ``make workshop-check``), in every Python process the tests
start, notebook kernels included. The addresses and names below are reserved for documentation
(192.0.2.0/24, ``.invalid``): even if the guard failed, nothing real would be reached.
"""

from __future__ import annotations

import _socket
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import uuid

import nbformat
import pytest

from course_utils import config
from course_utils.kit import offline

OUTSIDE = ("192.0.2.1", 9)
NAME = "example.invalid"


def _tcp_connect() -> None:
    with socket.socket() as s:
        s.connect(OUTSIDE)


def _tcp_connect_ex() -> None:
    with socket.socket() as s:
        s.connect_ex(OUTSIDE)


def _udp_sendto() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"x", OUTSIDE)


def _udp_sendto_with_flags() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"x", 0, OUTSIDE)


def _udp_sendmsg() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendmsg([b"x"], [], 0, OUTSIDE)


def _raw_connect() -> None:
    s = _socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.connect(OUTSIDE)
    finally:
        s.close()


def _raw_sendto() -> None:
    s = _socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.sendto(b"x", OUTSIDE)
    finally:
        s.close()


async def _asyncio_open() -> None:
    await asyncio.open_connection(NAME, 443)


BLOCKED = {
    "socket.connect": _tcp_connect,
    "socket.connect_ex": _tcp_connect_ex,
    "socket.sendto (UDP)": _udp_sendto,
    "socket.sendto with flags": _udp_sendto_with_flags,
    "socket.sendmsg (UDP)": _udp_sendmsg,
    "socket.getaddrinfo": lambda: socket.getaddrinfo(NAME, 443),
    "socket.getaddrinfo of an IP": lambda: socket.getaddrinfo(OUTSIDE[0], 443),
    "socket.gethostbyname": lambda: socket.gethostbyname(NAME),
    "socket.gethostbyname_ex": lambda: socket.gethostbyname_ex(NAME),
    "socket.gethostbyaddr": lambda: socket.gethostbyaddr(OUTSIDE[0]),
    "socket.getnameinfo": lambda: socket.getnameinfo(OUTSIDE, 0),
    "socket.create_connection (IP)": lambda: socket.create_connection(OUTSIDE, timeout=1),
    "socket.create_connection (name)": lambda: socket.create_connection((NAME, 443), timeout=1),
    "_socket.socket.connect": _raw_connect,
    "_socket.socket.sendto": _raw_sendto,
    "_socket.getaddrinfo": lambda: _socket.getaddrinfo(NAME, 443),
    "asyncio.open_connection (lookup in a worker thread)": lambda: asyncio.run(_asyncio_open()),
}


@pytest.mark.parametrize("what", sorted(BLOCKED))
def test_every_way_out_is_refused(what):
    assert offline.is_installed()
    with pytest.raises(offline.NetworkBlocked, match="runs offline"):
        BLOCKED[what]()


def test_loopback_still_works():
    with socket.create_server(("127.0.0.1", 0)) as server:
        with socket.create_connection(server.getsockname(), timeout=5) as client:
            conn, _ = server.accept()
            with conn:
                client.sendall(b"ping")
                assert conn.recv(4) == b"ping"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        rx.bind(("127.0.0.1", 0))
        tx.sendto(b"udp", rx.getsockname())
        tx.sendmsg([b"msg"], [], 0, rx.getsockname())
        assert rx.recv(3) == b"udp" and rx.recv(3) == b"msg"
    assert socket.gethostbyname("localhost").startswith("127.")
    assert socket.getaddrinfo("127.0.0.1", 80)
    a, b = socket.socketpair()  # local (AF_UNIX) sockets are not the network
    with a, b:
        a.sendall(b"unix")
        assert b.recv(4) == b"unix"
    # the machine's own name resolves locally; torch.distributed asks for it (socket.getfqdn)
    assert isinstance(socket.getfqdn(), str)


def test_address_rules():
    offline.check_address(("127.0.0.1", 80))
    offline.check_address(("::1", 80, 0, 0))
    offline.check_address(("::ffff:127.0.0.1", 80, 0, 0))
    offline.check_address("/tmp/some.sock")
    for outside in [("93.184.216.34", 443), ("2001:db8::1", 443, 0, 0), ("10.0.0.1", 22)]:
        with pytest.raises(offline.NetworkBlocked):
            offline.check_address(outside)


def test_blocked_context_restores_the_previous_state():
    offline.uninstall()
    try:
        assert not offline.is_installed()
        with offline.blocked():
            assert offline.is_installed()
            with pytest.raises(offline.NetworkBlocked):
                socket.getaddrinfo(NAME, 443)
        assert not offline.is_installed()
    finally:
        offline.install()


def _clean_env() -> dict[str, str]:
    """This environment without the guard's variables (so a child only has what we give it)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("COURSE_OFFLINE", "PYTHONPATH", "COURSE_EMULATOR")}
    env["COURSE_QUICK"] = "1"
    return env


CHILD_CODE = """
import socket
from course_utils.kit import offline
print("installed", offline.is_installed())
try:
    socket.getaddrinfo("example.invalid", 443)
except offline.NetworkBlocked:
    print("refused")
"""


def test_child_env_turns_the_guard_on_in_child_processes():
    env = _clean_env()
    plain = subprocess.run([sys.executable, "-c", "from course_utils.kit import offline; "
                            "print('installed', offline.is_installed())"],
                           env=env, capture_output=True, text=True, timeout=120, check=True)
    assert plain.stdout.split() == ["installed", "False"]
    guarded = subprocess.run([sys.executable, "-c", CHILD_CODE], env={**env, **offline.child_env(env)},
                             capture_output=True, text=True, timeout=120, check=True)
    assert guarded.stdout.split() == ["installed", "True", "refused"], guarded.stderr


def test_child_env_keeps_the_existing_path_once():
    env = offline.child_env({"PYTHONPATH": "/somewhere"})
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[0] == str(offline.SITE_DIR) and "/somewhere" in parts and env["COURSE_OFFLINE"] == "1"
    assert offline.child_env({"PYTHONPATH": env["PYTHONPATH"]}) == env


KERNEL_CELLS = [
    # one cell: refuse to go on (and so to try the network) unless the guard is on
    "import os, socket\n"
    "from course_utils.kit import offline\n"
    "assert os.environ.get('COURSE_OFFLINE') == '1' and offline.is_installed()\n"
    "for attempt in (lambda: socket.create_connection(('192.0.2.1', 9), timeout=1),\n"
    "                lambda: socket.getaddrinfo('example.invalid', 443)):\n"
    "    try:\n"
    "        attempt()\n"
    "    except offline.NetworkBlocked:\n"
    "        pass\n"
    "    else:\n"
    "        raise AssertionError('the kernel reached the network')\n",
    "server = socket.create_server(('127.0.0.1', 0))\n"
    "client = socket.create_connection(server.getsockname(), timeout=5)\n"
    "conn, _ = server.accept()\n"
    "client.sendall(b'ok')\n"
    "assert conn.recv(2) == b'ok'\n",
]


def test_make_test_starts_notebook_kernels_offline():
    """`make test` runs plain pytest: the notebook kernels nbval starts must have the guard on.

    A tiny notebook runs under the repository's pytest configuration (root conftest.py,
    pyproject's nbval options) in a child pytest whose environment has no guard variables."""
    folder = config.REPO_ROOT / "build" / "test-offline-kernel"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"offline_{uuid.uuid4().hex[:8]}.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in KERNEL_CELLS]
    nbformat.write(nb, path)
    try:
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", str(path)], cwd=config.REPO_ROOT,
                             env=_clean_env(), capture_output=True, text=True, timeout=300)
    finally:
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # another run may be using it
            folder.rmdir()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "2 passed" in out.stdout
