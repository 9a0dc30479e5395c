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
EXPECTED = {"collectives.py", "common.py", "ddp.py", "fsdp.py", "dtensor.py", "tp.py", "pp.py", "dcp.py", "elastic.py"}


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


@pytest.fixture(scope="module")
def fsdp_extras(jobs) -> dict:
    """One small FSDP job with both extras, as notebook 12 runs it (one launch for the two tests below)."""
    r = job(jobs, "fsdp.py", ["--width", 64, "--depth", 2, "--steps", 1, "--backend", "none",
                              "--mixed-precision-steps", 3, "--meta-init"])
    assert {"mixed_precision", "meta"} <= set(r), "each flag adds its own part of the result"
    return r


def test_fsdp_mixed_precision_computes_in_bf16_and_reduces_in_float32(fsdp_extras):
    r = fsdp_extras
    f32, b16 = r["mixed_precision"]["float32"], r["mixed_precision"]["bf16"]
    assert set(f32["dtypes"].values()) == {"float32"}
    assert b16["dtypes"]["weight as stored (this rank's shard)"] == "float32"
    assert b16["dtypes"]["weight during the forward"] == b16["dtypes"]["input of a Linear"] == "bfloat16"
    assert b16["dtypes"]["output of a Linear"] == "bfloat16"
    assert b16["dtypes"]["model output (logits)"] == b16["dtypes"]["loss"] == "float32"  # the root's output_dtype
    assert b16["dtypes"]["gradient (this rank's shard)"] == "float32"
    assert set(f32["collectives"]) == {"all-gather in float32", "reduce-scatter in float32"}
    assert set(b16["collectives"]) == {"all-gather in bfloat16", "reduce-scatter in float32"}
    gathered = f32["collectives"]["all-gather in float32"], b16["collectives"]["all-gather in bfloat16"]
    assert gathered[0][0] == gathered[1][0] and gathered[1][1] * 2 == gathered[0][1]  # same calls, half the bytes
    assert b16["collectives"]["reduce-scatter in float32"] == f32["collectives"]["reduce-scatter in float32"]
    gaps = [abs(a - b) for a, b in zip(f32["losses"], b16["losses"], strict=True)]
    assert len(gaps) == 3 and all(g <= (k + 1) * 2.0 ** -8 * a for k, (g, a) in enumerate(zip(gaps, f32["losses"])))
    assert max(gaps) > 1e-4  # bf16 really ran: further from float32 than float32 runs are from each other
    assert max(abs(a - b) for a, b in zip(f32["losses"][:1], r["losses"])) < 1e-4  # eager float32 = the first run


def test_fsdp_on_the_meta_device_allocates_only_shards_and_loads_exactly(fsdp_extras):
    r = fsdp_extras
    meta = r["meta"]
    assert meta["meta_before_sharding"] and meta["meta_after_sharding"]
    assert meta["bytes_after_to_empty"] == meta["bytes_after_loading"] == r["bytes_per_rank"][0] == r["full_bytes"] // 2
    assert meta["shards_equal_after_random_init"] == "6 of 6"  # the pitfall the notebook shows, on a CPU mesh
    assert meta["loaded_max_abs_diff"] == 0.0


def test_tensor_parallel_pair_matches_one_process_with_one_all_reduce_each_way(jobs):
    r = job(jobs, "tp.py", ["--width", 32, "--hidden", 64, "--batch", 8])
    assert r["out_max_abs_diff"] <= 1e-5 and r["grad_max_abs_diff"] <= 1e-5
    assert r["placements"]["up.weight"] == {"placements": "(Shard(dim=0),)", "local_shape": [32, 32],
                                            "global_shape": [64, 32]}
    assert r["placements"]["down.weight"]["placements"] == "(Shard(dim=1),)"
    assert r["placements"]["down.bias"]["placements"] == "(Replicate(),)"
    assert r["comms_forward"] == {"all_reduce": 1} and r["comms_backward"] == {"all_reduce": 1}
    assert r["comms_step_without_input_grad"] == {"all_reduce": 1}
    assert r["out_shape"] == [8, 32]


def test_tensor_parallel_with_fsdp_on_a_2d_mesh_of_four_ranks(jobs):
    """The command notebook 12 prints for four ranks (it cannot run it on two)."""
    r = job(jobs, "tp.py", ["--width", 32, "--hidden", 64, "--batch", 8, "--dp", 2], nproc=4)
    assert r["world"] == 4 and "dp=2, tp=2" in r["mesh"]
    assert r["out_max_abs_diff"] <= 1e-5 and r["grad_max_abs_diff"] <= 1e-5
    assert r["placements"]["down.weight"]["placements"] == "(Shard(dim=0), Shard(dim=1))"
    assert r["placements"]["down.weight"]["local_shape"] == [16, 32]
    assert r["comms_forward"].get("all_reduce") == 1 and r["comms_backward"].get("all_reduce") == 1
    assert "_allgather_base_" in r["comms_forward"] and "_reduce_scatter_base_" in r["comms_backward"]


def test_pipeline_schedules_match_one_process_and_run_in_their_order(jobs):
    r = job(jobs, "pp.py", ["--width", 32, "--depth", 2, "--batch", 16, "--microbatches", 4])
    runs = r["schedules"]
    assert set(runs) == {"GPipe", "1F1B"}
    for name, run in runs.items():
        assert run["grad_max_abs_diff"] <= 1e-5
        first, last = run["ranks"]
        assert (first["blocks"], first["head"], last["blocks"], last["head"]) == (1, False, 1, True)
        assert first["losses"] == [] and abs(sum(last["losses"]) / 4 - r["reference_loss"]) <= 1e-5
        orders = [" ".join(f"{k}{m}" for k, m, _, _ in got["events"]) for got in run["ranks"]]
        if name == "GPipe":
            assert orders == ["F0 F1 F2 F3 B0 B1 B2 B3"] * 2
        else:
            assert orders == ["F0 F1 B0 F2 B1 F3 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"]
        for got in run["ranks"]:
            assert all(start <= end for _, _, start, end in got["events"])


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
