"""The results report: your machine's headline figures beside a reference machine's.

The notebooks record headline results with ``bench.record`` (JSON lines in
``COURSE_RESULTS``). ``python -m course_utils report`` gathers the latest record of
each name into one page, Markdown and a self-contained HTML file with a plot, and puts
each figure beside the one measured on the reference machine described in
``data/reference_results.json``, with a line saying whether yours is in the expected
range for a CPU or a GPU machine. ``make report`` first runs the whole course in full
mode (``--run``, offline like the tests), then builds the page.

A results file may be edited by hand or written by another tool, so every record is
checked: one without a usable name is skipped, one whose value is not a finite number is
shown as "invalid value", and a non-string device, unit, mode or CPU class counts as
missing; each problem is printed as a warning naming the record. Names, units and notes
are shown literally: escaped in Markdown and HTML, and not parsed as mathtext in the plot.

The page ends with the verdicts (faster, slower, no clear difference, ...) where your machine
differs from the reference machine. The notebooks record each printed verdict by name
(``bench.record_verdict``, ``"kind": "verdict"`` in the results file) and the reference machine's
are in ``data/reference_results.json`` under ``verdicts``, so this works on a results file alone,
from any machine (``record_verdict_section``). A results file without verdict records (an older
run) falls back to comparing executed notebooks with the stored ones
(``course_utils.kit.verdicts``).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import config
from ..results import is_verdict
from ..text import counted

REFERENCE_FILE = "reference_results.json"
#: The folder under the report's output folder where ``--run`` leaves the executed notebooks.
EXECUTED_DIR = "executed"
RANGES_FILE = "expected_ranges.json"
#: Verdicts of rows whose recorded value is not a finite number start with this.
INVALID = "invalid value"
#: The optional text fields of a record; any other type counts as missing.
_TEXT_FIELDS = ("unit", "mode", "device", "cpu_class")

#: Receives one line per problem found in the records (default: printed to stderr).
Warn = Callable[[str], None]


@dataclass(frozen=True)
class Row:
    """One headline result with its reference and verdict."""

    name: str
    value: float | None
    unit: str
    mode: str | None
    device: str | None
    reference: float | None
    expected: tuple[float, float] | None
    verdict: str
    cpu_class: str | None = None
    check: str | None = None
    """Why this result cannot vary from run to run (a count the notebook asserts, arithmetic on sizes
    or seeded data), from the expected range's ``"check"``; None for a measurement."""


def _restore_hint(path: Path) -> str:
    return f"restore it with `git checkout -- data/{path.name}`"


def _read_json(path: Path, sections: Sequence[str]) -> dict[str, Any]:
    """Return the JSON object in ``path`` after checking it has a dict in each of ``sections``."""
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; {_restore_hint(path)}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); {_restore_hint(path)}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path} should hold a JSON object, not {type(data).__name__}; {_restore_hint(path)}")
    for key in sections:
        if not isinstance(data.get(key), dict):
            raise ValueError(f"{path} has no {key!r} section; {_restore_hint(path)}")
    return data


def load_reference(path: Path | None = None, ranges: Path | None = None) -> dict[str, Any]:
    """Load the reference machine and its figures (``data/reference_results.json``, written by
    ``tools/make_reference.py`` from a real run) and the expected ranges
    (``data/expected_ranges.json``, set by hand from the issues' targets).

    Raises FileNotFoundError or ValueError naming the file and how to restore it when one
    is missing, not JSON, or lacks a section.
    """
    ref = _read_json(path or config.data_dir() / REFERENCE_FILE, ("machine", "results"))
    ref["expected"] = _read_json(ranges or config.data_dir() / RANGES_FILE, ("expected",))["expected"]
    return ref


