"""Which printed verdicts differ between two executed copies of a notebook?

The notebooks print a verdict where a result depends on the machine ("bf16 is 1.3x faster than
fp32", "-> no clear difference on this machine", "lower (15% band)") instead of asserting it.
Run the same notebook on two machines and some verdicts flip; the Markdown right after a
flipped verdict is the prose most likely to be wrong on one of them. This module lists them::

    python -m course_utils.kit.verdicts A.ipynb B.ipynb [C.ipynb D.ipynb ...]
    python -m course_utils.kit.verdicts notebooks/ other-machine/      # paired by file name

How a verdict is found and matched across the two copies:

- A *verdict* is a line a code cell printed to stdout that holds a direction phrase from
  ``DIRECTIONS`` (faster, slower, no clear difference, higher, lower, met, NOT met, pays, does
  not pay, ...), or a line that starts a ``verdict...:`` and holds none of them (then its
  wording after the colon is its direction).
- Its *direction* is the tuple of every direction phrase in the line, normalised (``FASTER``
  is ``faster``, ``not clearly different from`` is ``no clear difference``).
- Its *template* is the text before its first direction phrase, with numbers, CPU class names
  and white space runs replaced by placeholders, and a ratio just before faster or slower
  dropped ("compiled is 2.48x faster" and "compiled is not clearly different" share the
  template "compiled is "). The text after the first direction is left out of the template on
  purpose: the notebooks pick the reason they print from the verdict, so it changes with it.
- A verdict is identified by its cell (the hash of the cell's source; a cell whose source
  differs between the copies is paired by its position among the code cells instead), its
  template and its occurrence number among the cell's lines of that template.

Two verdicts with the same identity and different directions are a *flip*; with the same
direction but other words (beyond numbers), *reworded*: a list of the variants found faster that
names other variants, or "the lower p99 here is static's" against "...iteration's". A verdict whose
identity is in one copy only is reported as *only in A* or *only in B* (the cell printed a
differently shaped line, such as "compiling pays for itself after 4 epochs" against
"compiled epochs were not clearly faster here"), and a cell that has outputs in A but none in
B (a failed or interrupted run) as *not run in B*, once, instead of one line per verdict.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from ..text import counted

#: Direction phrases and their normal form, longest first (the first that matches at a place
#: wins). Built from every verdict the 14 notebooks print: ``bench.Comparison.verdict`` and
#: ``describe``, ``bench.band_verdict`` and the words notebooks map them to by hand.
DIRECTIONS: tuple[tuple[str, str], ...] = (
    (r"not clearly different(?: from)?", "no clear difference"),
    (r"no clearly different number of", "no clear difference"),
    (r"(?:makes |made )?no clear (?:difference|winner|cost)", "no clear difference"),
    (r"not clearly (?:faster|slower|larger|smaller|higher|lower)", "no clear difference"),
    (r"no cost visible", "no clear difference"),
    (r"a measurable cost", "costs"),
    (r"(?:does|do) not pay(?: back)?|never pays", "does not pay"),
    (r"(?:is |are )?(?:never|not) repaid", "does not pay"),
    (r"pays(?: back)?|pay back|paid|(?:is |are )?repaid", "pays"),
    (r"NOT met|misses(?= the)", "not met"),  # "misses the 2x target", not "cache misses"
    (r"met|meets(?= the)", "met"),
    (r"faster", "faster"),
    (r"slower", "slower"),
    (r"higher(?![- ]order)", "higher"),  # not "higher-order operators", "higher order op"
    (r"lower", "lower"),
    (r"shorter", "shorter"),
    (r"longer", "longer"),
    (r"larger", "larger"),
    (r"smaller", "smaller"),
    (r"(?<=served )more", "more"),  # "served more tokens/s than"; plain "more" is too common
    (r"(?<=served )fewer", "fewer"),
)
_DIRECTION = re.compile("|".join(rf"(?:\b(?P<d{i}>{pat})\b)" for i, (pat, _) in enumerate(DIRECTIONS)),
                        re.IGNORECASE)
#: "verdict: ...", "verdict on this machine (2 cores): ..." with no direction phrase
_VERDICT_LEAD = re.compile(r"^(?P<lead>\W*verdict\b[^:]*:)\s*(?P<rest>\S.*)$", re.IGNORECASE)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_CPU_CLASS = re.compile(r"\b(?:x86|arm64)(?:-[a-z0-9]+)+\b|\barm64\b")
_NUMBER = re.compile(r"[-+]?(?:\d[\d,_]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_RATIO_BEFORE = re.compile(r"#x\s+$")


class VerdictInputError(ValueError):
    """A path that is not an executed notebook (missing, not JSON, not a notebook, no outputs)."""


@dataclass(frozen=True)
class Verdict:
    """One verdict line of one executed notebook."""

    cell: int
    """Index of its cell in the notebook (0-based; printed 1-based as "cell N")."""
    template: str
    occurrence: int
    direction: tuple[str, ...]
    line: str


@dataclass(frozen=True)
class Difference:
    """A verdict that differs between copy A and copy B of one notebook."""

    kind: str
    """"flip", "reworded", "only in A", "only in B" or "not run in B"."""
    notebook: str
    cell: int
    """The cell's 0-based index in A (in B for a cell that only B has)."""
    a: Verdict | None
    b: Verdict | None
    markdown: tuple[str, ...] = ()
    """The Markdown cells that follow the verdict's cell, up to the next code cell (from A)."""
    noisy: tuple[bool, bool] = (False, False)
    """Whether the cell warned about a large timing spread in A, in B (a busy machine)."""


