"""Which server answered: the port a child server binds itself, and the token that proves it is ours.

On a shared host (a classroom server, a JupyterHub) every learner's servers listen on the same
loopback interface. A parent that picks a "free" port and hands it to its child races every other
learner: the port can be taken before the child binds it, and then the parent's health check
reaches someone else's server. So the course's children bind their own port (``listen_socket``:
port 0 for any free one, or the one asked for) and report the port they got (``report_port``:
one line in a file the parent named in ``PORT_FILE_ENV``); and each parent gives its child a
random token (``INSTANCE_ENV``), which the child's ``/health`` sends back in the
``INSTANCE_HEADER`` response header. A parent accepts health only with its own token.

The token identifies a server; it is not a password (any client of the server can read it).
"""

from __future__ import annotations

import errno
import os
import secrets
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Environment variable holding the token the child's ``/health`` sends back.
INSTANCE_ENV = "COURSE_SERVER_INSTANCE"
#: Environment variable naming the file where the child writes the port it bound.
PORT_FILE_ENV = "COURSE_SERVER_PORT_FILE"
#: Response header of ``/health`` that carries the token.
INSTANCE_HEADER = "x-course-instance"


class PortError(RuntimeError):
    """The server cannot listen on the port it was asked for; the message says what to do."""


def new_token() -> str:
    """Return a fresh random token (32 hex digits) for one server process."""
    return secrets.token_hex(16)


def instance_token(environ: Mapping[str, str] | None = None) -> str:
    """Return this process's token: ``$COURSE_SERVER_INSTANCE`` if set, else a fresh random one."""
    environ = os.environ if environ is None else environ
    return environ.get(INSTANCE_ENV) or new_token()


def listen_socket(host: str, port: int) -> socket.socket:
    """Return a TCP socket bound to ``host``:``port`` and listening (``port`` 0: any free port).

    ``PortError`` (one line naming the port and the fix) when the port is taken or not allowed.
    Accepted connections inherit ``TCP_NODELAY`` from the listener, so small streamed chunks leave
    at once whichever event loop serves them.
    """
    address = host.strip("[]")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if os.name == "posix":  # restart at once after a stop (TIME_WAIT); never shares a listener here
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((address, port))
        sock.listen(2048)
    except OSError as err:
        sock.close()
        shown = f"[{address}]" if family == socket.AF_INET6 else address
        if err.errno == errno.EADDRINUSE:
            raise PortError(f"port {port} on {shown} is in use (another program, perhaps another user's "
                            f"server, listens there): choose another with --port N, or --port 0 for "
                            f"any free port") from None
        if err.errno == errno.EACCES:
            raise PortError(f"port {port} on {shown} is not allowed for this user (ports below 1024 "
                            f"need privileges): use --port 0 for any free port, or --port N above 1023") from None
        raise PortError(f"cannot listen on {shown}:{port}: {err.strerror or err}") from None
    return sock


def report_port(port: int, environ: Mapping[str, str] | None = None) -> None:
    """Write ``port`` and a newline to the file named by ``$COURSE_SERVER_PORT_FILE`` (nothing if unset).

    The parent created that file (private to its user); the newline tells it the line is whole.
    """
    environ = os.environ if environ is None else environ
    path = environ.get(PORT_FILE_ENV)
    if path:
        with open(path, "w", encoding="ascii") as out:
            out.write(f"{int(port)}\n")


def read_reported_port(path: str | os.PathLike[str]) -> int | None:
    """Return the port the child wrote to ``path``, or None while it has written no whole line."""
    try:
        text = Path(path).read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    if not text.endswith("\n"):
        return None
    try:
        port = int(text.strip())
    except ValueError:
        return None
    return port if 0 < port < 65536 else None


class ResponseHeader:
    """ASGI middleware: adds the header ``name: value`` to every HTTP response of ``app``."""

    def __init__(self, app: Any, name: str, value: str) -> None:
        self.app = app
        self.header = (name.encode(), value.encode())

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_with_header)


class InstanceHeader(ResponseHeader):
    """ASGI middleware: adds ``INSTANCE_HEADER: <token>`` to every HTTP response of ``app``."""

    def __init__(self, app: Any, token: str) -> None:
        super().__init__(app, INSTANCE_HEADER, token)