def latest(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Return the last record of each name (a later run replaces an earlier one).

    Records that are not dicts, or lack a non-empty string name or a value, are left out.
    """
    out: dict[str, dict[str, Any]] = {}
    for rec in records:
        if not is_verdict(rec) and record_problem(rec) is None:
            out[rec["name"]] = rec
    return out


def _short(rec: Any, limit: int = 120) -> str:
    text = repr(rec)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def record_problem(rec: Any) -> str | None:
    """Return why ``rec`` cannot be a row of the report (no usable name or no value), or None."""
    if not isinstance(rec, dict):
        return f"is not a JSON object ({type(rec).__name__})"
    name = rec.get("name")
    if not isinstance(name, str) or not name.strip():
        return f"has no usable name (name {name!r})"
    if "value" not in rec:
        return "has no value"
    return None


def value_problem(value: Any) -> str | None:
    """Return why ``value`` is not a finite number (bools and numeric strings are not), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{_short(value, 40)} is not a number"
    if not math.isfinite(value):
        return f"{value!r} is not a finite number"
    return None


def _print_warning(line: str) -> None:
    print(f"report: warning: {line}", file=sys.stderr)


def clean_record(rec: dict[str, Any], where: str, warn: Warn = _print_warning) -> dict[str, Any]:
    """Return a copy of ``rec`` whose unit, mode, device and CPU class are strings or None.

    A field of another type is replaced by None and reported through ``warn``, with
    ``where`` (such as "record 3") naming the record.
    """
    out = dict(rec)
    for key in _TEXT_FIELDS:
        value = rec.get(key)
        if value is not None and not isinstance(value, str):
            warn(f"{where} ({rec['name']!r}): {key} {_short(value, 40)} is not a string; treated as unknown")
            out[key] = None
    return out


def latest_valid(records: Sequence[Any], warn: Warn = _print_warning) -> dict[str, dict[str, Any]]:
    """Return the last usable record of each name, cleaned by ``clean_record``.

    Unusable records (see ``record_problem``) are skipped, and records whose value is not
    a finite number kept (the report shows them as invalid); both are reported through
    ``warn``, naming the record by its position (1-based) and content.
    """
    out: dict[str, dict[str, Any]] = {}
    for n, rec in enumerate(records, 1):
        if is_verdict(rec):  # verdicts have their own section (verdict_rows)
            continue
        where = f"record {n}"
        problem = record_problem(rec)
        if problem is not None:
            warn(f"skipped {where} {_short(rec)}: it {problem}")
            continue
        bad_value = value_problem(rec["value"])
        if bad_value is not None:
            warn(f"{where} ({rec['name']!r}): invalid value: {bad_value}")
        out[rec["name"]] = clean_record(rec, where, warn)
    return out


def device_kind(device: str | None) -> str:
    """'gpu' for a result computed on CUDA, else 'cpu' (also for a missing or non-string device).

    A record's device is where its number was computed (``results.record``), so a lesson measured
    on the CPU of a machine that has a GPU is judged against the CPU ranges.
    """
    return "gpu" if isinstance(device, str) and device.startswith("cuda") else "cpu"


def expected_range(expected: dict[str, Any] | None, kind: str,
                   cpu_class: str | None = None) -> tuple[tuple[float, float] | None, str]:
    """Return (range, what it applies to) for a result on this kind of machine.

    A CPU result uses the range of its CPU class (key ``"cpu:<class>"``, such as
    ``"cpu:x86-avx2"``) where one is given, else the ``"cpu"`` range shared by every CPU.
    """
    expected = expected or {}
    if kind == "cpu" and cpu_class and expected.get(f"cpu:{cpu_class}"):
        lo, hi = expected[f"cpu:{cpu_class}"]
        return (float(lo), float(hi)), f"an {cpu_class} CPU"
    bounds = expected.get(kind)
    label = "a CPU machine" if kind == "cpu" else f"a {kind.upper()} machine"
    if not bounds:
        return None, label
    return (float(bounds[0]), float(bounds[1])), label


def judge(value: float | None, expected: dict[str, Any] | None, kind: str,
          cpu_class: str | None = None) -> tuple[tuple[float, float] | None, str]:
    """Return the expected range for this kind of machine (and CPU class) and a one-line verdict."""
    if value is None:
        only = (expected or {}).get("only_where")
        if isinstance(only, str) and only:  # a result the notebook records only on some machines
            return None, f"not recorded by this run: it is measured only on {only} (where yours is one, run its notebook)"
        return None, "not measured yet: run the notebook that records it"
    rng, label = expected_range(expected, kind, cpu_class)
    if rng is None:
        return None, f"no expected range for {label} yet"
    lo, hi = rng
    if lo <= value <= hi:
        return rng, f"in the expected range for {label}"
    side = "below" if value < lo else "above"
    return rng, f"{side} the expected range for {label}"


def reference_for(reference: dict[str, Any], name: str, cpu_class: str | None) -> dict[str, Any] | None:
    """Return the reference figure of ``name`` measured on ``cpu_class`` where there is one, else the main one."""
    by_class = (reference.get("classes") or {}).get(cpu_class or "", {}).get("results", {})
    return by_class.get(name) or reference["results"].get(name)


def _row(name: str, rec: dict[str, Any] | None, reference: dict[str, Any]) -> Row:
    """One row: the learner's cleaned record of ``name`` (or None) beside the reference."""
    rec = rec or {}
    cpu_class = rec.get("cpu_class")
    ref = reference_for(reference, name, cpu_class)
    bad_value = value_problem(rec["value"]) if "value" in rec else None
    value = float(rec["value"]) if "value" in rec and bad_value is None else None
    unit = rec.get("unit") if rec else (ref or {}).get("unit")
    rng, verdict = judge(value, reference["expected"].get(name), device_kind(rec.get("device")), cpu_class)
    if bad_value is not None:
        verdict = f"{INVALID}: {bad_value}; re-run the notebook that records it"
    elif isinstance(rec.get("context"), dict) and rec["context"].get("vacuous"):
        why = rec["context"]["vacuous"]
        verdict += f" (vacuously: {why if isinstance(why, str) else 'nothing was there to check'})"
    return Row(name=name, value=value, unit=unit if isinstance(unit, str) else "", mode=rec.get("mode"),
               device=rec.get("device"), reference=float(ref["value"]) if ref else None, expected=rng,
               verdict=verdict, cpu_class=cpu_class, check=check_reason(reference["expected"].get(name)))


def check_reason(expected: dict[str, Any] | None) -> str | None:
    """Return why a result is a check rather than a measurement: the expected entry's ``"check"``
    text, or, for a range that is one value on every kind of machine, that it is fixed; else None."""
    expected = expected or {}
    if isinstance(expected.get("check"), str):
        return expected["check"]
    bounds = [b for b in (expected.get("cpu"), expected.get("gpu")) if b]
    if bounds and all(len(b) == 2 and b[0] == b[1] for b in bounds):
        return "its expected value is one number on every machine"
    return None


def build_rows(records: Sequence[dict[str, Any]], reference: dict[str, Any],
               warn: Warn = _print_warning) -> list[Row]:
    """Combine the learner's records with the reference: one row per known or recorded name.

    Problems in the records are reported through ``warn`` (see ``latest_valid``), never raised.
    """
    mine = latest_valid(records, warn)
    names = sorted(set(reference["expected"]) | set(reference["results"]) | set(mine))
    return [_row(name, mine.get(name), reference) for name in names]


def _fmt(value: float | None) -> str:
    if value is None:
        return "—"
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.2e}"
    return f"{value:.4g}"


