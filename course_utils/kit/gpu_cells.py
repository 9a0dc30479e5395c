"""The notebooks' GPU cells, found in their paired sources and run on their own.

A GPU cell is a top-level ``if requires_cuda(...):`` or ``if requires_accelerator(...):`` statement
of a notebook (``course_utils.device``'s guards). This module finds them in the notebooks' paired
sources (``notebooks/src/NN_topic.py``) and runs one with only what it takes from earlier cells:

- ``Twin`` parses a paired source: its cells, its imports, its top-level definitions; ``define``
  runs the notebook's own first definition of a name, ``provide`` the imports a statement needs.
- ``STATE`` says, per notebook, how to build the names its GPU cell reads from earlier cells: the
  notebook's own definitions, and for two notebooks small stand-ins (named in each docstring).
- ``run_gpu_cells`` runs every GPU cell of a notebook that way, on the device torch really sees.

Two users: ``tests/test_gpu_cells.py`` runs the any-accelerator cells on a stand-in device here,
and the GPU check (``course_utils.kit.gpu_check``) runs the GPU cells of a notebook that cannot
run whole on the GPU machine (a package it needs is too large to carry there) through this path,
so those cells still execute on the GPU, with the notebook's own code.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from course_utils import config

GUARDS = ("requires_accelerator", "requires_cuda")
_BUILTINS = set(dir(builtins))


def twin_paths(folder: Path | None = None) -> list[Path]:
    """Return the notebooks' paired sources (``notebooks/src/NN_*.py``), in course order."""
    return sorted((folder or config.REPO_ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py"))


@dataclass(frozen=True)
class Guarded:
    """One top-level ``if requires_...(...):`` statement of a notebook's paired source."""

    twin: Twin
    node: ast.If
    guard: str
    what: str                      # the guard's first argument: what the cell shows
    kinds: tuple[str, ...] | None  # requires_accelerator's kinds= (None: any accelerator)
    allow_rocm: bool               # requires_cuda's allow_rocm=

    @property
    def stem(self) -> str:
        """Return the notebook's name without suffix (``"10_serving"``)."""
        return self.twin.path.stem

    @property
    def label(self) -> str:
        """Return ``stem:line`` of the guard in the paired source."""
        return f"{self.stem}:{self.node.lineno}"

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
            if called_name(call) in GUARDS:
                assert isinstance(call, ast.Call)
                kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
                what = ast.literal_eval(call.args[0]) if call.args else ""
                kinds = kw.get("kinds")
                found.append(Guarded(self, stmt, called_name(call) or "", what,
                                     None if kinds is None else tuple(kinds), kw.get("allow_rocm", True)))
        return found

    def first_binding(self, name: str) -> ast.stmt:
        """Return the first top-level statement that binds ``name`` (an assignment or a def)."""
        for stmt in self.tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)) and stmt.name == name:
                return stmt
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and name in bound_names(stmt):
                return stmt
        raise LookupError(f"{self.path.name} defines no {name!r} at the top level")

    def provide(self, ns: dict, stmts: list[ast.stmt]) -> None:
        """Run the notebook's imports of the names ``stmts`` use that ``ns`` lacks."""
        for name in sorted(free_names(stmts) - set(ns)):
            if name in self.imports:
                self.run(ns, [self.imports[name]])

    def define(self, ns: dict, *names: str) -> None:
        """Run, in ``ns``, the notebook's own first definition of each of ``names`` (with its imports)."""
        for name in names:
            stmt = self.first_binding(name)
            self.provide(ns, [stmt])
            missing = free_names([stmt]) - set(ns)
            if missing:
                raise LookupError(f"{self.path.name}:{stmt.lineno} needs {sorted(missing)} to define {name!r}")
            self.run(ns, [stmt])

    def run(self, ns: dict, stmts: list[ast.stmt]) -> None:
        """Execute ``stmts`` in ``ns``; tracebacks point at the paired source's own lines."""
        exec(compile(ast.Module(body=stmts, type_ignores=[]), str(self.path), "exec"), ns)  # noqa: S102


def called_name(node: ast.AST | None) -> str | None:
    """Return the name of the function ``node`` calls (``f(...)`` or ``m.f(...)``), or None."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def bound_names(stmt: ast.AST) -> set[str]:
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


def free_names(stmts: list[ast.stmt]) -> set[str]:
    """Return the names ``stmts`` read without binding them (builtins excluded)."""
    module = ast.Module(body=stmts, type_ignores=[])
    loaded = {n.id for n in ast.walk(module) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loaded - bound_names(module) - _BUILTINS


def all_guarded(folder: Path | None = None) -> list[Guarded]:
    """Return every notebook's GPU cells, in course order."""
    return [g for path in twin_paths(folder) for g in Twin(path).guarded()]


