"""The results report: your machine's headline figures beside a reference machine's.

The notebooks record headline results with ``bench.record`` (JSON lines in
``COURSE_RESULTS``). ``python -m course_utils report`` gathers the latest record of
each name into one page, Markdown and a self-contained HTML file with a plot, and puts
each figure beside the one measured on the reference machine described in
``data/reference_results.json``, with a line saying whether yours is in the expected
range for a CPU or a GPU machine. ``make report`` first runs the whole course in full
mode (``--run``), then builds the page.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import config

REFERENCE_FILE = "reference_results.json"
RANGES_FILE = "expected_ranges.json"


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


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; restore it with `git checkout -- data/{path.name}`")
    return json.loads(path.read_text(encoding="utf-8"))


def load_reference(path: Path | None = None, ranges: Path | None = None) -> dict[str, Any]:
    """Load the reference machine and its figures (``data/reference_results.json``, written by
    ``tools/make_reference.py`` from a real run) and the expected ranges
    (``data/expected_ranges.json``, set by hand from the issues' targets)."""
    ref = _read_json(path or config.data_dir() / REFERENCE_FILE)
    ref["expected"] = _read_json(ranges or config.data_dir() / RANGES_FILE).get("expected")
    for key in ("machine", "results", "expected"):
        if key not in ref:
            raise ValueError(f"{path} has no {key!r} section")
    return ref


def latest(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Return the last record of each name (a later run replaces an earlier one)."""
    out: dict[str, dict[str, Any]] = {}
    for rec in records:
        if isinstance(rec, dict) and "name" in rec and "value" in rec:
            out[rec["name"]] = rec
    return out


def device_kind(device: str | None) -> str:
    """'gpu' for CUDA devices, else 'cpu'."""
    return "gpu" if device and device.startswith("cuda") else "cpu"


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


def build_rows(records: Sequence[dict[str, Any]], reference: dict[str, Any]) -> list[Row]:
    """Combine the learner's records with the reference: one row per known or recorded name."""
    mine = latest(records)
    names = sorted(set(reference["expected"]) | set(reference["results"]) | set(mine))
    rows = []
    for name in names:
        rec = mine.get(name)
        ref = reference_for(reference, name, rec.get("cpu_class") if rec else None)
        value = float(rec["value"]) if rec else None
        unit = (rec or ref or {}).get("unit", "")
        kind = device_kind(rec.get("device") if rec else None)
        rng, verdict = judge(value, reference["expected"].get(name), kind,
                             rec.get("cpu_class") if rec else None)
        rows.append(Row(name=name, value=value, unit=unit, mode=rec.get("mode") if rec else None,
                        device=rec.get("device") if rec else None,
                        reference=float(ref["value"]) if ref else None, expected=rng,
                        verdict=verdict, cpu_class=rec.get("cpu_class") if rec else None))
    return rows


def _fmt(value: float | None) -> str:
    if value is None:
        return "—"
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.2e}"
    return f"{value:.4g}"


def _range(rng: tuple[float, float] | None) -> str:
    return "—" if rng is None else f"{_fmt(rng[0])} – {_fmt(rng[1])}"


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


def to_markdown(rows: Sequence[Row], reference: dict[str, Any]) -> str:
    """Return the report as a Markdown page."""
    measured = sum(r.value is not None for r in rows)
    inside = sum(r.verdict.startswith("in the expected") for r in rows)
    lines = ["# PyTorch 2 course: your results", ""] + _header(reference, rows) + [
        "", f"{measured} of {len(rows)} headline results measured; {inside} in the expected range.", "",
        "| result | yours | mode | reference | expected | verdict |",
        "|---|---|---|---|---|---|"]
    for r in rows:
        unit = f" {r.unit}" if r.unit else ""
        lines.append(f"| `{r.name}` | {_fmt(r.value)}{unit if r.value is not None else ''} | "
                     f"{r.mode or '—'} | {_fmt(r.reference)}{unit if r.reference is not None else ''} | "
                     f"{_range(r.expected)} | {r.verdict} |")
    lines += ["", "Figures depend on the machine: a busy laptop, another CPU or a GPU moves them. "
              "'Expected' is the range the course considers healthy for that kind of machine."]
    return "\n".join(lines) + "\n"


def plot_png(rows: Sequence[Row]) -> bytes | None:
    """A dot plot of yours ÷ reference for every result measured on both; None when none is."""
    both = [r for r in rows if r.value is not None and r.reference not in (None, 0.0)]
    if not both:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = [r.value / r.reference for r in both]  # type: ignore[operator]
    fig, ax = plt.subplots(figsize=(8, 0.28 * len(both) + 1.2))
    colors = ["tab:green" if r.verdict.startswith("in the expected") else "tab:orange" for r in both]
    positions = range(len(both))
    ax.hlines(positions, [min(1.0, q) for q in ratios], [max(1.0, q) for q in ratios], color="0.7")
    ax.scatter(ratios, positions, color=colors, zorder=3)
    ax.set_yticks(list(positions), [r.name for r in both])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("yours ÷ reference (log scale; green: in the expected range)")
    ax.invert_yaxis()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def to_html(rows: Sequence[Row], reference: dict[str, Any]) -> str:
    """Return the report as one self-contained HTML page (the plot is embedded)."""
    esc = html.escape
    body = ["<h1>PyTorch 2 course: your results</h1>"] + [f"<p>{esc(line)}</p>" for line in _header(reference, rows)]
    png = plot_png(rows)
    if png:
        body.append('<img alt="yours divided by reference" src="data:image/png;base64,'
                    + base64.b64encode(png).decode("ascii") + '">')
    body.append("<table><tr><th>result</th><th>yours</th><th>mode</th><th>reference</th>"
                "<th>expected</th><th>verdict</th></tr>")
    for r in rows:
        cls = "ok" if r.verdict.startswith("in the expected") else "off"
        body.append(f"<tr class='{cls}'><td><code>{esc(r.name)}</code></td>"
                    f"<td>{esc(_fmt(r.value))} {esc(r.unit) if r.value is not None else ''}</td>"
                    f"<td>{esc(r.mode or '—')}</td><td>{esc(_fmt(r.reference))}</td>"
                    f"<td>{esc(_range(r.expected))}</td><td>{esc(r.verdict)}</td></tr>")
    body.append("</table>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px}"
             "tr.ok td:last-child{color:#176117}tr.off td:last-child{color:#a15c00}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Course results</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


def build(records: Sequence[dict[str, Any]], out_dir: Path,
          reference: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """Write report.md and report.html into ``out_dir``; return their paths."""
    reference = reference or load_reference()
    rows = build_rows(records, reference)
    out_dir.mkdir(parents=True, exist_ok=True)
    md, page = out_dir / "report.md", out_dir / "report.html"
    md.write_text(to_markdown(rows, reference), encoding="utf-8")
    page.write_text(to_html(rows, reference), encoding="utf-8")
    return md, page


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_utils report [--run] [--results FILE] [--out DIR]``."""
    import argparse

    from . import bench
    from .runner import course_notebooks, run_course, write_summary

    parser = argparse.ArgumentParser(prog="python -m course_utils report")
    parser.add_argument("--run", action="store_true",
                        help="first execute every notebook in full mode (copies go to the build folder)")
    parser.add_argument("--results", type=Path, default=None,
                        help="results file (default: COURSE_RESULTS, or build/report/results.jsonl)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default build/report)")
    args = parser.parse_args(argv)
    # Absolute paths: the notebooks' kernels run in another working directory.
    out = (args.out or config.build_dir() / "report").resolve()
    results = (args.results or config.results_path() or out / "results.jsonl").resolve()
    if args.run:
        results.unlink(missing_ok=True)
        runs = run_course(course_notebooks(), quick=False, results=results, out_dir=out / "executed")
        summary = write_summary(runs, out / "summary.json")
        if not all(r.ok for r in runs):
            print("some notebooks failed; the report shows what was recorded before the failure")
        else:
            with config.environment(COURSE_RESULTS=str(results), COURSE_QUICK="0"):  # this run's file, full mode
                bench.record("workshop.full_total_s", summary["total_s"], "s",
                             notebooks=len(runs), machine=summary["machine"])
    records = bench.read_results(results)
    if not records:
        print(f"no results in {results}: run notebooks with COURSE_RESULTS={results}, "
              "or `make report` to run the whole course")
        return 1
    md, page = build(records, out)
    print(f"wrote {md} and {page}")
    return 0
