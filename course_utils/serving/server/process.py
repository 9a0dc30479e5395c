"""Start a server in a child process and stop it reliably (tests, notebooks, benchmarks).

``ServerProcess(cmd, health_url)`` runs any command (ours, or LitServe) with its output in a
log file, waits until ``health_url`` answers 200, and on exit sends SIGINT, then SIGTERM,
then SIGKILL, each after a timeout. ``serve_in_subprocess(settings)`` runs
``python -m course_utils serve`` on 127.0.0.1 on a free port.
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
from .runner import free_port
from .settings import ServeSettings


class ServerStartError(RuntimeError):
    """The server process exited or never became healthy; the message holds its log tail."""


class ServerProcess:
    """A server command run as a child process; a context manager that waits for health."""

    def __init__(self, cmd: Sequence[str], health_url: str, *, startup_timeout_s: float = 60.0,
                 stop_timeout_s: float = 10.0, env: Mapping[str, str] | None = None,
                 cwd: str | Path | None = None, url: str | None = None) -> None:
        self.cmd = [str(c) for c in cmd]
        self.health_url = health_url
        self.url = url or health_url.rsplit("/", 1)[0]
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="course-server-", suffix=".log", delete=False)
        self.log_path = Path(self._log.name)

    def log_tail(self, n_chars: int = 4000) -> str:
        """Return the end of the server's combined stdout/stderr."""
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except OSError:
            return ""

    def start(self) -> ServerProcess:
        """Start the process and wait until the health URL answers 200."""
        import httpx

        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=self.env, cwd=self.cwd, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while True:
                if self.proc.poll() is not None:
                    raise ServerStartError(f"server exited with status {self.proc.returncode} during "
                                           f"startup: {' '.join(self.cmd)}\n--- log tail ---\n{self.log_tail()}")
                try:
                    if client.get(self.health_url).status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise ServerStartError(f"server not healthy after {self.startup_timeout_s} s: "
                                           f"{' '.join(self.cmd)}\n--- log tail ---\n{self.log_tail()}")
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
        """Stop the process (if running) and delete its log file."""
        self.stop()
        self._log.close()
        try:
            self.log_path.unlink()
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

    ``settings`` is a ``ServeSettings`` or a dict of its fields; the port is chosen free
    unless given, and the host is always 127.0.0.1.
    """
    if settings is None:
        settings = ServeSettings()
    elif not isinstance(settings, ServeSettings):
        settings = ServeSettings(**dict(settings))
    port = settings.port if settings.port not in (0, 8000) else free_port()
    settings = settings.replace(host="127.0.0.1", port=port)
    env = {"PYTHONPATH": config.child_pythonpath(), "PYTHONUNBUFFERED": "1", **(env or {})}
    cmd = [sys.executable, "-m", "course_utils", "serve", *settings.to_cli_args()]
    url = f"http://127.0.0.1:{port}"
    return ServerProcess(cmd, f"{url}/health", startup_timeout_s=startup_timeout_s,
                         stop_timeout_s=stop_timeout_s, env=env, url=url)