def _range(rng: tuple[float, float] | None) -> str:
    return "—" if rng is None else f"{_fmt(rng[0])} – {_fmt(rng[1])}"


#: Characters that mean something in Markdown text or a table row, escaped in data shown there.
_MD_SPECIALS = re.compile(r"([\\`*_\[\]<>|&~])")


def md_text(text: str) -> str:
    """Return ``text`` as literal Markdown on one line: specials backslash-escaped, newlines as spaces."""
    return _MD_SPECIALS.sub(r"\\\1", " ".join(str(text).splitlines()))


def md_code(text: str) -> str:
    """Return ``text`` as a literal Markdown code span that is safe inside a table cell.

    The fence is one backtick longer than the longest run of backticks in ``text`` and a
    ``|`` is written ``\\|`` (GitHub's table rule, which also applies inside code spans).
    """
    text = " ".join(str(text).splitlines()).replace("|", "\\|")
    runs = [len(run) for run in re.findall("`+", text)]
    fence = "`" * (max(runs, default=0) + 1)
    pad = " " if runs else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _header(reference: dict[str, Any], rows: Sequence[Row] = ()) -> list[str]:
    m = reference["machine"]
    ref_class = m.get("cpu_class", "unknown")
    lines = [f"Reference machine: {m.get('description', '?')}, CPU class {ref_class}; torch {m.get('torch', '?')}, "
             f"Python {m.get('python', '?')}; measured {m.get('date', '?')} ({m.get('mode', 'full')} mode)."]
    mine = sorted({r.cpu_class for r in rows if r.cpu_class})
    if mine:
        same = mine == [ref_class]
        lines.append(f"Your machine: CPU class {', '.join(mine)}"
                     + (" (the reference's class)." if same else
                        f" (the reference is {ref_class}: speed-ups of int8 and vectorised code differ "
                        "between classes; ranges marked for your class apply)."))
    return lines