# ---- what each GPU cell takes from earlier cells ---------------------------------------------------

def _state_00(twin: Twin, ns: dict) -> None:
    """The cell defines what it needs itself (``dev = accelerator()``)."""


def _state_02(twin: Twin, ns: dict) -> None:
    """The notebook's own functions and its table of variants, with eager stand-ins for the two
    compiled ones (compiling them is what the notebook's CPU cells do; here it would only cost time)."""
    import torch

    twin.define(ns, "logger", "broken_block", "fixed_block")
    ns["compiled_broken"], ns["compiled_fixed"] = ns["broken_block"], ns["fixed_block"]
    twin.define(ns, "variants")
    ns["big"], ns["hot"] = torch.randn(64, 64), torch.tensor(1.5)


def _state_05(twin: Twin, ns: dict) -> None:
    """The notebook's classifier, and a small batch of digits-shaped inputs (8 rows of 64 features)."""
    import torch

    twin.define(ns, "clf")
    ns["xb128"], ns["yb128"] = torch.randn(8, 64), torch.randint(0, 10, (8,))


def _state_06(twin: Twin, ns: dict) -> None:
    """The notebook's output folder (made, as the notebook's next line does)."""
    twin.define(ns, "OUT")
    ns["OUT"].mkdir(parents=True, exist_ok=True)


def _state_08(twin: Twin, ns: dict) -> None:
    """The notebook's ``to_fp8`` (a tensor scaled into float8_e4m3fn, and its scale)."""
    twin.define(ns, "to_fp8")


def _state_10(twin: Twin, ns: dict) -> None:
    """The notebook's tokenizer (with its model) and its number of new tokens."""
    twin.define(ns, "tok", "NEW_TOKENS")


def _state_13(twin: Twin, ns: dict) -> None:
    """The notebook's model configuration and head size."""
    twin.define(ns, "model", "cfg", "HEAD_DIM")


#: notebook -> what builds the names its GPU cells read from earlier cells, for a run on their own.
STATE: dict[str, Callable[[Twin, dict], None]] = {
    "00_setup": _state_00, "02_graph_breaks": _state_02, "05_torch_func": _state_05, "06_export": _state_06,
    "08_quantization": _state_08, "10_serving": _state_10, "13_serving_engine": _state_13,
}


@dataclass
class CellRun:
    """What happened to one GPU cell run on its own: ``outcome`` is ran, skipped, failed or not run."""

    label: str
    what: str
    outcome: str
    seconds: float = 0.0
    output: str = ""
    error: str = ""


def run_gpu_cells(stem: str, folder: Path | None = None) -> list[CellRun]:
    """Return what happened to each GPU cell of notebook ``stem``, each run on its own here.

    Each cell runs in a fresh namespace built by ``STATE[stem]`` (the notebook's own definitions),
    with the cell's own imports, on the device torch sees (``COURSE_DEVICE`` as set). A cell whose
    guard says no is "skipped", one that raises is "failed" (with its traceback), and a notebook
    without an entry in ``STATE`` gives "not run" for each cell, saying so.
    """
    path = (folder or config.REPO_ROOT / "notebooks" / "src") / f"{stem}.py"
    twin = Twin(path)
    runs = []
    for cell in twin.guarded():
        if stem not in STATE:
            runs.append(CellRun(cell.label, cell.what, "not run",
                                error=f"no state for {stem} in course_utils.kit.gpu_cells.STATE"))
            continue
        stmts = cell.cell()
        out, start = io.StringIO(), time.perf_counter()
        ns: dict = {"__name__": "__gpu_cell__"}
        try:
            with contextlib.redirect_stdout(out):
                STATE[stem](twin, ns)
                twin.provide(ns, stmts)
                missing = free_names(stmts) - set(ns)
                if missing:
                    raise LookupError(f"{cell.label} uses {sorted(missing)} from earlier cells: "
                                      f"build them in STATE[{stem!r}]")
                twin.run(ns, stmts)
        except Exception:  # noqa: BLE001 (a failing cell is a result, reported with its traceback)
            runs.append(CellRun(cell.label, cell.what, "failed", time.perf_counter() - start,
                                out.getvalue(), traceback.format_exc(limit=-8)))
            continue
        text = out.getvalue()
        skipped = any(line.startswith("skipped:") for line in text.splitlines())
        runs.append(CellRun(cell.label, cell.what, "skipped" if skipped else "ran",
                            time.perf_counter() - start, text))
    return runs