@dataclass
class Notebook:
    """An executed notebook read for its verdicts."""

    path: Path
    cells: list[dict[str, Any]]
    code: list[int] = field(default_factory=list)
    """Indices of the code cells, in order."""

    @property
    def name(self) -> str:
        """The file name."""
        return self.path.name


def load(path: Path | str) -> Notebook:
    """Return the executed notebook at ``path``.

    Raises VerdictInputError naming the file when it is missing, not a JSON notebook, or was
    never executed (no code cell has an output).
    """
    path = Path(path)
    if not path.is_file():
        what = "is a folder, not a notebook file" if path.is_dir() else "does not exist"
        raise VerdictInputError(f"{path} {what}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise VerdictInputError(f"{path} is not a notebook (not valid JSON: {err})") from err
    cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
        raise VerdictInputError(f"{path} is not a notebook (no list of cells)")
    nb = Notebook(path, cells, [i for i, c in enumerate(cells) if c.get("cell_type") == "code"])
    if not any(cells[i].get("outputs") for i in nb.code):
        raise VerdictInputError(f"{path} has not been executed: none of its {len(nb.code)} code cells has an "
                                "output (run it first, e.g. jupyter nbconvert --to notebook --execute)")
    return nb


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value or "")


def stdout_lines(cell: dict[str, Any]) -> list[str]:
    """Return what ``cell`` printed to stdout, as lines without colour codes."""
    text = "".join(_text(o.get("text")) for o in cell.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == "stdout")
    return _ANSI.sub("", text).splitlines()


def normalise(text: str) -> str:
    """Return ``text`` with CPU class names as ``<cpu>``, numbers as ``#`` and white space runs as
    one space (so two runs' lines compare equal whatever they measured)."""
    text = _CPU_CLASS.sub("<cpu>", text)
    return " ".join(_NUMBER.sub("#", text).split())


def directions(line: str) -> list[tuple[int, str]]:
    """Return (position, normal form) of each direction phrase in ``line``, in order."""
    out = []
    for m in _DIRECTION.finditer(line):
        index = int(next(k for k, v in m.groupdict().items() if v is not None)[1:])
        out.append((m.start(), DIRECTIONS[index][1]))
    return out


def parse_line(line: str) -> tuple[str, tuple[str, ...]] | None:
    """Return (template, direction) of ``line`` when it is a verdict, else None (see the module
    docstring for both)."""
    found = directions(line)
    if found:
        prefix = _RATIO_BEFORE.sub("", normalise(line[:found[0][0]]) + " ").strip()
        return prefix, tuple(word for _, word in found)
    lead = _VERDICT_LEAD.match(line.strip())
    if lead:
        return normalise(lead["lead"]), (normalise(lead["rest"]),)
    return None


#: The warnings ``bench`` and the notebooks print when a timing's spread is large (a busy machine).
_SPREAD_WARNING = re.compile(r"spread is large|timing spread \(IQR\) was over", re.IGNORECASE)


def warned_spread(cell: dict[str, Any] | None) -> bool:
    """Return whether ``cell`` printed a large-spread warning (its timings were taken on a busy machine)."""
    return cell is not None and any(_SPREAD_WARNING.search(ln) for ln in stdout_lines(cell))


