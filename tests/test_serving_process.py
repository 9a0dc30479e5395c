"""`python -m course_utils serve` in a child process: CLI options, health, SIGINT with streams in flight."""

import asyncio
import subprocess
import sys
import time

import httpx
import pytest

from course_utils.kit.cli import main
from course_utils.serving import ServeSettings
from course_utils.serving.server.loadgen import SSEParser
from course_utils.serving.server.process import ServerProcess, ServerStartError, serve_in_subprocess
from course_utils.serving.server.runner import free_port


def test_serve_help_lists_the_options():
    out = subprocess.run([sys.executable, "-m", "course_utils", "serve", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for flag in ("--host", "--port", "--model", "--batching", "--max-batch-size", "--max-wait-ms", "--no-embed"):
        assert flag in out.stdout


def test_bad_settings_exit_with_status_2(capsys):
    assert main(["serve", "--max-batch-size", "0", "--no-embed"]) == 2
    assert "max_batch_size=0" in capsys.readouterr().err


def test_settings_round_trip_through_the_cli():
    s = ServeSettings(batching="static", max_batch_size=8, max_wait_ms=2.5, embed=False, port=1234)
    args = s.to_cli_args()
    assert args[:4] == ["--host", "127.0.0.1", "--port", "1234"]
    assert "--no-embed" in args and ["--batching", "static"] == args[args.index("--batching"):][:2]
    with pytest.raises(ValueError, match="batching"):
        ServeSettings(batching="dynamic")


def test_a_server_that_cannot_start_reports_its_log_and_removes_it():
    cmd = [sys.executable, "-c", "import sys; print('boom from the server'); sys.exit(3)"]
    server = ServerProcess(cmd, "http://127.0.0.1:9/health", startup_timeout_s=20)
    assert server.log_path.exists()
    with pytest.raises(ServerStartError, match="boom from the server"):
        with server:
            pass
    assert not server.log_path.exists()  # __exit__ never ran: the failed start cleaned up


def test_a_server_that_never_gets_healthy_is_stopped_and_its_log_removed():
    cmd = [sys.executable, "-c", "import time; print('waiting forever', flush=True); time.sleep(120)"]
    server = ServerProcess(cmd, f"http://127.0.0.1:{free_port()}/health", startup_timeout_s=2, stop_timeout_s=5)
    with pytest.raises(ServerStartError, match="not healthy after 2"):
        with server:
            pass
    assert server.proc.returncode is not None and not server.log_path.exists()
    assert "waiting forever" in server.log_tail()  # kept for an assert after the with block


def test_a_closed_server_keeps_the_end_of_its_log_for_log_tail():
    cmd = [sys.executable, "-c", "print('x' * 10000 + ' last words', flush=True); import time; time.sleep(120)"]
    server = ServerProcess(cmd, f"http://127.0.0.1:{free_port()}/health", startup_timeout_s=2, stop_timeout_s=5)
    with pytest.raises(ServerStartError):
        with server:
            pass
    tail = server.log_tail()
    assert not server.log_path.exists() and "last words" in tail  # (then the SIGINT traceback)
    assert len(tail) <= 4000 and len(server.log_tail(20_000)) <= 8000  # at most KEPT_LOG_CHARS are kept


def test_subprocess_server_streams_and_stops_cleanly_with_streams_in_flight():
    with serve_in_subprocess({"embed": False, "batching": "iteration", "max_batch_size": 4},
                             startup_timeout_s=90) as server:
        assert httpx.get(server.url + "/health", timeout=10).json()["status"] == "ok"

        started = [asyncio.Event() for _ in range(6)]

        async def client(i: int) -> list:
            parser, events = SSEParser(), []
            async with httpx.AsyncClient(timeout=30) as c:
                try:
                    async with c.stream("POST", server.url + "/generate",
                                        json={"prompt": f"Line {i} ", "max_new_tokens": 256}) as resp:
                        if resp.status_code != 200:
                            await resp.aread()
                            return [("status", resp.status_code)]
                        async for line in resp.aiter_lines():
                            events += parser.feed(line)
                            started[i].set()
                except httpx.TransportError as err:
                    events.append(("transport", repr(err)))
            return events

        async def scenario() -> list:
            tasks = [asyncio.create_task(client(i)) for i in range(6)]
            # the first four hold batch rows (max_batch_size=4); the last two wait in the queue
            await asyncio.wait_for(asyncio.gather(*(started[i].wait() for i in range(4))), timeout=60)
            t0 = time.monotonic()
            await asyncio.to_thread(server.stop)
            results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
            assert time.monotonic() - t0 < 20
            return results

        results = asyncio.run(scenario())
        assert server.proc.returncode == 0, server.log_tail()
    for events in results:
        assert events and events[-1][0] in ("end", "error", "status"), events[-3:]
    assert any(e[-1][0] == "error" and "shutting down" in e[-1][1]["detail"] for e in results) or \
        any(e[-1] == ("status", 503) for e in results)
