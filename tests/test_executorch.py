"""ExecuTorch, notebook 06's optional extra: the pinned pair, and (where it is installed, as in
`make test-executorch`) XNNPACK lowering, the .pte round trip, parity with eager and the planned
input bound. The pair checks run everywhere; the rest skip, saying why, without ExecuTorch."""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import re
import sys
import warnings

import pytest
from packaging.version import Version

from course_utils import config

sys.path.insert(0, str(config.REPO_ROOT / "tools"))
try:
    import freeze_extra
finally:
    sys.path.remove(str(config.REPO_ROOT / "tools"))

ROOT = config.REPO_ROOT
#: ExecuTorch release line -> the torch release it is built for (its release notes; its metadata names none).
BUILT_FOR = {"1.3": "2.12", "1.4": "2.13", "1.5": "2.14"}
HAS_EXECUTORCH = importlib.util.find_spec("executorch") is not None
needs_executorch = pytest.mark.skipif(
    not HAS_EXECUTORCH, reason="ExecuTorch is not installed in this environment: `make test-executorch` runs "
                               "these tests in .venv-et, with the pair pinned in constraints-executorch.txt")


def pins(name: str) -> dict[str, str]:
    text = (ROOT / name).read_text(encoding="utf-8")
    return {freeze_extra.norm(ln.split("==")[0]): ln.split("==")[1].strip()
            for ln in text.splitlines() if "==" in ln and not ln.startswith("#")}


def test_extra_pins_add_to_the_tested_set_without_contradicting_it():
    core, extra = pins("constraints.txt"), pins("constraints-executorch.txt")
    assert "executorch" in extra, "constraints-executorch.txt must pin executorch itself"
    assert not set(core) & set(extra), f"pinned in both files: {sorted(set(core) & set(extra))}"


def test_the_pinned_executorch_is_built_for_the_pinned_torch():
    et, torch_v = Version(pins("constraints-executorch.txt")["executorch"]), Version(pins("constraints.txt")["torch"])
    line = f"{et.major}.{et.minor}"
    assert line in BUILT_FOR, f"executorch {et}: add the torch it is built for (its release notes) to BUILT_FOR"
    assert BUILT_FOR[line] == f"{torch_v.major}.{torch_v.minor}", (
        f"executorch {et} is built for torch {BUILT_FOR[line]}, constraints.txt pins torch {torch_v}")


def test_make_targets_and_ci_job():
    makefile = (ROOT / "Makefile").read_text()
    assert "-c constraints.txt -c constraints-executorch.txt" in makefile
    assert "\ntest-executorch:" in makefile and "tests/test_executorch.py notebooks/06_export.ipynb" in makefile
    venv = re.search(r"^ET_VENV\s*\?=\s*(\S+)", makefile, flags=re.M).group(1)
    # torch's export skips ExportedProgram.module()'s shape guards for callers whose path names executorch
    assert "executorch" not in venv, f"ET_VENV={venv}: a venv path with 'executorch' in it changes torch.export"
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the workflow")
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())
    assert any("make test-executorch" in step.get("run", "") for step in flow["jobs"]["executorch"]["steps"])


def test_freeze_extra_keeps_only_what_constraints_do_not_pin():
    freeze = "torch==2.14.1\nexecutorch==1.5.1\nHydra_Core==1.3.8\npip==26.3\n# comment\n-e file:///x\n"
    assert freeze_extra.extra_pins(freeze, "# pins\ntorch==2.14.1\n") == ["executorch==1.5.1", "Hydra_Core==1.3.8"]
    assert freeze_extra.main(["Bad Name"]) == 2


@needs_executorch
def test_installed_pair_is_the_pinned_one():
    import torch

    assert importlib.metadata.version("executorch") == pins("constraints-executorch.txt")["executorch"]
    assert torch.__version__.split("+")[0] == pins("constraints.txt")["torch"]


@contextlib.contextmanager
def quiet_fd2():
    """Hide what the runtime's C++ code logs to file descriptor 2 (its CPU probing)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    """The course's MLP exported with a batch in [1, 16], lowered to XNNPACK, written as a .pte and loaded."""
    import torch
    from torch.export import Dim

    from course_utils.models import MLP

    with quiet_fd2():
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.devtools.backend_debug import get_delegation_info
        from executorch.exir import to_edge_transform_and_lower
        from executorch.runtime import Runtime

    torch.manual_seed(0)
    model = MLP(16, 32, 4).eval()
    ep = torch.export.export(model, (torch.randn(4, 16),), dynamic_shapes={"x": {0: Dim("batch", min=1, max=16)}})
    with warnings.catch_warnings(), quiet_fd2():
        warnings.simplefilter("ignore")
        edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
        split = get_delegation_info(edge.exported_program().graph_module)
        program = edge.to_executorch()
    pte = tmp_path_factory.mktemp("executorch") / "mlp.pte"
    pte.write_bytes(program.buffer)
    with quiet_fd2():
        method = Runtime.get().load_program(str(pte)).load_method("forward")
    return model, split, pte, method


@needs_executorch
def test_xnnpack_takes_the_linear_layers(lowered):
    _, split, _, _ = lowered
    ops = split.delegation_by_operator
    assert split.num_delegated_subgraphs >= 1
    assert ops["aten_linear_default"].delegated == 3 and ops["aten_linear_default"].non_delegated == 0


@needs_executorch
def test_pte_matches_eager_for_every_batch_in_range(lowered):
    import torch

    model, _, pte, method = lowered
    assert pte.stat().st_size > sum(p.numel() * 4 for p in model.parameters())  # the weights are inside
    for n in (1, 5, 16):
        x = torch.randn(n, 16)
        with torch.no_grad(), quiet_fd2():
            err = (method.execute([x])[0] - model(x)).abs().max().item()
        assert err <= 1e-5, f"batch {n}: max |ExecuTorch - eager| = {err}"


@needs_executorch
def test_input_above_the_planned_bound_is_refused(lowered):
    import torch

    _, _, _, method = lowered
    assert list(method.metadata.input_tensor_meta(0).sizes()) == [16, 16]
    with quiet_fd2(), pytest.raises(RuntimeError, match="set_inputs"):
        method.execute([torch.randn(17, 16)])
