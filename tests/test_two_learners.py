"""Two learners on one shared host (a classroom server, a JupyterHub): each one's servers and jobs are their own.

Both learners use the same defaults at the same time, on one machine and one loopback interface:
notebook 10's route to a server (``serve_in_subprocess``) and notebook 12's torchrun jobs
(``launch.run_job``). Also here: the pieces that make that hold (``instance``: a port the child binds
itself, the token its ``/health`` sends back) and Ray's folder of this user's own.
"""

from __future__ import annotations

import os
import socket
import stat
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from course_utils.distributed import launch
from course_utils.kit import offline
from course_utils.serving.server.instance import (
    INSTANCE_HEADER, PortError, listen_socket, read_reported_port, report_port)
from course_utils.serving.server.process import ServerProcess, ServerStartError, serve_in_subprocess
from notebook_files import written_module

SETTINGS = {"embed": False}  # the defaults, less the embedding model (as notebook 10 serves TinyGPT)


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def token_at(url: str) -> str | None:
    response = httpx.get(f"{url}/health", timeout=10, trust_env=False)
    assert response.status_code == 200 and response.json()["status"] == "ok"  # the usual fields are still there
    return response.headers.get(INSTANCE_HEADER)


@pytest.fixture(scope="module")
def two_servers():
    """Two learners' servers, started at the same moment with the same settings."""
    servers = [serve_in_subprocess(SETTINGS, startup_timeout_s=120) for _ in range(2)]
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda server: server.start(), servers))
        yield servers
    finally:
        for server in servers:
            server.close()


def test_two_servers_started_at_once_get_their_own_ports_and_tokens(two_servers):
    a, b = two_servers
    assert port_of(a.url) != port_of(b.url) and a.instance != b.instance
    assert token_at(a.url) == a.instance and token_at(b.url) == b.instance
    for server in two_servers:  # port 0: the line printed names the port the child bound
        assert f"serving tiny GPT on {server.url} " in server.log_tail()


def test_a_parent_never_takes_the_other_learners_server_for_its_own(two_servers):
    a, b = two_servers
    # A child that never serves, while the URL polled is the other learner's healthy server: the
    # old check (any 200 from /health) reported it healthy at once.
    waiting = [sys.executable, "-c", "import time; time.sleep(60)"]
    for required in ({}, {"check_instance": True}):  # a fixed health URL, with the token required and without
        with pytest.raises(ServerStartError, match="not the one this process started"):
            with ServerProcess(waiting, f"{b.url}/health", startup_timeout_s=3, stop_timeout_s=5, **required):
                pass


def test_asking_for_the_port_the_other_learner_holds_is_a_clear_error(two_servers):
    a, _ = two_servers
    port = port_of(a.url)
    with pytest.raises(ServerStartError) as failed:
        with serve_in_subprocess({**SETTINGS, "port": port}, startup_timeout_s=120):
            pass
    message = str(failed.value)
    headline, tail = message.splitlines()[0], message.split("--- log tail ---\n", 1)[1]
    assert headline.startswith("server exited with status 1 during startup: error: port "
                               f"{port} on 127.0.0.1 is in use"), headline
    assert "--port 0" in headline and "--port N" in headline
    assert "serving" not in tail and "Traceback" not in tail  # no serving line first, no traceback
    assert token_at(a.url) == a.instance  # the other learner's server is untouched


# ---- the pieces: a port the server binds itself, the file it reports it in ------------------------

def test_listen_socket_binds_any_free_port_or_names_the_taken_one():
    with listen_socket("127.0.0.1", 0) as sock:
        port = sock.getsockname()[1]
        assert port > 0 and sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        with pytest.raises(PortError, match=f"port {port} on 127.0.0.1 is in use.*--port 0 for any free port"):
            listen_socket("127.0.0.1", port)


def test_a_reported_port_is_read_only_once_its_line_is_whole(tmp_path):
    path = tmp_path / "server.port"
    assert read_reported_port(path) is None  # not written yet
    path.write_text("123", encoding="ascii")
    assert read_reported_port(path) is None  # half a line
    report_port(43210, {"COURSE_SERVER_PORT_FILE": str(path)})
    assert read_reported_port(path) == 43210
    report_port(1, {})  # no file named: nothing to do


# ---- notebook 12: two learners' torchrun jobs at once ---------------------------------------------

def test_two_learners_jobs_at_once_each_get_their_own_result(tmp_path):
    guard = offline.child_env()
    why = launch.loopback_problem(guard)
    if why is not None:
        pytest.skip(why)
    path = tmp_path / "sum.py"
    path.write_text(textwrap.dedent("""
        import os, sys
        import torch, torch.distributed as dist
        from course_utils.distributed import runtime

        rank, world = runtime.init()
        t = torch.tensor([float(sys.argv[1]) + rank])
        dist.all_reduce(t)
        runtime.emit({"world": world, "sum": t.item(), "run_id": os.environ["TORCHELASTIC_RUN_ID"],
                      "store_port": int(os.environ["MASTER_PORT"])})
        runtime.finish()
    """), encoding="utf-8")

    def learner(value: int) -> dict:
        return launch.run_job(path, [str(value)], echo=None, env=guard, timeout_s=180).result

    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(learner, (10, 1000))
    assert (first["world"], first["sum"]) == (2, 21.0)       # 10 + 11: this job's two ranks only
    assert (second["world"], second["sum"]) == (2, 2001.0)   # 1000 + 1001
    assert first["run_id"] != second["run_id"] and first["store_port"] != second["store_port"]


# ---- Ray: an instance and a folder of this user's own -------------------------------------------

def test_ray_gets_a_private_folder_and_refuses_one_it_does_not_own(tmp_path, monkeypatch):
    pytest.importorskip("ray.serve")
    ray_app = written_module("13_serving_engine.ipynb", "APPS", "ray_app")
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    folder = Path(ray_app.ray_temp_dir(tmp_path))
    assert folder == tmp_path / f"ray-{user}" and folder.is_dir()
    if hasattr(os, "getuid"):
        folder.chmod(0o777)  # as a umask or another tool may leave it
        ray_app.ray_temp_dir(tmp_path)
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    other = tmp_path / "other"
    other.mkdir()
    (other / f"ray-{user}").symlink_to(tmp_path)  # planted: a link to a folder elsewhere
    with pytest.raises(RuntimeError, match="not a folder of this user"):
        ray_app.ray_temp_dir(other)
    long_tmp = tmp_path / ("t" * 60)
    long_tmp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(long_tmp))  # a temporary folder too long for Ray's sockets
    if os.path.isdir("/tmp"):
        assert ray_app.ray_temp_dir() == f"/tmp/ray-{user}"


def test_ray_always_starts_its_own_instance_in_that_folder(monkeypatch):
    pytest.importorskip("ray.serve")
    ray_app = written_module("13_serving_engine.ipynb", "APPS", "ray_app")
    calls = []

    class FakeRay:
        @staticmethod
        def init(**kwargs):
            calls.append(kwargs)
            return "context"

    monkeypatch.setattr(ray_app, "import_ray", lambda: FakeRay)
    monkeypatch.setattr(ray_app, "ray_temp_dir", lambda: "/tmp/ray-test")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # a cluster the host runs: never joined
    constants = pytest.importorskip("ray._private.ray_constants")
    monkeypatch.setattr(constants, "ENABLE_RAY_CLUSTER", constants.ENABLE_RAY_CLUSTER)  # start_ray sets it
    assert ray_app.start_ray(2) == "context"
    assert calls[0]["address"] == "local" and calls[0]["_temp_dir"] == "/tmp/ray-test"