def source_hash(cell: dict[str, Any]) -> str:
    """Return a short hash of the cell's source (trailing white space ignored)."""
    source = "\n".join(ln.rstrip() for ln in _text(cell.get("source")).strip().splitlines())
    return hashlib.sha1(source.encode("utf-8")).hexdigest()[:12]


def cell_verdicts(cell: dict[str, Any], index: int) -> list[Verdict]:
    """Return the verdicts that the cell at ``index`` printed, with their occurrence numbers."""
    seen: Counter[str] = Counter()
    out = []
    for line in stdout_lines(cell):
        parsed = parse_line(line)
        if parsed is None:
            continue
        template, direction = parsed
        seen[template] += 1
        out.append(Verdict(index, template, seen[template], direction, line.strip()))
    return out


def verdicts(nb: Notebook) -> list[Verdict]:
    """Return every verdict the notebook printed, in order."""
    return [v for i in nb.code for v in cell_verdicts(nb.cells[i], i)]


def pair_cells(a: Notebook, b: Notebook) -> list[tuple[int, int]]:
    """Return (index in A, index in B) for the code cells of both copies: by source hash (the
    n-th cell of a hash with the n-th of the same hash), then the rest by their position
    among the code cells."""
    def keyed(nb: Notebook) -> dict[tuple[str, int], int]:
        count: Counter[str] = Counter()
        out = {}
        for i in nb.code:
            h = source_hash(nb.cells[i])
            count[h] += 1
            out[(h, count[h])] = i
        return out

    ka, kb = keyed(a), keyed(b)
    pairs = [(ia, kb[k]) for k, ia in ka.items() if k in kb]
    used_a, used_b = {p[0] for p in pairs}, {p[1] for p in pairs}
    by_position = dict(enumerate(b.code))
    for n, ia in enumerate(a.code):
        ib = by_position.get(n)
        if ia not in used_a and ib is not None and ib not in used_b:
            pairs.append((ia, ib))
            used_a.add(ia)
            used_b.add(ib)
    return sorted(pairs)


def following_markdown(nb: Notebook, index: int) -> tuple[str, ...]:
    """Return the sources of the Markdown cells after cell ``index``, up to the next code cell."""
    out = []
    for cell in nb.cells[index + 1:]:
        if cell.get("cell_type") == "code":
            break
        if cell.get("cell_type") == "markdown":
            out.append(_text(cell.get("source")))
    return tuple(out)


def compare(a: Notebook, b: Notebook) -> list[Difference]:
    """Return every verdict that differs between copy ``a`` and copy ``b``, in A's cell order."""
    diffs: list[Difference] = []
    pairs = pair_cells(a, b)
    paired_a, paired_b = {p[0] for p in pairs}, {p[1] for p in pairs}
    groups: list[tuple[int | None, int | None]] = list(pairs)
    groups += [(ia, None) for ia in a.code if ia not in paired_a]
    groups += [(None, ib) for ib in b.code if ib not in paired_b]
    for ia, ib in groups:
        cell_a = a.cells[ia] if ia is not None else None
        cell_b = b.cells[ib] if ib is not None else None
        va = cell_verdicts(cell_a, ia) if cell_a is not None else []  # type: ignore[arg-type]
        vb = cell_verdicts(cell_b, ib) if cell_b is not None else []  # type: ignore[arg-type]
        where: int = ia if ia is not None else ib  # type: ignore[assignment]
        md = following_markdown(a if ia is not None else b, where)
        noisy = (warned_spread(cell_a), warned_spread(cell_b))
        if va and cell_b is not None and not cell_b.get("outputs"):
            diffs.append(Difference("not run in B", a.name, where, va[0], None, md, noisy))
            continue
        in_a = {(v.template, v.occurrence): v for v in va}
        in_b = {(v.template, v.occurrence): v for v in vb}
        for key, v in in_a.items():
            other = in_b.get(key)
            if other is None:
                diffs.append(Difference("only in A", a.name, where, v, None, md, noisy))
            elif other.direction != v.direction:
                diffs.append(Difference("flip", a.name, where, v, other, md, noisy))
            elif normalise(other.line) != normalise(v.line):
                diffs.append(Difference("reworded", a.name, where, v, other, md, noisy))
        diffs += [Difference("only in B", a.name, where, None, v, md, noisy) for k, v in in_b.items() if k not in in_a]
    return sorted(diffs, key=lambda d: (d.cell, d.kind == "only in B"))


def compare_files(a: Path | str, b: Path | str) -> list[Difference]:
    """Return the differing verdicts of two executed notebook files (see ``compare``)."""
    return compare(load(a), load(b))


