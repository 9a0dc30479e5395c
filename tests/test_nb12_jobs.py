"""Notebook 12's job scripts, taken from its ``%%writefile`` cells and run on two processes with small sizes.

The notebook itself runs under nbval (test_notebooks.py); these tests run the same files with
other arguments, and check what its prose and asserts rely on.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import torch

from course_utils import config
from course_utils.distributed import launch
from course_utils.kit import offline
from notebook_files import written_files

NOTEBOOK = config.REPO_ROOT / "notebooks" / "12_distributed.ipynb"
GUARD = offline.child_env()
EXPECTED = {"collectives.py", "common.py", "ddp.py", "fsdp.py", "dtensor.py", "dcp.py", "elastic.py"}


def notebook_scripts() -> dict[str, str]:
    """Return {file name: source} of every ``%%writefile {JOBS}/name.py`` cell of notebook 12."""
    return written_files(NOTEBOOK.name, "JOBS")


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> Path:
    """The notebook's job scripts, written into a folder of their own (skipped where loopback does not work)."""
    why = launch.loopback_problem(GUARD)
    if why is not None:
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("nb12_jobs")
    for name, source in notebook_scripts().items():
        (folder / name).write_text(source, encoding="utf-8")
    return folder


def job(folder: Path, name: str, args=(), **kwargs) -> dict:
    return launch.run_job(folder / name, [str(a) for a in args], echo=None, env=GUARD, timeout_s=300,
                          **kwargs).result


def test_the_notebook_writes_every_job_and_launches_only_what_it_wrote():
    scripts = notebook_scripts()
    assert set(scripts) == EXPECTED
    code = "\n".join("".join(c["source"]) for c in json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
                     if c["cell_type"] == "code")
    launched = set(re.findall(r'run_job\(f"\{JOBS\}/(\w+\.py)"', code))
    assert launched == EXPECTED - {"common.py"}
    for name, source in scripts.items():
        compile(source, name, "exec")  # each is a whole, valid program


def test_collectives_give_what_the_lesson_says(jobs):
    r = job(jobs, "collectives.py", ["--per-rank", 4])
    out = r["per_rank"]
    assert r["world"] == 2 and r["backend"] == "gloo"
    assert out["all_reduce"] == [[6.0, 8.0, 10.0, 12.0]] * 2
    assert out["all_gather"] == [[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]] * 2
    assert out["reduce_scatter"] == [[6.0, 8.0], [10.0, 12.0]]


def test_ddp_with_compile_matches_one_process_and_splits_graphs_at_buckets(jobs):
    r = job(jobs, "ddp.py", ["--width", 384, "--depth", 6, "--caps", "25,1", "--steps", 3, "--backend", "aot_eager"])
    assert r["grad_max_abs_diff"] < 1e-5
    big, small = r["caps"]
    assert small["buckets"] > big["buckets"] >= 1
    assert small["graphs"] > big["graphs"] >= 1
    assert len(r["losses"]) == 3 and r["trace"]["allreduce_calls"] >= 1
    assert r["trace"]["started_inside_backward"] == r["trace"]["allreduce_calls"]


def test_fsdp_shards_parameters_and_follows_ddps_loss_curve(jobs):
    args = ["--width", 128, "--depth", 3, "--steps", 4, "--backend", "aot_eager"]
    f = job(jobs, "fsdp.py", args)
    d = job(jobs, "ddp.py", [*args, "--caps", "25"])
    assert f["param_bytes_per_rank_ratio"] <= 0.55 and sum(f["bytes_per_rank"]) == f["full_bytes"]
    assert f["all_dtensor"] and all("Shard" in p["placements"] for p in f["params"].values())
    assert max(abs(a - b) for a, b in zip(f["losses"], d["losses"], strict=True)) < 1e-4


def test_dtensor_placements_and_the_sharded_matmul(jobs):
    r = job(jobs, "dtensor.py", ["--rows", 8, "--cols", 6])
    assert r["local"] == {"Shard(0)": [4, 6], "Shard(1)": [8, 3], "Replicate()": [8, 6]}
    assert r["redistribute"]["Shard(0)->Replicate()"]["exact"] is True
    assert "all_gather_into_tensor" in r["redistribute"]["Shard(0)->Replicate()"]["comms"]
    assert r["matmul"]["comms_in_matmul"] == {} and r["matmul"]["comms_to_replicate"] == {"all_reduce": 1}
    assert r["matmul"]["max_abs_err"] < 1e-5
    assert r["matmul_rows"]["comms_in_matmul"] == {} and r["matmul_rows"]["out_placement"] == "S(0)"


def test_distributed_checkpoint_reloads_exactly_in_two_ranks_and_in_one(jobs, tmp_path):
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "ckpt"
    r = job(jobs, "dcp.py", ["--dir", folder, "--width", 64, "--depth", 2, "--steps", 2])
    assert r["diff_before_load"] > 0 and r["reload_max_abs_diff_two_ranks"] == 0.0
    assert ".metadata" in r["files"] and sum(f.endswith(".distcp") for f in r["files"]) == 2
    reference = torch.load(folder / "reference.pt", weights_only=True)
    single = {name: torch.zeros_like(t) for name, t in reference.items()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*single process")
        dcp.load(single, checkpoint_id=str(folder), no_dist=True)
    assert all(torch.equal(single[k], reference[k]) for k in reference)


def test_a_killed_rank_is_restarted_from_the_checkpoint_with_the_same_result(jobs, tmp_path):
    args = ["--width", 64, "--depth", 2, "--steps", 6, "--every", 2, "--backend", "none"]
    failed = job(jobs, "elastic.py", [*args, "--dir", tmp_path / "a", "--kill-at", 3], max_restarts=1)
    clean = job(jobs, "elastic.py", [*args, "--dir", tmp_path / "b"])
    assert failed["restarts"] == 1 and failed["resumed_from"] == 2 and clean["restarts"] == 0
    assert failed["fingerprint"] == clean["fingerprint"] and failed["losses"] == clean["losses"]
