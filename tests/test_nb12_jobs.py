"""Notebook 12's job scripts, taken from its ``%%writefile`` cells: what the notebook cannot check itself.

The notebook runs under nbval (``make test`` executes it in quick mode), and each of its job cells
asserts what its prose says about that job's result (collectives, DDP, FSDP2 with mixed precision and
the meta device, DTensor, tensor and pipeline parallelism, checkpoints, a killed rank). Running those
jobs again here would only repeat those asserts at other sizes, two fresh processes per job. What is
left is what a notebook run cannot show: that every job it writes is a whole program it launches,
and the four-rank 2-D mesh it prints the command for (two processes cannot run it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

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


def test_tensor_parallel_with_fsdp_on_a_2d_mesh_of_four_ranks(jobs):
    """The command notebook 12 prints for four ranks (it cannot run it on two)."""
    r = job(jobs, "tp.py", ["--width", 32, "--hidden", 64, "--batch", 8, "--dp", 2], nproc=4)
    assert r["world"] == 4 and r["mesh"] == {"dims": {"dp": 2, "tp": 2}, "ranks": [[0, 1], [2, 3]]}
    # each rank's tensor-parallel group is its row of the grid, its data-parallel group its column
    assert r["groups"] == [{"tp": [0, 1], "dp": [0, 2]}, {"tp": [0, 1], "dp": [1, 3]},
                           {"tp": [2, 3], "dp": [0, 2]}, {"tp": [2, 3], "dp": [1, 3]}]
    assert r["out_max_abs_diff"] <= 1e-5 and r["grad_max_abs_diff"] <= 1e-5
    assert r["placements"]["down.weight"]["placements"] == "(Shard(dim=0), Shard(dim=1))"
    assert r["placements"]["down.weight"]["local_shape"] == [16, 32]
    assert r["comms_forward"].get("all_reduce") == 1 and r["comms_backward"].get("all_reduce") == 1
    assert "_allgather_base_" in r["comms_forward"] and "_reduce_scatter_base_" in r["comms_backward"]
