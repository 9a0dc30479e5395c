"""The GPU cells say which accelerator they need, and the any-accelerator ones hide no CUDA-only call.

A cell guarded by ``requires_accelerator(...)`` promises to run on whichever GPU torch drives (CUDA,
ROCm, MPS, XPU, or the kinds it names). No GPU is needed to check most of that promise:

- statically, from the notebooks' paired sources: no body under ``requires_accelerator`` touches
  ``torch.cuda``, calls ``.cuda()`` or names a ``"cuda"`` device, and none that admits MPS compiles
  (Inductor on MPS is a prototype; such a cell narrows ``kinds``);
- by running them: each such cell of the core notebooks is executed here with
  ``course_utils.device.accelerator`` answering ``torch.device("cpu")`` and the guard answering
  True, so a CUDA-only call would fail on the CPU tensors. The names a cell takes from earlier
  cells come from the notebook's own definitions (read from its twin) or from small stand-ins,
  one function per notebook in ``course_utils.kit.gpu_cells.STATE`` (the GPU check runs the same
  cells on a real GPU from there); the cell's imports are the notebook's own.
- the guards of notebooks 02, 03, 07 and 08 (the ones this issue narrowed) are pinned, so a later
  edit that widens one shows up here.

Not covered: anything on a real GPU or Apple/Intel device (the GPU check, ``make gpu-check``, runs
these cells there), and notebook 03's
Triton cell, which reads the Triton source Inductor writes only for a GPU (on the CPU it writes C++),
so only its static checks apply.
"""

from __future__ import annotations

import ast

import pytest
import torch

from course_utils import bench, config
from course_utils import device as course_device
from course_utils.kit.gpu_cells import GUARDS, STATE, Twin, all_guarded, called_name, free_names

