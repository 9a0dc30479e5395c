"""course_utils.distributed: the launcher, the loopback-only torchrun, and the job helper, with small job scripts.

The notebook asserts its own jobs (collectives, DDP, FSDP2, ...) in its cells; test_nb12_jobs.py runs what it cannot.
"""

from __future__ import annotations

import ipaddress
import os
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from course_utils import config
from course_utils.distributed import launch, loopback, runtime
from course_utils.kit import offline

# Every job runs with the offline guard on in its workers, as the notebook does under `make test`.
GUARD = offline.child_env()

@pytest.fixture(scope="module")
def gloo_loopback():
    """Skip the job tests where gloo cannot listen and connect on 127.0.0.1 (a sandbox without loopback)."""
    why = launch.loopback_problem(GUARD)
    if why is not None:
        pytest.skip(why)


def script(tmp_path: Path, body: str, name: str = "tiny.py") -> Path:
    """Write a job script that joins the group first (``rank``, ``world``, ``dist``, ``runtime`` defined)."""
    path = tmp_path / name
    path.write_text("import os, sys, time\nimport torch, torch.distributed as dist\n"
                    "from course_utils.distributed import runtime\nrank, world = runtime.init()\n"
                    + textwrap.dedent(body), encoding="utf-8")
    return path


def run(path: Path, args=(), **kwargs) -> launch.JobResult:
    kwargs.setdefault("timeout_s", 120)
    return launch.run_job(path, [str(a) for a in args], echo=kwargs.pop("echo", None), env=GUARD, **kwargs)


# --- the launcher, without processes


def test_torchrun_command_is_the_loopback_torchrun_with_a_private_rendezvous():
    cmd = launch.torchrun_command("build/nb12/ddp.py", ["--steps", 3], port=29555, max_restarts=2)
    assert cmd[:3] == [sys.executable, "-m", "course_utils.distributed.loopback"]
    assert "127.0.0.1:29555" in cmd and cmd[cmd.index("--nproc-per-node") + 1] == "2"
    assert cmd[cmd.index("--max-restarts") + 1] == "2"
    assert cmd[cmd.index("--rdzv-conf") + 1] == "is_host=1" and cmd[cmd.index("--local-addr") + 1] == "127.0.0.1"
    assert cmd[-3:] == ["build/nb12/ddp.py", "--steps", "3"]
    ids = {c[c.index("--rdzv-id") + 1] for c in (launch.torchrun_command("a.py") for _ in range(20))}
    assert len(ids) == 20 and all(i.startswith("course-") for i in ids)
    assert "x-1" in launch.torchrun_command("a.py", rdzv_id="x-1")
    assert "127.0.0.1:0" in launch.torchrun_command("a.py")  # the store's port: picked by the system as it binds
    for bad in ({"nproc": 0}, {"max_restarts": -1}, {"nproc": True}):
        with pytest.raises(ValueError):
            launch.torchrun_command("a.py", **bad)
    with pytest.raises(ValueError, match="not a Python script"):
        launch.torchrun_command("--oops")


def test_run_job_says_which_cell_to_run_when_the_script_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="writefile"):
        launch.run_job(tmp_path / "never_written.py", echo=None)


def test_multinode_command_is_one_line_for_every_machine_without_a_node_rank():
    cmd = launch.multinode_command("fsdp.py", ["--steps", "100"], nnodes=4, nproc_per_node=8,
                                   endpoint="node0.cluster:29400", job_id="run-7")
    text = " ".join(cmd)
    assert text.startswith("torchrun --nnodes 4 --nproc-per-node 8 --rdzv-backend c10d")
    assert "--rdzv-endpoint node0.cluster:29400" in text and "--rdzv-id run-7" in text and "--max-restarts 3" in text
    assert "--node-rank" not in text       # c10d numbers the machines itself; torchrun would ignore it anyway
    assert text.endswith("fsdp.py --steps 100")
    with pytest.raises(TypeError):
        launch.multinode_command("fsdp.py", nnodes=2, nproc_per_node=1, endpoint="node0:29400", node_rank=1)
    for bad in ({"endpoint": "node0"}, {"endpoint": "node0:port"}, {"endpoint": ":29400"}):
        with pytest.raises(ValueError, match="host:port"):
            launch.multinode_command("ddp.py", nnodes=2, nproc_per_node=1, **bad)
    for bad in ({"nnodes": 0}, {"nproc_per_node": True}, {"max_restarts": -1}):
        with pytest.raises(ValueError):
            launch.multinode_command("ddp.py", **{"nnodes": 2, "nproc_per_node": 1, "endpoint": "n:1", **bad})
    with pytest.raises(ValueError, match="not a Python script"):
        launch.multinode_command("--oops", nnodes=2, nproc_per_node=1, endpoint="n:1")


