"""Every notebook's exercise cells, as shipped, get "Not yet" and a helpful hint from their checker, never a crash.

The stub code is read from the notebooks themselves (each code cell that calls ``exercises.check(``
as a statement), so a stub edited in a notebook is tested as it now reads. The cell runs in a
namespace that holds what the notebook imported before it (its ``import`` statements only: no
model, no measurement) and an ``exercises`` whose ``check`` records the call; the recorded answers
then go to the real checker in strict mode. No stub cell needs more of the notebook's state: the
checkers build their own inputs. Cells that call ``exercises.check`` only inside an ``if`` use what
the notebook measured and are not stubs.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from course_utils import exercises
from course_utils.config import REPO_ROOT

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

#: What each stub's feedback must say: the hint for the mistake the stub makes.
STUB_HINTS = {
    "00.rms_norm": "square, mean over the last dim",
    "00.break_even": "returned None instead of",
    "01.first_bad_backend": "returned None instead of shift_by_1",
    "01.steady_speedup": "returned 1.0 instead of",
    "01.cache_env": "your dict does not set it",
    "02.count_breaks": "expected a whole number",
    "02.fullgraph": "fullgraph=True still refuses it",
    "02.recompile": "you missed",
    "02.size_one": "removes every dimension of size 1",
    "03.count_ops": "Did your backend run?",
    "03.fused_kernels": "whole number",
    "04.cond_export": "give the decision to torch.cond",
    "04.fix_shapes": "same structure, dtype and number of dimensions",
    "04.halvings": "returned None",
    "05.per_sample_grads": "Still the stub?",
    "05.jac_mode": "Return torch.func.jacfwd or torch.func.jacrev",
    "05.ensemble": "returned None",
    "06.dynamic_batch": "None leaves every dimension static",
    "06.cond_export": "give the decision to torch.cond",
    "06.read_cpp_output": "Return a tuple (last epoch's loss, correct / total)",
    "07.median_rewrite": "aten.median",
    "07.dynamic_shapes": "expected a dict",
    "07.ort_feeds": "the keys must be the graph's input names",
    "08.per_channel": "returned None",
    "08.int8_linear": "returned None",
    "09.top_self_op": "Still the stub?",
    "09.count_aten_events": "Count only events whose 'ph' is 'X'",
    "10.p99": "nearest rank",
    "10.parse_sse": "Join the 'token' fields",
    "10.batch_size": "returned None instead of 2",
    "11.attention": "scaled_dot_product_attention",
    "11.sliding_window": "q_idx - kv_idx < window",
    "11.block_sparsity": "mark a tile as needed when any entry is True",
    "12.shard_sizes": "loses the remainder",
    "12.all_reduce": "no rank keeps its own tensor",
    "12.global_batch": "per-rank batch is only one rank's share",
    "13.blocks_needed": "Round UP",
    "13.locate": "pos % block",
    "13.accept_drafts": "first mismatch",
}


def _code_cells(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def _python(source: str) -> ast.Module | None:
    """Return the cell parsed as Python (magics and shell lines left out), or None if it is not Python."""
    lines = [ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _calls_check(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "check"
               and isinstance(n.func.value, ast.Name) and n.func.value.id == "exercises" for n in ast.walk(node))


def _stub_cells(path: Path) -> list[tuple[list[ast.stmt], ast.Module]]:
    """Return each stub cell with the import statements of the cells before it."""
    imports: list[ast.stmt] = []
    stubs = []
    for source in _code_cells(path):
        tree = _python(source)
        if tree is None:
            continue
        if any(_calls_check(st) for st in tree.body if isinstance(st, (ast.Expr, ast.Assign))):
            stubs.append((list(imports), tree))
        imports += [st for st in tree.body if isinstance(st, (ast.Import, ast.ImportFrom))]
    return stubs


class _Recorder:
    """Stands in for ``course_utils.exercises`` inside a stub cell: ``check`` records and says 'Not yet'."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(exercises, name)

    def check(self, name: str, answer: Any, **_: Any) -> exercises.Feedback:
        self.calls.append((name, answer))
        return exercises.Feedback(name, False, "recorded")


def _recorded_stubs(path: Path) -> list[tuple[str, Any]]:
    recorder = _Recorder()
    for imports, tree in _stub_cells(path):
        namespace: dict[str, Any] = {}
        with contextlib.redirect_stdout(io.StringIO()):
            for statement in imports:
                with contextlib.suppress(ModuleNotFoundError):   # a module the notebook writes itself (12: common)
                    exec(compile(ast.Module([statement], []), f"<{path.name} imports>", "exec"), namespace)  # noqa: S102
            namespace["exercises"] = recorder
            exec(compile(tree, f"<{path.name} exercise cell>", "exec"), namespace)  # noqa: S102
    return recorder.calls


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem[:2] for p in NOTEBOOKS])
def test_notebook_stubs_get_not_yet_and_a_hint(notebook):
    calls = _recorded_stubs(notebook)
    number = notebook.name[:2]
    registered = {n for n in exercises.names() if n.startswith(number + ".")}
    assert {name for name, _ in calls} == registered, f"stub cells call {sorted(n for n, _ in calls)}"
    for name, stub in calls:
        fb = exercises.check(name, stub, strict=True)
        assert not fb.correct, f"{name}: the notebook's starting code is accepted"
        assert STUB_HINTS[name] in fb.message, f"{name}: expected {STUB_HINTS[name]!r} in {fb.message!r}"
        assert "\n" not in fb.message and len(fb.message) < 600, fb.message


def test_every_exercise_has_a_stub_hint():
    assert set(STUB_HINTS) == set(exercises.names())


def test_a_cell_that_uses_the_notebooks_results_is_not_a_stub():
    cell = ast.parse('if exercises.check("00.break_even", break_even):\n    print(n)\n')
    plain = ast.parse('fb = exercises.check("00.break_even", break_even)\n')
    assert not any(_calls_check(st) for st in cell.body if isinstance(st, (ast.Expr, ast.Assign)))
    assert any(_calls_check(st) for st in plain.body if isinstance(st, (ast.Expr, ast.Assign)))