@dataclass(frozen=True)
class VerdictSection:
    """The page's last section: the verdicts your run printed differently from the reference's."""

    intro: str
    items: tuple[str, ...] = ()
    outro: str = ""


VERDICT_TITLE = "Where your machine's verdicts differ from the reference machine's"


def latest_verdicts(records: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """Return the last verdict record of each name (``bench.record_verdict``'s); others are ignored."""
    out: dict[str, dict[str, Any]] = {}
    for rec in records:
        if is_verdict(rec) and isinstance(rec.get("name"), str) and isinstance(rec.get("verdict"), str):
            out[rec["name"]] = rec
    return out


def _setting(rec: dict[str, Any]) -> Any:
    from .verdicts import Setting

    def whole(key: str) -> int | None:
        value = rec.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    text = {k: rec.get(k) if isinstance(rec.get(k), str) else None for k in ("cpu_class", "mode")}
    return Setting(cpu_class=text["cpu_class"], cores=whole("cores"), threads=whole("threads"),
                   mode=text["mode"], busy=rec.get("noisy") is True)


def record_verdict_section(records: Sequence[Any], reference: dict[str, Any]) -> VerdictSection | None:
    """Return the section comparing your recorded verdicts with the reference machine's, one item per
    verdict that differs with what can explain it; None when ``records`` hold no verdict records."""
    from . import verdicts

    mine = latest_verdicts(records)
    if not mine:
        return None
    ref = reference.get("verdicts") or {}
    if not ref:
        return VerdictSection(f"Your run recorded {counted(len(mine), 'verdict')}, but the reference file has no "
                              "verdicts to compare them with (`tools/make_reference.py` writes them from a "
                              "reference run).")
    items, kinds, same = [], [], 0
    ref_class = (reference.get("machine") or {}).get("cpu_class")  # for reference verdicts that do not carry it
    for name in sorted(set(mine) & set(ref)):
        yours, theirs = mine[name], {"cpu_class": ref_class, **ref[name]}
        if yours["verdict"] == theirs.get("verdict"):
            same += 1
            continue
        ours, other = _setting(theirs), _setting(yours)
        found = verdicts.causes(ours, other, (ours.busy, other.busy), ("the reference", "yours"))
        kinds += [kind for kind, _ in found if kind not in kinds]
        items.append(f"{name}: reference {theirs.get('verdict')}, yours {yours['verdict']} "
                     f"(likely: {'; '.join(label for _, label in found)})")
    compared = same + len(items)
    intro = (f"{len(items)} of the {compared} verdicts recorded on both machines differ from the reference "
             "machine's." if items else
             f"All {compared} verdicts recorded on both machines agree with the reference machine's.")
    outro = ("The notebooks print these as verdicts, not asserts, because they depend on the machine: "
             "read the prose after each with your verdict in mind." if items else "")
    if kinds:
        outro += " Why they flip: " + "; ".join(verdicts.CAUSE_WHY[k] for k in kinds) + "."
    only_mine, only_ref = len(set(mine) - set(ref)), len(set(ref) - set(mine))
    if only_mine or only_ref:
        outro += (f" Not compared: {counted(only_mine, 'verdict')} only your run recorded, {only_ref} only the reference "
                  "recorded (a notebook not run, or run in another version of the course).")
    outro += (" To see the Markdown after each differing verdict, compare two executed copies: "
              "`python -m course_utils.kit.verdicts notebooks/ build/report/executed/`.")
    return VerdictSection(intro, tuple(items), outro.strip())


def verdict_section(executed: Path, stored: Path | None = None) -> VerdictSection:
    """Return the section comparing the verdicts of the executed notebooks in ``executed`` (your
    run) with those of the stored notebooks in ``stored`` (default ``notebooks/``: the reference
    machine's run), one item per flipped verdict with why it can flip.

    Never raises on a bad copy: one that cannot be read is named in the section instead.
    """
    from . import verdicts

    stored = stored or config.REPO_ROOT / "notebooks"
    mine = sorted(executed.glob("[0-9][0-9]_*.ipynb")) if executed.is_dir() else []
    if not mine:
        return VerdictSection(
            f"No executed notebooks in `{executed}`, so no verdicts of yours to compare: this page was built "
            "from a results file alone. `make report` (`python -m course_utils report --run`) runs every "
            f"notebook and keeps the executed copies in the output folder's `{EXECUTED_DIR}/`; for copies "
            "executed elsewhere, add `--executed FOLDER`.")
    items, skipped, kinds, others, compared = [], [], [], 0, 0
    for path in mine:
        try:
            ref, yours = verdicts.load(stored / path.name), verdicts.load(path)
        except verdicts.VerdictInputError as err:
            skipped.append(f"{path.name} ({err})")
            continue
        compared += 1
        diffs = verdicts.compare(ref, yours)
        others += sum(d.kind != "flip" for d in diffs)
        ref_setting = verdicts.parse_setting(verdicts.setting(ref))
        your_setting = verdicts.parse_setting(verdicts.setting(yours))
        for d in (d for d in diffs if d.kind == "flip"):
            found = verdicts.causes(ref_setting, your_setting, d.noisy, ("the reference", "yours"))
            kinds += [kind for kind, _ in found if kind not in kinds]
            items.append(f"{path.stem}, cell {d.cell + 1}: reference {' / '.join(d.a.direction)}, "  # type: ignore[union-attr]
                         f"yours {' / '.join(d.b.direction)}: \"{verdicts.clip(d.b.line, 140)}\" "  # type: ignore[union-attr]
                         f"(likely: {'; '.join(label for _, label in found)})")
    intro = (f"{counted(len(items), 'verdict')} in {counted(compared, 'notebook')} from `{executed}` differ from the reference "
             "machine's run (the stored notebooks)." if items else
             f"No verdict in {counted(compared, 'notebook')} from `{executed}` differs from the reference machine's run.")
    outro = ("The notebooks print these as verdicts, not asserts, because they depend on the machine: "
             "read the prose after each with your verdict in mind." if items else "")
    if kinds:
        outro += " Why they flip: " + "; ".join(verdicts.CAUSE_WHY[k] for k in kinds) + "."
    if others:
        outro += (f" {counted(others, 'more line')} differ in wording only, or were printed by one run only (a cell whose "
                  "output changed shape): "
                  f"`python -m course_utils.kit.verdicts {stored} {executed}` lists them, with the prose after each.")
    if skipped:
        outro += " Not compared: " + "; ".join(skipped) + "."
    return VerdictSection(intro, tuple(items), outro.strip())


def _spans(text: str, code: Callable[[str], str], plain: Callable[[str], str]) -> str:
    """Render ``text`` whose `backticked` parts are code: ``code`` renders those, ``plain`` the rest."""
    parts = text.split("`")
    return "".join(code(p) if i % 2 else plain(p) for i, p in enumerate(parts))


def _section_markdown(section: VerdictSection | None) -> list[str]:
    if section is None:
        return []
    def render(text: str) -> str:
        return _spans(text, md_code, md_text)
    return (["", f"## {VERDICT_TITLE}", "", render(section.intro)]
            + ([""] + [f"- {md_text(item)}" for item in section.items] if section.items else [])
            + (["", render(section.outro)] if section.outro else []))


def _section_html(section: VerdictSection | None) -> list[str]:
    if section is None:
        return []
    esc = html.escape
    def render(text: str) -> str:
        return _spans(text, lambda c: f"<code>{esc(c)}</code>", esc)
    out = [f"<h2>{esc(VERDICT_TITLE)}</h2>", f"<p>{render(section.intro)}</p>"]
    if section.items:
        out.append("<ul>" + "".join(f"<li>{esc(item)}</li>" for item in section.items) + "</ul>")
    if section.outro:
        out.append(f"<p>{render(section.outro)}</p>")
    return out


CHECKS_NOTE = ("Checks cannot vary from run to run: counts the notebook asserts, sizes, arithmetic on "
               "seeded data. One outside its range means the code or the installed packages changed, not "
               "the machine.")


def _md_rows(rows: Sequence[Row]) -> list[str]:
    lines = ["| result | yours | mode | reference | expected | verdict |", "|---|---|---|---|---|---|"]
    for r in rows:
        unit = f" {md_text(r.unit)}" if r.unit else ""
        lines.append(f"| {md_code(r.name)} | {_fmt(r.value)}{unit if r.value is not None else ''} | "
                     f"{md_text(r.mode or '—')} | {_fmt(r.reference)}{unit if r.reference is not None else ''} | "
                     f"{_range(r.expected)} | {md_text(r.verdict)} |")
    return lines


def to_markdown(rows: Sequence[Row], reference: dict[str, Any], section: VerdictSection | None = None) -> str:
    """Return the report as a Markdown page (names, units and notes shown literally): the
    measurements, then the checks, ending with the verdict ``section`` when one is given."""
    measured = sum(r.value is not None for r in rows)
    inside = sum(r.verdict.startswith("in the expected") for r in rows)
    header = [md_text(line) for line in _header(reference, rows)]
    measurements, checks = [r for r in rows if not r.check], [r for r in rows if r.check]
    lines = ["# PyTorch 2 course: your results", ""] + header + [
        "", f"{measured} of {len(rows)} headline results measured; {inside} in the expected range.", "",
        f"## Measurements ({len(measurements)})", ""] + _md_rows(measurements)
    lines += ["", "Figures depend on the machine: a busy laptop, another CPU or a GPU moves them. "
              "'Expected' is the range the course considers healthy for that kind of machine."]
    if checks:
        lines += ["", f"## Checks ({len(checks)})", "", md_text(CHECKS_NOTE), ""] + _md_rows(checks)
    lines += _section_markdown(section)
    return "\n".join(lines) + "\n"


def _ratios(rows: Sequence[Row]) -> list[tuple[Row, float]]:
    """(row, yours ÷ reference) for each row measured on both with a positive finite ratio."""
    out = []
    for r in rows:
        if r.value is not None and r.reference not in (None, 0.0):
            ratio = r.value / r.reference  # type: ignore[operator]
            if math.isfinite(ratio) and ratio > 0:  # a log axis shows only positive ratios
                out.append((r, ratio))
    return out


def plot_png(rows: Sequence[Row]) -> bytes | None:
    """A dot plot of yours ÷ reference for every result measured on both; None when none is.

    Names are drawn literally: never parsed as mathtext (``$``, ``_``, ``^``, ``\\``) nor
    sent to LaTeX, whatever ``text.usetex`` says.
    """
    both = _ratios(rows)
    if not both:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"text.usetex": False}):
        fig, ax = plt.subplots(figsize=(8, 0.28 * len(both) + 1.2))
        try:
            _draw_ratios(ax, both)
            fig.tight_layout()
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=90)
        finally:
            plt.close(fig)
    return buf.getvalue()