SOURCES = sorted((config.REPO_ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py"))
_called, _free = called_name, free_names


ALL_GUARDED = all_guarded()
ANY_ACCELERATOR = [g for g in ALL_GUARDED if g.guard == "requires_accelerator"]


@pytest.fixture(autouse=True)
def _no_course_device(monkeypatch):
    """Each test starts without ``COURSE_DEVICE``: the GPU check's dry run sets it to cpu, which keeps every
    guard off, and a test that pretends a GPU is there must see its guard open as on a real GPU machine."""
    monkeypatch.delenv("COURSE_DEVICE", raising=False)


# ---- the guards this issue set ---------------------------------------------------------------------

#: notebook -> (guard, kinds, allow_rocm) of each of its guarded cells, in order.
EXPECTED = {
    "00_setup": [("requires_accelerator", None, True)],
    "02_graph_breaks": [("requires_accelerator", ("cuda", "xpu"), True)],    # compiled variants: Triton, not MPS
    "03_compile_internals": [("requires_accelerator", ("cuda", "xpu"), True)],  # reads the Triton kernel
    "05_torch_func": [("requires_accelerator", None, True)],
    "07_onnx": [("requires_cuda", None, False)],          # ONNX Runtime's CUDA provider: NVIDIA's software
    "08_quantization": [("requires_cuda", None, False)],  # FP8 e4m3fn _scaled_mm on sm_89+
    "10_serving": [("requires_accelerator", None, True)],
    "13_serving_engine": [("requires_accelerator", None, True)],
}


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_each_gpu_cell_names_the_accelerators_it_needs(stem):
    found = [(g.guard, g.kinds, g.allow_rocm) for g in Twin(config.REPO_ROOT / "notebooks" / "src" / f"{stem}.py").guarded()]
    assert found == EXPECTED[stem]


def test_no_gpu_cell_is_hidden_inside_another_statement():
    """Only a top-level guard is found (and run) by this test; a nested one would escape it."""
    for path in SOURCES:
        tree = Twin(path).tree
        top = {id(s.test) for s in tree.body if isinstance(s, ast.If)}
        nested = [n.lineno for n in ast.walk(tree) if _called(n) in GUARDS and id(n) not in top]
        assert not nested, f"{path.name}: a guard below the top level of a cell, at lines {nested}"


# ---- static: the bodies --------------------------------------------------------------------------

def _cuda_only(body: list[ast.stmt]) -> list[str]:
    """Return each CUDA-only reference in ``body``: ``torch.cuda``, ``.cuda()``, a ``"cuda"`` device."""
    found = []
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(node, ast.Attribute) and node.attr == "cuda":
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                (node.value == "cuda" or node.value.startswith("cuda:")):
            found.append(f"line {node.lineno}: the device string {node.value!r}")
    return found


@pytest.mark.parametrize("cell", ANY_ACCELERATOR, ids=lambda g: g.label)
def test_an_any_accelerator_body_makes_no_cuda_only_call(cell):
    found = _cuda_only(cell.node.body + cell.node.orelse)
    assert not found, (f"{cell.label}: a cell guarded by requires_accelerator uses CUDA-only calls "
                       f"(use accelerator(), .to(dev), course_utils.device.synchronize): {found}")


@pytest.mark.parametrize("cell", ANY_ACCELERATOR, ids=lambda g: g.label)
def test_a_body_that_compiles_does_not_admit_mps(cell):
    compiles = [n.lineno for n in ast.walk(cell.node) if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute) and ast.unparse(n.func) == "torch.compile"]
    if compiles:
        assert cell.kinds is not None and "mps" not in cell.kinds, (
            f"{cell.label}: torch.compile at lines {compiles} under a guard that admits MPS, where Inductor "
            "is a prototype: narrow kinds=, e.g. ('cuda', 'xpu')")


def test_the_static_check_finds_each_kind_of_cuda_only_call():
    body = ast.parse('a = x.cuda()\nb = torch.zeros(2, device="cuda")\ntorch.cuda.synchronize()\n'
                     'c = x.to("cuda:1")\nd = x.to(dev)\n').body
    assert sorted(f.split(":")[0] for f in _cuda_only(body)) == ["line 1", "line 2", "line 3", "line 4"]


# ---- run: each any-accelerator body on a stand-in device --------------------------------------------

#: Cells checked statically only, and why.
STATIC_ONLY = {
    "03_compile_internals": "it reads the Triton source Inductor writes for a GPU; on a CPU Inductor writes C++",
}


def _verdict_names(stmts: list[ast.stmt]) -> set[str]:
    """Return the literal verdict names the statements record (``name=...``, ``record_verdict("...")``)."""
    names = set()
    for node in ast.walk(ast.Module(body=stmts, type_ignores=[])):
        if not isinstance(node, ast.Call):
            continue
        for kw in node.keywords:
            if kw.arg == "name" and isinstance(kw.value, ast.Constant):
                names.add(kw.value.value)
        if _called(node) == "record_verdict" and node.args and isinstance(node.args[0], ast.Constant):
            names.add(node.args[0].value)
    return names


def test_every_any_accelerator_cell_is_run_here_or_says_why_not():
    stems = {g.twin.path.stem for g in ANY_ACCELERATOR}
    unknown = stems - set(STATE) - set(STATIC_ONLY)
    assert not unknown, (f"requires_accelerator cells in {sorted(unknown)}: add a stand-in state for them to "
                         "STATE in tests/test_gpu_cells.py (or a reason to STATIC_ONLY)")
    assert stems >= set(STATIC_ONLY), "a notebook listed in STATIC_ONLY has no requires_accelerator cell any more"
    with_cells = {g.twin.path.stem for g in ALL_GUARDED}
    assert with_cells >= set(STATE), "a notebook in gpu_cells.STATE has no GPU cell any more"


@pytest.mark.parametrize("cell", [g for g in ANY_ACCELERATOR if g.twin.path.stem in STATE], ids=lambda g: g.label)
def test_an_any_accelerator_cell_runs_on_a_stand_in_device(cell, monkeypatch, tmp_path, capsys):
    guard_calls = []

    def guard(what, kinds=None):
        assert isinstance(what, str) and what.strip(), "the guard says what the cell shows"
        assert kinds is None or set(kinds) <= set(course_device.KNOWN_TYPES) - {"cpu"}, kinds
        guard_calls.append(what)
        return True

    monkeypatch.setattr(course_device, "accelerator", lambda: torch.device("cpu"))
    monkeypatch.setattr(course_device, "requires_accelerator", guard)
    monkeypatch.setenv("COURSE_QUICK", "1")
    results = tmp_path / "results.jsonl"
    monkeypatch.setenv("COURSE_RESULTS", str(results))
    torch.manual_seed(0)

    twin, stmts = cell.twin, cell.cell()
    ns: dict = {"__name__": "__gpu_cell__"}
    STATE[twin.path.stem](twin, ns)
    twin.provide(ns, stmts)
    missing = _free(stmts) - set(ns)
    assert not missing, f"{cell.label} uses {sorted(missing)} from earlier cells: build them in {STATE[twin.path.stem].__name__}"
    twin.run(ns, stmts)

    out = capsys.readouterr().out
    assert guard_calls and "skipped" not in out, out
    recorded = {r["name"] for r in bench.read_results(results)}
    assert _verdict_names(cell.node.body) <= recorded, out


# ---- run_gpu_cells: the path the GPU check takes for a notebook that cannot run whole there ----------

def _write_twin(folder, stem: str, body: str):
    folder.mkdir(exist_ok=True)
    (folder / f"{stem}.py").write_text(body)


def test_run_gpu_cells_reports_a_skip_here_and_the_guard_logs_it(monkeypatch, tmp_path):
    from course_utils.kit import gpu_cells

    monkeypatch.setenv("COURSE_GPU_CELLS", str(tmp_path / "log.jsonl"))
    monkeypatch.setattr(course_device, "accelerator", lambda: None)
    monkeypatch.setattr(course_device, "has_cuda", lambda: False)
    [run] = gpu_cells.run_gpu_cells("00_setup")
    assert run.outcome == "skipped" and run.output.startswith("skipped: needs an accelerator"), run
    assert run.what in (tmp_path / "log.jsonl").read_text()


def test_run_gpu_cells_reports_a_failure_with_its_traceback_and_a_notebook_without_state(monkeypatch, tmp_path):
    from course_utils.kit import gpu_cells

    src = tmp_path / "src"
    _write_twin(src, "00_setup", "# %%\nfrom course_utils.device import requires_cuda\n\n"
                                 "# %%\nif requires_cuda('a broken cell'):\n    1 / 0\n")
    _write_twin(src, "99_other", "# %%\nfrom course_utils.device import requires_cuda\n\n"
                                 "# %%\nif requires_cuda('no state'):\n    pass\n")
    monkeypatch.setattr(course_device, "has_cuda", lambda: True)
    [run] = gpu_cells.run_gpu_cells("00_setup", folder=src)
    assert run.outcome == "failed" and "ZeroDivisionError" in run.error and "00_setup.py" in run.error
    [other] = gpu_cells.run_gpu_cells("99_other", folder=src)
    assert other.outcome == "not run" and "STATE" in other.error
