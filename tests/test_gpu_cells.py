"""The GPU cells say which accelerator they need, and the any-accelerator ones hide no CUDA-only call.

A cell guarded by ``requires_accelerator(...)`` promises to run on whichever GPU torch drives (CUDA,
ROCm, MPS, XPU, or the kinds it names). No GPU is needed to check most of that promise:

- statically, from the notebooks' paired sources: no body under ``requires_accelerator`` touches
  ``torch.cuda``, calls ``.cuda()`` or names a ``"cuda"`` device, and none that admits MPS compiles
  (Inductor on MPS is a prototype; such a cell narrows ``kinds``);
- by running them: each such cell of the core notebooks is executed here with
  ``course_utils.device.accelerator`` answering ``torch.device("cpu")`` and the guard answering
  True, so a CUDA-only call would fail on the CPU tensors. The names a cell takes from earlier
  cells come from the notebook's own definitions (read from its twin) or from small stand-ins
  built below, one function per notebook; the cell's imports are the notebook's own.
- the guards of notebooks 02, 03, 07 and 08 (the ones this issue narrowed) are pinned, so a later
  edit that widens one shows up here.

Not covered: anything on a real GPU or Apple/Intel device (none was available), and notebook 03's
Triton cell, which reads the Triton source Inductor writes only for a GPU (on the CPU it writes C++),
so only its static checks apply.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from course_utils import bench, config
from course_utils import device as course_device

SOURCES = sorted((config.REPO_ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py"))
GUARDS = {"requires_accelerator", "requires_cuda"}
BUILTINS = set(dir(builtins))


@dataclass(frozen=True)
class Guarded:
    """One top-level ``if requires_...(...):`` statement of a notebook's paired source."""

    twin: Twin
    node: ast.If
    guard: str
    kinds: tuple[str, ...] | None  # requires_accelerator's kinds= (None: any accelerator)
    allow_rocm: bool               # requires_cuda's allow_rocm=

    @property
    def label(self) -> str:
        return f"{self.twin.path.stem}:{self.node.lineno}"

    def cell(self) -> list[ast.stmt]:
        """Return the statements of the notebook cell the guard sits in, up to and including it."""
        start = max((n for n in self.twin.cell_starts if n < self.node.lineno), default=0)
        return [s for s in self.twin.tree.body if start < s.lineno <= self.node.lineno]


class Twin:
    """A notebook's paired source, parsed: its cells, its imports, its top-level definitions."""

    def __init__(self, path: Path):
        self.path = path
        text = path.read_text(encoding="utf-8")
        self.tree = ast.parse(text, str(path))
        self.cell_starts = [i for i, line in enumerate(text.splitlines(), 1) if line.startswith("# %%")]
        self.imports: dict[str, ast.stmt] = {}
        for stmt in self.tree.body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                for alias in stmt.names:
                    self.imports.setdefault(alias.asname or alias.name.split(".")[0], stmt)

    def guarded(self) -> list[Guarded]:
        """Return the notebook's top-level guarded cells, in order."""
        found = []
        for stmt in self.tree.body:
            call = stmt.test if isinstance(stmt, ast.If) else None
            name = _called(call)
            if name in GUARDS:
                kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
                kinds = kw.get("kinds")
                found.append(Guarded(self, stmt, name, None if kinds is None else tuple(kinds),
                                     kw.get("allow_rocm", True)))
        return found

    def first_binding(self, name: str) -> ast.stmt:
        """Return the first top-level statement that binds ``name`` (an assignment or a def)."""
        for stmt in self.tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)) and stmt.name == name:
                return stmt
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and name in _bound(stmt):
                return stmt
        raise LookupError(f"{self.path.name} defines no {name!r} at the top level")

    def provide(self, ns: dict, stmts: list[ast.stmt]) -> None:
        """Run the notebook's imports of the names ``stmts`` use that ``ns`` lacks."""
        for name in sorted(_free(stmts) - set(ns)):
            if name in self.imports:
                self.run(ns, [self.imports[name]])

    def define(self, ns: dict, *names: str) -> None:
        """Run, in ``ns``, the notebook's own first definition of each of ``names`` (with its imports)."""
        for name in names:
            stmt = self.first_binding(name)
            self.provide(ns, [stmt])
            missing = _free([stmt]) - set(ns)
            assert not missing, f"{self.path.name}:{stmt.lineno} needs {sorted(missing)} to define {name!r}"
            self.run(ns, [stmt])

    def run(self, ns: dict, stmts: list[ast.stmt]) -> None:
        """Execute ``stmts`` in ``ns``; tracebacks point at the paired source's own lines."""
        exec(compile(ast.Module(body=stmts, type_ignores=[]), str(self.path), "exec"), ns)  # noqa: S102


def _called(node: ast.AST | None) -> str | None:
    """Return the name of the function ``node`` calls (``f(...)`` or ``m.f(...)``), or None."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _bound(stmt: ast.AST) -> set[str]:
    """Return the names ``stmt`` binds anywhere inside it (assignments, defs, arguments, imports)."""
    names = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def _free(stmts: list[ast.stmt]) -> set[str]:
    """Return the names ``stmts`` read without binding them (builtins excluded)."""
    module = ast.Module(body=stmts, type_ignores=[])
    loaded = {n.id for n in ast.walk(module) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loaded - _bound(module) - BUILTINS


ALL_GUARDED = [g for path in SOURCES for g in Twin(path).guarded()]
ANY_ACCELERATOR = [g for g in ALL_GUARDED if g.guard == "requires_accelerator"]


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

def _state_00(twin: Twin, ns: dict) -> None:
    """The cell defines what it needs itself (``device = get_device()``)."""


def _state_02(twin: Twin, ns: dict) -> None:
    """The notebook's own functions and its table of variants, with eager stand-ins for the two
    compiled ones (compiling them is what the notebook's CPU cells do; here it would only cost time)."""
    twin.define(ns, "logger", "broken_block", "fixed_block")
    ns["compiled_broken"], ns["compiled_fixed"] = ns["broken_block"], ns["fixed_block"]
    twin.define(ns, "variants")
    ns["big"], ns["hot"] = torch.randn(64, 64), torch.tensor(1.5)


def _state_05(twin: Twin, ns: dict) -> None:
    """The notebook's classifier, and a small batch of digits-shaped inputs (8 rows of 64 features)."""
    twin.define(ns, "clf")
    ns["xb128"], ns["yb128"] = torch.randn(8, 64), torch.randint(0, 10, (8,))


def _state_10(twin: Twin, ns: dict) -> None:
    """The notebook's tokenizer (with its model), and fewer new tokens than the notebook's 32."""
    twin.define(ns, "tok")
    ns["NEW_TOKENS"] = 4


def _state_13(twin: Twin, ns: dict) -> None:
    """The notebook's model configuration and head size."""
    twin.define(ns, "model", "cfg", "HEAD_DIM")


#: notebook -> what the test builds for the names its any-accelerator cell takes from earlier cells.
STATE: dict[str, Callable[[Twin, dict], None]] = {
    "00_setup": _state_00, "02_graph_breaks": _state_02, "05_torch_func": _state_05,
    "10_serving": _state_10, "13_serving_engine": _state_13,
}
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
    assert stems >= set(STATE) | set(STATIC_ONLY), "a notebook listed here has no requires_accelerator cell any more"


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
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
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