def _draw_ratios(ax: Any, both: Sequence[tuple[Row, float]]) -> None:
    """Draw one dot per (row, ratio) on ``ax``, labelled with the row's name taken literally."""
    ratios = [q for _, q in both]
    colors = ["tab:green" if r.verdict.startswith("in the expected") else "tab:orange" for r, _ in both]
    positions = range(len(both))
    ax.hlines(positions, [min(1.0, q) for q in ratios], [max(1.0, q) for q in ratios], color="0.7")
    ax.scatter(ratios, positions, color=colors, zorder=3)
    ax.set_yticks(list(positions), [r.name for r, _ in both], parse_math=False)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("yours ÷ reference (log scale; green: in the expected range)", parse_math=False)
    ax.invert_yaxis()


def to_html(rows: Sequence[Row], reference: dict[str, Any], section: VerdictSection | None = None) -> str:
    """Return the report as one self-contained HTML page (the plot is embedded), ending with the
    verdict ``section`` when one is given."""
    esc = html.escape
    body = ["<h1>PyTorch 2 course: your results</h1>"] + [f"<p>{esc(line)}</p>" for line in _header(reference, rows)]
    png = plot_png(rows)
    if png:
        body.append('<img alt="yours divided by reference" src="data:image/png;base64,'
                    + base64.b64encode(png).decode("ascii") + '">')
    for title, part in ((f"Measurements ({sum(not r.check for r in rows)})", [r for r in rows if not r.check]),
                        (f"Checks ({sum(bool(r.check) for r in rows)})", [r for r in rows if r.check])):
        if not part:
            continue
        body.append(f"<h2>{esc(title)}</h2>")
        if part[0].check:
            body.append(f"<p>{esc(CHECKS_NOTE)}</p>")
        body.append("<table><tr><th>result</th><th>yours</th><th>mode</th><th>reference</th>"
                    "<th>expected</th><th>verdict</th></tr>")
        for r in part:
            cls = "ok" if r.verdict.startswith("in the expected") else "off"
            body.append(f"<tr class='{cls}'><td><code>{esc(r.name)}</code></td>"
                        f"<td>{esc(_fmt(r.value))} {esc(r.unit) if r.value is not None else ''}</td>"
                        f"<td>{esc(r.mode or '—')}</td><td>{esc(_fmt(r.reference))}</td>"
                        f"<td>{esc(_range(r.expected))}</td><td>{esc(r.verdict)}</td></tr>")
        body.append("</table>")
    body += _section_html(section)
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px}"
             "tr.ok td:last-child{color:#176117}tr.off td:last-child{color:#a15c00}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Course results</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