def pair_folders(a: Path, b: Path) -> tuple[list[tuple[Path, Path]], list[str]]:
    """Return the notebooks (``NN_*.ipynb``) of folder ``a`` paired by file name with ``b``'s, and
    a note for each one found in only one folder."""
    names_a = {p.name for p in a.glob("[0-9][0-9]_*.ipynb")}
    names_b = {p.name for p in b.glob("[0-9][0-9]_*.ipynb")}
    if not names_a | names_b:
        raise VerdictInputError(f"neither {a} nor {b} holds a course notebook (NN_*.ipynb)")
    notes = [f"{n}: only in {a}" for n in sorted(names_a - names_b)]
    notes += [f"{n}: only in {b}" for n in sorted(names_b - names_a)]
    return [(a / n, b / n) for n in sorted(names_a & names_b)], notes


def setting(nb: Notebook) -> str | None:
    """Return the environment line the setup cell printed (``session.start``: torch, cores and
    threads, CPU class, mode, whether the machine was busy), or None when there is none."""
    for i in nb.code[:4]:
        for line in stdout_lines(nb.cells[i]):
            if line.startswith("torch ") and "cpu class:" in line and "mode:" in line:
                return line.strip()
    return None


@dataclass(frozen=True)
class Setting:
    """What a run's environment line says about the machine it ran on."""

    cpu_class: str | None = None
    cores: int | None = None
    threads: int | None = None
    mode: str | None = None
    busy: bool = False


def parse_setting(line: str | None) -> Setting:
    """Return the fields of an environment line (see ``setting``); unknown ones are None."""
    if not line:
        return Setting()
    cls = re.search(r"cpu class: ([\w.-]+)", line)
    cores = re.search(r"(\d+) cores, (\d+) torch threads", line)
    mode = re.search(r"mode: (\w+)", line)
    return Setting(cpu_class=cls[1] if cls else None, cores=int(cores[1]) if cores else None,
                   threads=int(cores[2]) if cores else None, mode=mode[1] if mode else None,
                   busy="BUSY" in line)


#: Why each kind of cause can flip a verdict (the keys of ``causes``).
CAUSE_WHY = {
    "cpu": "each CPU class runs other kernels and instruction sets (vector width, int8 dot products) in "
           "torch, oneDNN, FBGEMM and ONNX Runtime",
    "mode": "quick mode shrinks sizes and repetitions, so fixed per-call costs weigh more",
    "threads": "another thread count splits the work, and its overhead, differently",
    "busy": "other programs took CPU time during the measurement: the spread widens and a small gap "
            "falls inside or outside the verdict's margin",
    "noise": "with nothing else different, the two measurements lay near the verdict's margin or band",
}


def causes(a: Setting, b: Setting, noisy: tuple[bool, bool] = (False, False),
           names: tuple[str, str] = ("run A", "run B")) -> list[tuple[str, str]]:
    """Return (kind, short label) for each reason a verdict can differ between a run on ``a`` and
    one on ``b`` that their environment lines and the cell's spread warnings (``noisy``) show, most
    telling first; ``CAUSE_WHY[kind]`` says how it flips a verdict, ``names`` name the two runs in
    the labels. "noise" when they show none."""
    out = []
    if a.cpu_class and b.cpu_class and a.cpu_class != b.cpu_class:
        out.append(("cpu", f"a different CPU class ({a.cpu_class} against {b.cpu_class})"))
    if a.mode and b.mode and a.mode != b.mode:
        out.append(("mode", f"a {a.mode}-mode run against a {b.mode}-mode one"))
    if None not in (a.threads, b.threads) and (a.threads, a.cores) != (b.threads, b.cores):
        out.append(("threads", f"other thread counts ({a.threads} torch threads on {a.cores} cores against "
                               f"{b.threads} on {b.cores})"))
    busy = [name for name, flag in zip(names, (a.busy or noisy[0], b.busy or noisy[1])) if flag]
    if busy:
        out.append(("busy", "a busy machine (" + ("both runs" if len(busy) == 2 else busy[0]) + ")"))
    return out or [("noise", "run-to-run variation")]


