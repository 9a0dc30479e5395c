"""Start a server in a child process and stop it reliably (tests, notebooks, benchmarks).

``ServerProcess(cmd)`` runs a server command (ours, or LitServe) with its output in a log file,
waits until the server is healthy, and on exit sends SIGINT, then SIGTERM, then SIGKILL, each
after a timeout. ``serve_in_subprocess(settings)`` runs ``python -m course_utils serve`` on
127.0.0.1, on any free port unless the settings name one.

On a shared host every learner's servers share loopback, so the parent never picks a port for
its child: the child binds port 0 itself (or the port asked for) and writes the port it got to a
file the parent named; and the parent passes the child a random token, which the child's
``/health`` sends back in a header (``instance``). Health counts only with this parent's token,
so a parent never mistakes another learner's server for its own. A child that cannot bind its
port exits at once; ``ServerStartError`` then starts with the child's own one-line reason.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ... import config
from .instance import INSTANCE_ENV, INSTANCE_HEADER, PORT_FILE_ENV, new_token, read_reported_port
from .settings import ServeSettings

#: How much of a stopped server's log ``ServerProcess.close`` keeps for ``log_tail``.
KEPT_LOG_CHARS = 8000


class ServerStartError(RuntimeError):
    """The server process exited or never became healthy; the message holds its log tail."""


class ServerProcess:
    """A server command run as a child process; a context manager that waits for its health.

    With ``health_url`` None (the default) the child reports its port: it binds it itself and
    writes it to the file named by ``$COURSE_SERVER_PORT_FILE`` (``instance.report_port``), and
    ``url`` is known once ``start`` returns. With ``health_url`` given, that URL is polled.

    The child gets a token of its own (``instance``, as ``$COURSE_SERVER_INSTANCE``). With
    ``check_instance`` (the default when the child reports its port) health counts only when the
    answer is 200 and carries that token in its ``X-Course-Instance`` header; without it (the
    default with a ``health_url``: a server that may know nothing of the token, such as LitServe's
    own ``/health``) a 200 counts unless it carries another token, i.e. another course server's.
    """

    def __init__(self, cmd: Sequence[str], health_url: str | None = None, *, startup_timeout_s: float = 60.0,
                 stop_timeout_s: float = 10.0, env: Mapping[str, str] | None = None,
                 cwd: str | Path | None = None, url: str | None = None, health_path: str = "/health",
                 check_instance: bool | None = None) -> None:
        self.cmd = [str(c) for c in cmd]
        self.instance = new_token()
        self.check_instance = health_url is None if check_instance is None else check_instance
        self.health_path = health_path
        self.health_url = health_url or ""
        self.url = url or (health_url.rsplit("/", 1)[0] if health_url else "")
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="course-server-", suffix=".log", delete=False)
        self._kept_log = ""
        self.log_path = Path(self._log.name)
        self.port_file: Path | None = None
        own = {INSTANCE_ENV: self.instance}
        if health_url is None:
            fd, name = tempfile.mkstemp(prefix="course-server-", suffix=".port")  # private to this user
            os.close(fd)
            self.port_file = Path(name)
            own[PORT_FILE_ENV] = name
        self.env = {**os.environ, **(env or {}), **own}

    def log_tail(self, n_chars: int = 4000) -> str:
        """Return the end of the server's combined stdout/stderr; after ``close`` (which deletes the
        log file), the end it kept, so an assert after the ``with`` block can still show it."""
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except OSError:
            return self._kept_log[-n_chars:]

    def _failure(self, headline: str) -> ServerStartError:
        tail = self.log_tail()
        last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "")
        reason = f": {last}" if last else ""
        return ServerStartError(f"{headline}{reason}\ncommand: {' '.join(self.cmd)}\n--- log tail ---\n{tail}")

    def _ours(self, response: Any) -> bool:
        """Return True when ``response`` is a healthy answer of the server this process started."""
        if response.status_code != 200:
            return False
        token = response.headers.get(INSTANCE_HEADER)
        return token == self.instance or (token is None and not self.check_instance)

    def start(self) -> ServerProcess:
        """Start the process and wait until its own server answers ``/health`` with 200 and the token."""
        import httpx

        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=self.env, cwd=self.cwd, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        foreign = False  # something answered, without our token
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while True:
                if self.proc.poll() is not None:
                    raise self._failure(f"server exited with status {self.proc.returncode} during startup")
                if not self.health_url and self.port_file is not None:
                    port = read_reported_port(self.port_file)
                    if port is not None:
                        self.url = f"http://127.0.0.1:{port}"
                        self.health_url = self.url + self.health_path
                if self.health_url:
                    try:
                        response = client.get(self.health_url)
                        if self._ours(response):
                            return self
                        foreign = foreign or response.status_code == 200
                    except httpx.TransportError:
                        pass
                if time.monotonic() > deadline:
                    self.stop()
                    if foreign:
                        raise self._failure(f"a server at {self.health_url} answered, but not the one this "
                                            f"process started (its instance token differs): another program "
                                            f"holds that port")
                    where = self.health_url or "(the server reported no port)"
                    raise self._failure(f"server not healthy after {self.startup_timeout_s} s at {where}")
                time.sleep(0.1)

    def stop(self) -> int | None:
        """SIGINT, then SIGTERM, then SIGKILL (each after ``stop_timeout_s``); return the exit status."""
        proc = self.proc
        if proc is None:
            return None
        for sig, wait in ((signal.SIGINT, self.stop_timeout_s), (signal.SIGTERM, self.stop_timeout_s),
                          (signal.SIGKILL, 5.0)):
            if proc.poll() is not None:
                break
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        self._log.close()
        return proc.returncode

    def close(self) -> None:
        """Stop the process (if running) and delete its log file, keeping its last ``KEPT_LOG_CHARS``
        characters for ``log_tail``."""
        self.stop()
        self._log.close()
        self._kept_log = self.log_tail(KEPT_LOG_CHARS)
        for path in (self.log_path, self.port_file):
            try:
                if path is not None:
                    path.unlink()
            except OSError:
                pass

    def __enter__(self) -> ServerProcess:
        try:
            return self.start()
        except BaseException:  # __exit__ will not run: clean up here (the error holds the log tail)
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_in_subprocess(settings: ServeSettings | Mapping[str, Any] | None = None, *,
                        startup_timeout_s: float = 60.0, stop_timeout_s: float = 10.0,
                        env: Mapping[str, str] | None = None) -> ServerProcess:
    """Return a ``ServerProcess`` running ``python -m course_utils serve`` (use it with ``with``).

    ``settings`` is a ``ServeSettings`` or a dict of its fields; the host is always 127.0.0.1.
    The child binds any free port unless ``settings.port`` names one (the default, 8000, counts
    as none); a named port that is taken makes ``start`` raise ``ServerStartError`` saying so.
    """
    if settings is None:
        settings = ServeSettings()
    elif not isinstance(settings, ServeSettings):
        settings = ServeSettings(**dict(settings))
    port = 0 if settings.port == 8000 else settings.port
    settings = settings.replace(host="127.0.0.1", port=port)
    env = {"PYTHONPATH": config.child_pythonpath(), "PYTHONUNBUFFERED": "1", **(env or {})}
    cmd = [sys.executable, "-m", "course_utils", "serve", *settings.to_cli_args()]
    return ServerProcess(cmd, startup_timeout_s=startup_timeout_s, stop_timeout_s=stop_timeout_s, env=env)