def build(records: Sequence[dict[str, Any]], out_dir: Path,
          reference: dict[str, Any] | None = None, executed: Path | None = None,
          stored: Path | None = None) -> tuple[Path, Path]:
    """Write report.md and report.html into ``out_dir``; return their paths.

    The verdict section compares the verdicts ``records`` hold with the reference's; a run that
    recorded none is compared through its executed notebooks in ``executed`` (default
    ``out_dir/executed``, where ``--run`` leaves them) with the stored ones in ``stored``
    (default ``notebooks/``).
    """
    reference = reference or load_reference()
    rows = build_rows(records, reference)
    section = record_verdict_section(records, reference) or verdict_section(executed or out_dir / EXECUTED_DIR, stored)
    out_dir.mkdir(parents=True, exist_ok=True)
    md, page = out_dir / "report.md", out_dir / "report.html"
    md.write_text(to_markdown(rows, reference, section), encoding="utf-8")
    page.write_text(to_html(rows, reference, section), encoding="utf-8")
    return md, page


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_utils report [--run] [--results FILE] [--out DIR]``."""
    import argparse

    from .. import bench
    from .runner import course_notebooks, run_course, write_summary

    parser = argparse.ArgumentParser(prog="python -m course_utils report")
    parser.add_argument("--run", action="store_true",
                        help="first execute every notebook in full mode (copies go to the build folder)")
    parser.add_argument("--results", type=Path, default=None,
                        help="results file (default: COURSE_RESULTS, or build/report/results.jsonl)")
    parser.add_argument("--cold", action="store_true",
                        help="with --run: start every cache empty, as a first run does (default out: "
                             "build/report-cold)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default build/report)")
    parser.add_argument("--executed", type=Path, default=None,
                        help="executed notebooks whose verdicts to compare with the reference run's "
                             f"(default: the output folder's {EXECUTED_DIR}/, where --run leaves them)")
    args = parser.parse_args(argv)
    # Absolute paths: the notebooks' kernels run in another working directory.
    out = (args.out or config.build_dir() / ("report-cold" if args.cold else "report")).resolve()
    results = (args.results or config.results_path() or out / "results.jsonl").resolve()
    if args.run:
        results.unlink(missing_ok=True)
        # offline: the kernels run with the course's network guard, as in the tests and workshop-check
        runs = run_course(course_notebooks(), quick=False, offline=True, results=results,
                          out_dir=out / EXECUTED_DIR, cold=args.cold)
        summary = write_summary(runs, out / "summary.json", cold=args.cold)
        if not all(r.ok for r in runs):
            print("some notebooks failed; the report shows what was recorded before the failure")
        elif not args.cold:  # the headline total is the warm-cache one
            with config.environment(COURSE_RESULTS=str(results), COURSE_QUICK="0"):  # this run's file, full mode
                bench.record("workshop.full_total_s", summary["total_s"], "s",
                             notebooks=len(runs), machine=summary["machine"])
    records = bench.read_results(results)
    if not records:
        print(f"no results in {results}: run notebooks with COURSE_RESULTS={results}, "
              "or `make report` to run the whole course")
        return 1
    md, page = build(records, out, executed=args.executed.resolve() if args.executed else None)
    print(f"wrote {md} and {page}")
    return 0