def clip(text: str, limit: int = 300) -> str:
    """Return ``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit - 1].rstrip() + "…"


def format_difference(d: Difference, markdown_chars: int = 300) -> list[str]:
    """Return the lines the command line prints for one difference."""
    where = f"{d.notebook}, cell {d.cell + 1}"
    if d.kind in ("flip", "reworded"):
        a, b = d.a, d.b
        change = (f"{' / '.join(a.direction)} -> {' / '.join(b.direction)}" if d.kind == "flip"  # type: ignore[union-attr]
                  else f"the same direction ({' / '.join(a.direction)}) in other words")  # type: ignore[union-attr]
        head = [f"{d.kind.upper()}  {where}: {change}", f"  A: {a.line}", f"  B: {b.line}"]  # type: ignore[union-attr]
    elif d.kind == "not run in B":
        head = [f"NOT RUN IN B  {where}: the cell has no outputs in B (it failed or was not reached); "
                f"A printed: {d.a.line}"]  # type: ignore[union-attr]
    else:
        v = d.a or d.b
        head = [f"{d.kind.upper()}  {where}: {v.line}"]  # type: ignore[union-attr]
    body = [f"  markdown: {clip(md, markdown_chars)}" for md in d.markdown if md.strip()]
    return head + (body or ["  markdown: (none before the next code cell)"])


def summary_lines(results: Sequence[tuple[str, list[Difference]]]) -> list[str]:
    """Return the per-notebook counts (flips, only in A, only in B, not run) and the totals."""
    kinds = ("flip", "reworded", "only in A", "only in B", "not run in B")
    lines, total = [], Counter[str]()
    for name, diffs in results:
        count = Counter(d.kind for d in diffs)
        total.update(count)
        lines.append(f"{name:<32} " + ", ".join(f"{count[k]} {k}" for k in kinds))
    lines.append(f"{'total':<32} " + ", ".join(f"{total[k]} {k}" for k in kinds))
    return lines


def _pairs_from(paths: Sequence[Path]) -> tuple[list[tuple[Path, Path]], list[str]]:
    if not paths or len(paths) % 2:
        raise VerdictInputError(f"give pairs of executed notebooks (A B), or two folders; got {counted(len(paths), 'path')}")
    pairs: list[tuple[Path, Path]] = []
    notes: list[str] = []
    for a, b in zip(paths[::2], paths[1::2]):
        if a.is_dir() or b.is_dir():
            if not (a.is_dir() and b.is_dir()):
                raise VerdictInputError(f"{a} and {b}: pair a folder with a folder, a notebook with a notebook")
            found, more = pair_folders(a, b)
            pairs += found
            notes += more
        else:
            pairs.append((a, b))
    return pairs, notes


def run(paths: Iterable[Path | str], out: Any = None) -> int:
    """Compare each pair and print the differences, then the summary; return the exit status
    (0, or 2 when an input is not an executed notebook; the other pairs are still compared)."""
    out = out or sys.stdout
    try:
        pairs, notes = _pairs_from([Path(p) for p in paths])
    except VerdictInputError as err:
        print(f"verdicts: error: {err}", file=sys.stderr)
        return 2
    status, results = 0, []
    for a_path, b_path in pairs:
        try:
            a, b = load(a_path), load(b_path)
        except VerdictInputError as err:
            print(f"verdicts: error: {err}", file=sys.stderr)
            status = 2
            continue
        diffs = compare(a, b)
        results.append((a.name, diffs))
        print(f"== {a.name}: A = {a_path}, B = {b_path}", file=out)
        for label, nb in (("A", a), ("B", b)):
            print(f"   {label} ran with: {setting(nb) or '(no environment line found)'}", file=out)
        sa, sb = parse_setting(setting(a)), parse_setting(setting(b))
        for d in diffs:
            print("\n".join(format_difference(d)), file=out)
            if d.kind == "flip":
                found = causes(sa, sb, d.noisy)
                print("  why it can differ: " + "; ".join(f"{label}: {CAUSE_WHY[kind]}" for kind, label in found),
                      file=out)
        if not diffs:
            print("   no verdict differs", file=out)
    for note in notes:
        print(f"note: {note}", file=out)
    if results:
        print("\nsummary (verdicts that differ, per notebook):", file=out)
        print("\n".join(summary_lines(results)), file=out)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_utils.kit.verdicts A.ipynb B.ipynb [more pairs]`` or ``... DIR_A DIR_B``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m course_utils.kit.verdicts",
        description="List the printed verdicts that differ between two executed copies of a notebook, "
                    "with the Markdown that follows each.")
    parser.add_argument("paths", nargs="+", type=Path,
                        help="A.ipynb B.ipynb [C.ipynb D.ipynb ...], or two folders (paired by file name)")
    return run(parser.parse_args(argv).paths)


if __name__ == "__main__":
    sys.exit(main())