def test_children_get_the_course_pythonpath_one_thread_and_gloo_on_loopback(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    env = launch.child_env({"X_COURSE": "1"})
    assert env["PYTHONPATH"] == config.child_pythonpath(environ=os.environ)
    assert env["X_COURSE"] == "1" and env["PYTHONUNBUFFERED"] == "1" and "OMP_NUM_THREADS" in env
    if sys.platform.startswith("linux"):
        assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "lo"
    with pytest.raises(TypeError):
        launch.child_env({"X": 1})


def test_parse_result_reads_the_last_marked_line_and_explains_failures():
    m = runtime.RESULT_MARKER
    lines = ["noise", "[rank 0] hello", m + '{"a": 1}', m + '{"a": 2}', "bye"]
    assert launch.parse_result(lines) == {"a": 2}
    assert launch.parse_result("\n".join(lines)) == {"a": 2}
    with pytest.raises(ValueError, match="no line"):
        launch.parse_result(["nothing here"])
    with pytest.raises(ValueError, match="not JSON"):
        launch.parse_result([m + "{oops"])
    with pytest.raises(ValueError, match="JSON object"):
        launch.parse_result([m + "[1, 2]"])


def test_parse_result_tolerates_another_ranks_text_around_the_result():
    """What two writes (the JSON, then its newline) allowed: rank 1's text between the JSON and the newline."""
    m = runtime.RESULT_MARKER
    result = runtime.result_line({"a": [1, 2], "b": "x y"})
    assert result.startswith(m) and "\n" not in result
    between = result + "[rank 1] step 3 done\n" + "\n" + "[rank 1] step 4 done\n"
    assert launch.parse_result(between) == {"a": [1, 2], "b": "x y"}
    before = "[rank 1] writing a line with no end yet " + result + "\n"
    assert launch.parse_result(before) == {"a": [1, 2], "b": "x y"}
    assert launch.parse_result(["[rank 1] noise", "[rank 1] " + result + " trailing {not json"]) == {"a": [1, 2], "b": "x y"}


def test_write_line_is_a_single_write(monkeypatch, tmp_path):
    calls = []
    real_write = os.write

    def counting(fd, data):
        calls.append(bytes(data))
        return real_write(fd, data)

    with open(tmp_path / "out.txt", "w", encoding="utf-8") as out:
        monkeypatch.setattr(sys, "stdout", out)
        monkeypatch.setattr(os, "write", counting)
        runtime.write_line(runtime.result_line({"k": "v" * 3000}))
        runtime.write_line("two\nlines")
    assert len(calls) == 2 and calls[0].endswith(b"\n") and calls[0].count(b"\n") == 1
    assert calls[1] == b"two lines\n"
    assert launch.parse_result((tmp_path / "out.txt").read_text(encoding="utf-8")) == {"k": "v" * 3000}


def test_loopback_refuses_other_addresses_and_hosts_its_store_on_loopback():
    import datetime

    pytest.importorskip("psutil")
    assert loopback.is_loopback("127.0.0.1") and loopback.is_loopback("::1") and loopback.is_loopback("localhost")
    assert not loopback.is_loopback("0.0.0.0") and not loopback.is_loopback("10.1.2.3") and not loopback.is_loopback("node0")
    with pytest.raises(ValueError, match="loopback"):
        loopback.listen_on("0.0.0.0", 0)
    store = loopback.loopback_store_class()("127.0.0.1", 0, 1, is_master=True,
                                             timeout=datetime.timedelta(seconds=10))
    store.set("key", "value")
    assert store.get("key") == b"value"
    mine = [address for _, address, port in launch.listening_sockets([os.getpid()]) if port == store.port]
    assert mine == ["127.0.0.1"], mine
    del store


# --- real two-process jobs


def test_a_job_returns_what_rank_0_emitted(gloo_loopback, tmp_path):
    path = script(tmp_path, """
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        runtime.log(f"sum {t.item()}")
        runtime.emit({"world": world, "sum": t.item(), "run_id": os.environ["TORCHELASTIC_RUN_ID"]})
        runtime.finish()
    """)
    seen = []
    job = run(path, echo=seen.append)
    assert job.returncode == 0 and job.result["world"] == 2 and job.result["sum"] == 3.0
    assert job.result["run_id"].startswith("course-")
    assert any(line.startswith("[rank 1] sum 3.0") for line in seen)


def test_a_flooding_rank_cannot_break_the_result_line(gloo_loopback, tmp_path):
    """Rank 1 writes text without newlines, as fast as it can, while rank 0 writes 50 result lines."""
    path = script(tmp_path, """
        dist.barrier()
        if rank == 1:
            end = time.monotonic() + 3
            while time.monotonic() < end:
                sys.stdout.write("noise-from-rank-1 ")   # no newline: lands inside other lines
                sys.stdout.flush()
        else:
            for i in range(50):
                runtime.emit({"i": i, "payload": list(range(200))})
                time.sleep(0.04)
        runtime.finish()
    """)
    job = run(path)
    marked = [line for line in job.lines if runtime.RESULT_MARKER in line]
    assert len(marked) == 50
    assert [launch.parse_result([line])["i"] for line in marked] == list(range(50))
    assert job.result == {"i": 49, "payload": list(range(200))}
    assert sum(line.count("noise-from-rank-1") for line in job.lines) > 50, "rank 1 did not flood"


def test_every_listening_socket_of_a_job_is_on_loopback(gloo_loopback, tmp_path):
    """The rendezvous store, the workers' shared store and gloo's sockets: none on a wildcard or LAN address."""
    psutil = pytest.importorskip("psutil")
    path = script(tmp_path, """
        t = torch.ones(1)
        dist.all_reduce(t)          # gloo's connections are up
        runtime.log("ready")
        time.sleep(5)
        runtime.emit({"ok": True})
        runtime.finish()
    """)
    done = threading.Event()
    out: dict = {}

    def target():
        try:
            out["job"] = run(path)
        except BaseException as err:  # noqa: BLE001 - reported below
            out["error"] = err
        finally:
            done.set()

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    threading.Thread(target=target, daemon=True).start()
    found: set[tuple[int, str, int]] = set()
    pids: set[int] = set()
    assert launch.listening_sockets([]) == []
    while not done.wait(0.25):
        now = {p.pid for p in me.children(recursive=True)} - before
        pids |= now
        found |= set(launch.listening_sockets(now))
    assert "error" not in out, out.get("error")
    assert out["job"].result == {"ok": True}
    assert len(pids) >= 3, "the launcher and two workers were not seen"
    bad = [(pid, ip, port) for pid, ip, port in found if not ipaddress.ip_address(ip).is_loopback]
    assert not bad, f"listening beyond loopback: {bad}"
    # the launcher's two stores and one gloo listener per worker, at least
    assert len(found) >= 4, found


def test_two_jobs_at_once_never_join_each_other(gloo_loopback, tmp_path):
    path = script(tmp_path, """
        t = torch.ones(1)
        dist.all_reduce(t)
        runtime.emit({"world": world, "sum": t.item(), "run_id": os.environ["TORCHELASTIC_RUN_ID"]})
        runtime.finish()
    """)
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(run(path, timeout_s=180).result)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and all(r["world"] == 2 and r["sum"] == 2.0 for r in results)
    assert results[0]["run_id"] != results[1]["run_id"]


def test_a_timed_out_job_is_stopped_with_every_worker(gloo_loopback, tmp_path):
    psutil = pytest.importorskip("psutil")
    path = script(tmp_path, """
        runtime.log("waiting forever")
        time.sleep(3600)
    """)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    start = time.monotonic()
    with pytest.raises(launch.JobError, match="timeout"):
        run(path, timeout_s=8)  # the launch takes a few seconds; the rest of the wait is idle
    assert time.monotonic() - start < 40
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert not left, f"processes outlived the job: {left}"


def test_a_failing_job_raises_with_its_output(gloo_loopback, tmp_path):
    path = script(tmp_path, """
        if rank == 1:
            raise ValueError("rank 1 gives up")
        dist.barrier()
    """, name="failing.py")
    with pytest.raises(launch.JobError, match="failing job exited with status") as err:
        run(path)
    assert "Traceback" in str(err.value) or "Error" in str(err.value)


def test_an_interrupt_while_streaming_stops_every_worker(gloo_loopback, tmp_path):
    """A notebook interrupt arrives as KeyboardInterrupt in the middle of the output: nothing may outlive it."""
    psutil = pytest.importorskip("psutil")
    path = script(tmp_path, """
        while True:
            runtime.log("working")
            time.sleep(0.2)
    """)
    before = {p.pid for p in psutil.Process().children(recursive=True)}

    def interrupt_on_first_rank_line(line):
        if line.startswith("[rank"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(path, echo=interrupt_on_first_rank_line)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert not left, f"processes outlived the interrupt: {left}"


def test_init_outside_torchrun_says_how_to_launch(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(RuntimeError, match="torchrun"):
        runtime.init()


def test_loopback_problem_is_none_here_and_says_why_when_gloo_cannot_listen(gloo_loopback):
    assert launch.loopback_problem(GUARD) is None
    why = launch.loopback_problem({**GUARD, "GLOO_SOCKET_IFNAME": "no-such-if0"})
    assert why is not None and "127.0.0.1" in why
