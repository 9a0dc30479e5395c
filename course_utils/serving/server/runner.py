"""Run the app with uvicorn: in the foreground (the CLI) or in a background thread (tests, notebooks).

uvicorn waits for open connections before it runs the lifespan shutdown, so a stream would
keep a stopping server alive. ``CourseServer`` tells the engine to end every request (with an
``error`` event) as soon as the exit signal arrives; the connections then close by themselves.

uvicorn's limits come from the settings: ``limit_concurrency`` (connections and requests at
once; 503 beyond), ``timeout_keep_alive``, and the request head's size and arrival time
(``http_head``: 431 and 408), and each client address's share of connections
(``max_connections_per_client``, ``http_head``: 503 as it connects). The server has no
authentication: ``serve`` warns when it binds anything but loopback.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
import threading
import time
from types import FrameType

import uvicorn
from fastapi import FastAPI

from .instance import PortError, listen_socket, report_port
from .settings import ServeSettings


def http_protocol(settings: ServeSettings) -> type | str:
    """Return uvicorn's HTTP protocol with the settings' head limits and per-client connection share
    (``http_head``); uvicorn's h11 protocol (head size limit only) where httptools is not installed."""
    try:
        from .http_head import protocol_class
    except ImportError:  # no httptools
        return "h11"
    return protocol_class(settings.head_timeout_s, settings.max_header_bytes, settings.max_connections_per_client)


class CourseServer(uvicorn.Server):
    """A uvicorn server that starts the app's shutdown (ending in-flight streams) on exit."""

    def __init__(self, app: FastAPI, settings: ServeSettings) -> None:
        config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                                lifespan="on", timeout_graceful_shutdown=int(max(1, settings.graceful_timeout_s)),
                                access_log=False, limit_concurrency=settings.limit_concurrency,
                                timeout_keep_alive=settings.keep_alive_s,  # type: ignore[arg-type]
                                h11_max_incomplete_event_size=settings.max_header_bytes,
                                http=http_protocol(settings))
        super().__init__(config)
        self.app = app

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Signal handler: end in-flight requests, then let uvicorn stop."""
        self.app.state.begin_shutdown()
        super().handle_exit(sig, frame)

    def request_stop(self) -> None:
        """Stop from another thread (same effect as Ctrl-C)."""
        self.app.state.begin_shutdown()
        self.should_exit = True

    @property
    def bound_port(self) -> int:
        """The port actually bound (useful with ``port=0``)."""
        for server in self.servers:
            for sock in server.sockets:
                return sock.getsockname()[1]
        raise RuntimeError("the server is not listening yet")


def exposure_warning(settings: ServeSettings) -> str | None:
    """Return a warning when ``settings.host`` is not a loopback address, else None.

    The server has no authentication: bound to 0.0.0.0 (or any other interface) it serves
    whoever can reach that interface.
    """
    host = settings.host.strip("[]")
    try:
        if host == "localhost" or ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass
    allowed = ", ".join(settings.allow_hosts) or "none besides loopback names (use --allow-host NAME)"
    return (f"WARNING: binding {settings.host}, which is not loopback: this server has no authentication, "
            f"and anyone who can reach this address can use it. Host header names accepted: {allowed}.")


def serve(settings: ServeSettings) -> int:
    """Serve in the foreground until SIGINT/SIGTERM; return an exit status.

    The port is bound here, before the model loads (``instance.listen_socket``; port 0: any free
    one): a taken port ends the command at once with a one-line error and status 1. The URL printed
    names the port actually bound, which also goes to the file a parent process named
    (``instance.report_port``).
    """
    from .app import create_app

    warning = exposure_warning(settings)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    try:
        sock = listen_socket(settings.host, settings.port)
    except PortError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 1
    with sock:
        port = sock.getsockname()[1]
        settings = settings.replace(port=port)
        app = create_app(settings)
        server = CourseServer(app, settings)
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        print(f"serving tiny GPT on http://{host}:{port} (batching={settings.batching}, "
              f"max_batch_size={settings.batch_capacity}, max_wait_ms={settings.max_wait_ms}, "
              f"embed={settings.embed})", flush=True)
        report_port(port)
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:
            pass
    return 0 if server.started else 1


class ThreadedServer:
    """``with ThreadedServer(settings, **create_app_kwargs) as srv: srv.url`` — uvicorn in a thread.

    Binds 127.0.0.1 on a free port unless ``settings.port`` is set; stops (ending streams with
    an error event) and joins the thread on exit, raising if it does not stop in time.
    """

    def __init__(self, settings: ServeSettings | None = None, startup_timeout_s: float = 60.0,
                 stop_timeout_s: float = 20.0, **app_kwargs: object) -> None:
        from .app import create_app

        settings = settings or ServeSettings(embed=False)
        if settings.port == 8000:
            settings = settings.replace(port=0)
        self.settings = settings
        self.app = create_app(settings, **app_kwargs)  # type: ignore[arg-type]
        self.server = CourseServer(self.app, settings)
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._thread = threading.Thread(target=self.server.run, name="course-serving-uvicorn", daemon=True)
        self.url = ""

    def __enter__(self) -> ThreadedServer:
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server thread exited during startup (see the log above)")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the server did not start within {self.startup_timeout_s} s")
            time.sleep(0.02)
        self.url = f"http://{self.settings.host}:{self.server.bound_port}"
        return self

    def stop(self) -> None:
        """Stop the server and join its thread."""
        self.server.request_stop()
        self._thread.join(self.stop_timeout_s)
        if self._thread.is_alive():
            self.server.force_exit = True
            self._thread.join(5)
            raise RuntimeError(f"the server thread did not stop within {self.stop_timeout_s} s")

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free a moment ago on ``host``.

    Another process (another user's, on a shared host) can take it before you bind it: a server
    the course starts binds port 0 itself instead (``instance.listen_socket``). This is for tests
    that need an address nobody is likely to listen on.
    """
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
