"""course_utils.distributed: the launcher, and a short two-process job of each kind on the CPU (gloo)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from course_utils import config
from course_utils.distributed import launch, runtime
from course_utils.distributed import dcp as dcp_job
from course_utils.kit import offline

# Every job runs with the offline guard on in its workers, as the notebook does under `make test`.
GUARD = offline.child_env()

_PROBE = textwrap.dedent("""
    import datetime, torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=datetime.timedelta(seconds=20))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    dist.destroy_process_group()
    print("ok")
""")


@pytest.fixture(scope="module")
def gloo_loopback():
    """Skip the job tests where gloo cannot bind and connect on 127.0.0.1 (a sandbox without loopback)."""
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120,
                          env=launch.child_env(GUARD))
    if proc.returncode != 0 or "ok" not in proc.stdout:
        pytest.skip("gloo cannot bind a socket on 127.0.0.1 here (is the loopback interface up?): "
                    + (proc.stderr.strip().splitlines() or ["no output"])[-1])


def job(kind, args=(), **kwargs):
    return launch.run_job(kind, [str(a) for a in args], echo=None, env=GUARD, timeout_s=240, **kwargs).result


# --- the launcher, without processes


def test_torchrun_command_is_loopback_with_the_module_and_its_arguments():
    cmd = launch.torchrun_command("ddp", ["--steps", 3], port=29555, max_restarts=2)
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "127.0.0.1:29555" in cmd and cmd[cmd.index("--nproc-per-node") + 1] == "2"
    assert cmd[cmd.index("--max-restarts") + 1] == "2"
    assert cmd[-4:] == ["-m", "course_utils.distributed.ddp", "--steps", "3"]
    assert launch.torchrun_command("my.module")[-1] == "my.module"
    for bad in ({"nproc": 0}, {"max_restarts": -1}, {"nproc": True}):
        with pytest.raises(ValueError):
            launch.torchrun_command("ddp", **bad)
    with pytest.raises(ValueError, match="not a module name"):
        launch.torchrun_command("--oops")


def test_multinode_command_names_the_rendezvous_and_the_node_rank():
    cmd = launch.multinode_command("fsdp", ["--steps", "100"], nnodes=4, nproc_per_node=8,
                                   endpoint="node0.cluster:29400", node_rank=2)
    text = " ".join(cmd)
    assert text.startswith("torchrun --nnodes 4 --nproc-per-node 8 --rdzv-backend c10d")
    assert "--rdzv-endpoint node0.cluster:29400" in text and "--node-rank 2" in text
    assert text.endswith("-m course_utils.distributed.fsdp --steps 100")
    with pytest.raises(ValueError, match="host:port"):
        launch.multinode_command("ddp", nnodes=2, nproc_per_node=1, endpoint="node0")


def test_children_get_the_course_pythonpath_and_one_thread():
    env = launch.child_env({"X_COURSE": "1"})
    assert env["PYTHONPATH"] == config.child_pythonpath(environ=os.environ)
    assert env["X_COURSE"] == "1" and env["PYTHONUNBUFFERED"] == "1" and "OMP_NUM_THREADS" in env
    with pytest.raises(TypeError):
        launch.child_env({"X": 1})


def test_parse_result_reads_the_last_marked_line_and_explains_failures():
    lines = ["noise", "[rank 0] hello", runtime.RESULT_MARKER + '{"a": 1}', runtime.RESULT_MARKER + '{"a": 2}', "bye"]
    assert launch.parse_result(lines) == {"a": 2}
    with pytest.raises(ValueError, match="no line"):
        launch.parse_result(["nothing here"])
    with pytest.raises(ValueError, match="not JSON"):
        launch.parse_result([runtime.RESULT_MARKER + "{oops"])
    with pytest.raises(ValueError, match="JSON object"):
        launch.parse_result([runtime.RESULT_MARKER + "[1, 2]"])


def test_runtime_data_is_deterministic_and_shards_evenly():
    x1, y1 = runtime.global_batch(3, 8, 16)
    x2, y2 = runtime.global_batch(3 + runtime.N_BATCHES, 8, 16)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(torch.cat([runtime.shard(x1, r, 2) for r in range(2)]), x1)
    with pytest.raises(ValueError, match="evenly"):
        runtime.shard(x1, 0, 3)
    with pytest.raises(RuntimeError, match="torchrun"):
        if "RANK" in os.environ:
            pytest.skip("running under torchrun")
        runtime.init()


# --- real two-process jobs


def test_a_timed_out_job_is_stopped_with_every_worker(gloo_loopback, tmp_path):
    psutil = pytest.importorskip("psutil")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    start = time.monotonic()
    with pytest.raises(launch.JobError, match="timeout"):
        launch.run_job("elastic", ["--dir", tmp_path, "--steps", 100000, "--backend", "none"], echo=None,
                       env=GUARD, timeout_s=12)
    assert time.monotonic() - start < 40
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert not left, f"processes outlived the job: {left}"


def test_a_failing_job_raises_with_its_output(gloo_loopback):
    with pytest.raises(launch.JobError, match="status") as err:
        launch.run_job("collectives", ["--per-rank", 3], echo=None, env=GUARD, timeout_s=120)  # 3 does not split in 2
    assert "Traceback" in str(err.value) or "Error" in str(err.value)


def test_collectives_give_what_the_lesson_says(gloo_loopback):
    r = job("collectives", ["--per-rank", 4])
    out = r["per_rank"]
    assert r["world"] == 2 and r["backend"] == "gloo"
    assert out["all_reduce"] == [[6.0, 8.0, 10.0, 12.0]] * 2
    assert out["all_gather"] == [[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]] * 2
    assert out["reduce_scatter"] == [[6.0, 8.0], [10.0, 12.0]]


def test_ddp_with_compile_matches_one_process_and_splits_graphs_at_buckets(gloo_loopback):
    r = job("ddp", ["--width", 384, "--depth", 6, "--caps", "25,1", "--steps", 3, "--backend", "aot_eager"])
    assert r["grad_max_abs_diff"] < 1e-5
    big, small = r["caps"]
    assert small["buckets"] > big["buckets"] >= 1
    assert small["graphs"] > big["graphs"] >= 1
    assert len(r["losses"]) == 3 and r["trace"]["allreduce_calls"] >= 1


def test_fsdp_shards_parameters_and_follows_ddps_loss_curve(gloo_loopback):
    args = ["--width", 128, "--depth", 3, "--steps", 4, "--backend", "aot_eager"]
    f = job("fsdp", args)
    d = job("ddp", [*args, "--caps", "25"])
    assert f["param_bytes_per_rank_ratio"] <= 0.55 and sum(f["bytes_per_rank"]) == f["full_bytes"]
    assert f["all_dtensor"] and all("Shard" in p["placements"] for p in f["params"].values())
    assert max(abs(a - b) for a, b in zip(f["losses"], d["losses"], strict=True)) < 1e-4


def test_dtensor_placements_and_the_sharded_matmul(gloo_loopback):
    r = job("dtensor", ["--rows", 8, "--cols", 6])
    assert r["local"] == {"Shard(0)": [4, 6], "Shard(1)": [8, 3], "Replicate()": [8, 6]}
    assert r["redistribute"]["Shard(0)->Replicate()"]["exact"] is True
    assert "all_gather_into_tensor" in r["redistribute"]["Shard(0)->Replicate()"]["comms"]
    assert r["matmul"]["comms_in_matmul"] == {} and r["matmul"]["comms_to_replicate"] == {"all_reduce": 1}
    assert r["matmul"]["max_abs_err"] < 1e-5
    assert r["matmul_rows"]["comms_in_matmul"] == {} and r["matmul_rows"]["out_placement"] == "S(0)"


def test_distributed_checkpoint_reloads_exactly_in_two_ranks_and_in_one(gloo_loopback, tmp_path):
    folder = tmp_path / "ckpt"
    r = job("dcp", ["--dir", folder, "--width", 64, "--depth", 2, "--steps", 2])
    assert r["diff_before_load"] > 0 and r["reload_max_abs_diff_two_ranks"] == 0.0
    single = dcp_job.load_into_one_process(folder, 64, 2)
    assert dcp_job.max_abs_diff(single, torch.load(folder / "reference.pt", weights_only=True)) == 0.0


def test_a_killed_rank_is_restarted_from_the_checkpoint_with_the_same_result(gloo_loopback, tmp_path):
    args = ["--width", 64, "--depth", 2, "--steps", 6, "--every", 2, "--backend", "none"]
    failed = job("elastic", [*args, "--dir", tmp_path / "a", "--kill-at", 3], max_restarts=1)
    clean = job("elastic", [*args, "--dir", tmp_path / "b"])
    assert failed["restarts"] == 1 and failed["resumed_from"] == 2 and clean["restarts"] == 0
    assert failed["fingerprint"] == clean["fingerprint"] and failed["losses"] == clean["losses"]


def test_an_interrupt_while_streaming_stops_every_worker(gloo_loopback, tmp_path):
    """A notebook interrupt arrives as KeyboardInterrupt in the middle of the output: nothing may outlive it."""
    psutil = pytest.importorskip("psutil")
    before = {p.pid for p in psutil.Process().children(recursive=True)}

    def interrupt_on_first_rank_line(line):
        if line.startswith("[rank"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        launch.run_job("elastic", ["--dir", tmp_path, "--steps", 100000, "--backend", "none"],
                       echo=interrupt_on_first_rank_line, env=GUARD, timeout_s=120)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert not left, f"processes outlived the interrupt: {left}"
