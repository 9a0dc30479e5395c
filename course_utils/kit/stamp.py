"""Write the measured times and the "last passed" stamp into README's table and each notebook.

Reads the summaries of three runs of the whole course on one machine:

- ``make report-cold`` (full mode, every cache empty: what a learner's very first run costs),
- ``make report`` (full mode, compile caches warm),
- ``make workshop-check`` (quick mode),

and rewrites, for each notebook that passed, README's minutes column ("first run / full / quick"),
(a quick-mode run with several notebooks at a time gives no per-notebook minutes, since they shared
the machine: it stamps README's workshop line between ``<!-- stamp:workshop -->`` markers instead),
its "last passed" column ("torch 2.14.1, 2026-11-30 (first run+full+quick)"), and the notebook's own
time line: the text between ``<!-- stamp:time -->`` and ``<!-- /stamp:time -->`` in its
introduction. Nothing in those places is typed by hand, so README and notebook never disagree;
``make stamp`` regenerates them from the latest runs.

A figure of a mode these runs lack is carried over from README together with its own torch and
date: the "last passed" column keeps one group per date ("torch 2.14.1, 2026-12-01 (full);
torch 2.14.1, 2026-11-30 (first run+quick)"), so no sentence claims a date for a figure that was
not measured on it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .. import config
from . import sources

NOTEBOOK_RE = re.compile(r"(\d\d_[A-Za-z0-9_]+\.ipynb)")
STAMP_HEADER = "last passed (torch, date)"
MINUTES_HEADER = "minutes on the reference machine (first run / full / quick)"
TIME_OPEN, TIME_CLOSE = "<!-- stamp:time -->", "<!-- /stamp:time -->"
TIME_RE = re.compile(re.escape(TIME_OPEN) + r".*?" + re.escape(TIME_CLOSE), re.S)
WORKSHOP_OPEN, WORKSHOP_CLOSE = "<!-- stamp:workshop -->", "<!-- /stamp:workshop -->"
WORKSHOP_RE = re.compile(re.escape(WORKSHOP_OPEN) + r"(.*?)" + re.escape(WORKSHOP_CLOSE), re.S)
WORKSHOP_FIGURE_RE = re.compile(r"took ([0-9.]+) min with (\d+) notebooks? at a time")
#: The three modes of a row, in README's order ("first run / full / quick").
MODES = ("first run", "full", "quick")
#: One group of the "last passed" column: "torch 2.14.1, 2026-11-30 (first run+full+quick)".
PASSED_RE = re.compile(r"torch ([^,;()]+), (\d{4}-\d\d-\d\d) \(([a-z +]+)\)")
#: (torch, date) a figure was measured with.
Measured = tuple[str, str]


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return f"{seconds / 60:.1f}"


def _notebook_rows(readme: str, min_cells: int) -> Iterator[tuple[str, list[str]]]:
    """Yield (notebook, cells) for each row of README's notebook table with at least ``min_cells`` cells."""
    in_table = False
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if cells and cells[0] == "notebook":
            in_table = True
        elif in_table and not cells:
            return
        elif in_table and len(cells) >= min_cells and (match := NOTEBOOK_RE.search(cells[0])):
            yield match.group(1), cells


def stated_minutes(readme: str) -> dict[str, tuple[str, str, str]]:
    """Return {notebook: (first run, full, quick)} minutes as README's notebook table states them ("?" where unknown)."""
    stated = {}
    for name, cells in _notebook_rows(readme, 3):
        figures = [v.strip() for v in cells[2].split("/")]
        figures = ["?"] * (3 - len(figures)) + figures if len(figures) < 3 else figures[:3]
        stated[name] = tuple(figures)
    return stated  # type: ignore[return-value]


def parse_passed(cell: str) -> dict[str, Measured]:
    """Return {mode: (torch, date)} from a "last passed" cell (modes it does not name are left out)."""
    out: dict[str, Measured] = {}
    for torch_version, date, modes in PASSED_RE.findall(cell):
        for mode in modes.split("+"):
            if mode.strip() in MODES:
                out[mode.strip()] = (torch_version.strip(), date)
    return out


def format_passed(measured: dict[str, Measured]) -> str:
    """Return a "last passed" cell: one "torch T, DATE (modes)" group per (torch, date), newest first."""
    groups: dict[Measured, list[str]] = {}
    for mode in MODES:
        if mode in measured:
            groups.setdefault(measured[mode], []).append(mode)
    return "; ".join(f"torch {t}, {d} ({'+'.join(m)})"
                     for (t, d), m in sorted(groups.items(), key=lambda g: g[0][1], reverse=True))


def stated_dates(readme: str) -> dict[str, dict[str, Measured]]:
    """Return {notebook: {mode: (torch, date)}} from README's "last passed" column."""
    return {name: parse_passed(cells[-1]) for name, cells in _notebook_rows(readme, 5)}


def stated_quick_seconds(readme: str) -> dict[str, float]:
    """Return {notebook: seconds} of the quick-mode minutes README's notebook table states.

    Rows whose quick figure is not stamped yet ("?") are left out.
    """
    out = {}
    for name, (_, _, quick) in stated_minutes(readme).items():
        try:
            out[name] = float(quick) * 60
        except ValueError:
            continue
    return out


def stated_workshop_seconds(readme: str, jobs: int) -> float | None:
    """Return the seconds README's workshop line states for ``make workshop-check`` with ``jobs``
    notebooks at a time on the reference machine, or None when it states none for that many."""
    match = WORKSHOP_RE.search(readme)
    figure = WORKSHOP_FIGURE_RE.search(match.group(1)) if match else None
    if figure is None or int(figure.group(2)) != jobs:
        return None
    return float(figure.group(1)) * 60


def workshop_line(quick: dict[str, Any]) -> str:
    """Return README's stamped workshop sentence for a quick-mode run (its elapsed time)."""
    jobs = quick.get("jobs", 1)
    wall = quick.get("wall_s", quick["total_s"])
    return (f"{WORKSHOP_OPEN}On the reference machine ({_machine(quick)}, torch {quick['torch']}, "
            f"{quick['date']}) `make workshop-check` took {wall / 60:.1f} min with {jobs} "
            f"notebook{'s' if jobs != 1 else ''} at a time, caches warm.{WORKSHOP_CLOSE}")


def stamp_workshop(readme: str, quick: dict[str, Any] | None) -> tuple[str, bool]:
    """Return README with its workshop line stamped from ``quick`` (when every notebook passed)."""
    if not quick or not quick["runs"] or not all(r["ok"] for r in quick["runs"]) \
            or not WORKSHOP_RE.search(readme):
        return readme, False
    line = workshop_line(quick)
    return WORKSHOP_RE.sub(lambda _: line, readme), True


def per_notebook(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """Return ``summary`` when its per-notebook seconds are one-at-a-time figures, else None."""
    return summary if summary and summary.get("jobs", 1) == 1 else None


def load_summary(path: Path | None) -> dict[str, Any] | None:
    """Return a run summary, or None when ``path`` is None or missing."""
    if path is None or not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def _passed(summary: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    if not summary:
        return {}
    return {r["notebook"]: r for r in summary["runs"] if r["ok"]}


def _machine(summary: dict[str, Any]) -> str:
    cores = summary.get("machine", "?").split(", ")[-1]
    cpu = summary.get("cpu_class")
    return f"{cores}, {cpu}" if cpu else cores


def _when(measured: Measured) -> str:
    return f"torch {measured[0]}, {measured[1]}"


# What a code cell writes to compile through Inductor's FX graph cache: directly, or through the course's server
# (``ServeSettings(compile=True)`` given as ``{"compile": True}``, notebook 10). AOTInductor does not use that
# cache (torch skips it in AOT mode), so a notebook that only compiles ahead of time compiles again on every run.
CACHED_COMPILE_CALLS = ("torch.compile(", '"compile": True')
AOT_COMPILE_CALLS = ("aoti_compile_and_package(",)
WARM_COMPILED = "compile cache warm"
WARM_AOT = "caches warm; AOTInductor compiles again, as it has no cache"
WARM_NOTHING = "caches warm; it compiles nothing"


def warm_words(nb: dict[str, Any]) -> str:
    """Return what a second run of notebook ``nb`` (parsed JSON) finds warm, by what its code cells compile.

    Only a notebook that compiles through Inductor's FX graph cache finds a compile cache warm; one that
    compiles only ahead of time (AOTInductor) or compiles nothing (ONNX Runtime, the serving engine) does not.
    """
    code = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    if any(call in code for call in CACHED_COMPILE_CALLS):
        return WARM_COMPILED
    return WARM_AOT if any(call in code for call in AOT_COMPILE_CALLS) else WARM_NOTHING


def time_line(name: str, cold: dict[str, Any] | None, full: dict[str, Any] | None,
              quick: dict[str, Any] | None, carried: Sequence[str] | None = None,
              carried_dates: dict[str, Measured] | None = None, warm: str = WARM_COMPILED) -> str | None:
    """Return the notebook's stamped time sentence, or None when no run of it passed.

    ``carried``: README's (first run, full, quick) minutes, used for a mode these runs lack, so
    the notebook and its README row always state the same figures; ``carried_dates``: README's
    {mode: (torch, date)} for them, so each carried figure keeps the date it was measured on.
    ``warm``: what the second run finds warm (``warm_words``), so no notebook is said to find a compile cache
    it never uses.
    """
    parts: list[tuple[str, Measured | None]] = []
    minutes: list[str] = []
    seconds: list[float | None] = []  # None for a figure carried from README
    src = None
    for i, (summary, words) in enumerate(((cold, "the first time (every cache empty)"),
                                          (full, f"after that ({warm})"),
                                          (quick, "in quick mode"))):
        run = _passed(summary).get(name)
        if i == 1 and not parts:  # no first-run figure before it: "after that" would follow nothing
            words = f"on a later run ({warm})"
        elif i == 1 and run and (run["seconds"] >= seconds[0] if seconds[0] is not None
                                 else float(_minutes(run["seconds"])) >= float(minutes[0])):
            # The warm run took no less than the first (in seconds where both were measured now, else in the
            # stated minutes): say so, or the line reads as if a warm cache slowed the notebook down.
            words = f"after that ({warm}, yet no faster in these two runs)"
        if run:
            seconds.append(run["seconds"])
            minutes.append(_minutes(run["seconds"]))
            parts.append((f"{minutes[-1]} min {words}", (summary["torch"], summary["date"])))  # type: ignore[index]
            src = src or summary
        elif carried and carried[i] not in ("?", ""):
            seconds.append(None)
            minutes.append(carried[i])
            parts.append((f"{carried[i]} min {words}", (carried_dates or {}).get(MODES[i])))
    if src is None:
        return None
    figures = ", ".join(text for text, _ in parts)
    dates = {when for _, when in parts}
    if len(dates) == 1 and None not in dates:
        when = f"{_machine(src)}, {_when(dates.pop())}"  # type: ignore[arg-type]
    else:  # figures from runs on different days: each says its own
        each = "; ".join(f"{text.split(' min ')[0]} min: "
                         + (_when(measured) if measured else "date not recorded") for text, measured in parts)
        when = f"{_machine(src)}; {each}"
    return (f"{TIME_OPEN}{figures}; measured on the reference machine ({when}) and stamped here by `make stamp`. "
            "A slower or busy laptop takes longer. The outputs stored below may come from another machine: the line "
            f"the imports cell prints names their CPU class (`cpu class:`).{TIME_CLOSE}")


def time_cell(nb: dict[str, Any]) -> dict[str, Any] | None:
    """Return the Markdown cell of notebook ``nb`` (parsed JSON) that holds the time line."""
    return next((c for c in nb["cells"]
                 if c["cell_type"] == "markdown" and TIME_RE.search("".join(c["source"]))), None)


def stamp_notebook(path: Path, cold: dict[str, Any] | None, full: dict[str, Any] | None,
                   quick: dict[str, Any] | None, carried: Sequence[str] | None = None,
                   carried_dates: dict[str, Measured] | None = None) -> bool:
    """Rewrite the time line of notebook ``path`` in place; return whether it was stamped.

    The notebook's paired source (``src/<name>.py``, ``course_utils.kit.sources``), where it has one,
    is rewritten with it, so the pair stays in sync. ValueError when no Markdown cell of the notebook
    has the ``<!-- stamp:time -->`` markers.
    """
    if time_line(path.name, cold, full, quick, carried, carried_dates) is None:  # no run of it passed
        return False
    nb = json.loads(path.read_text(encoding="utf-8"))
    line = time_line(path.name, cold, full, quick, carried, carried_dates, warm=warm_words(nb))
    cell = time_cell(nb)
    if cell is None:
        raise ValueError(f"{path.name}: no Markdown cell has the {TIME_OPEN}...{TIME_CLOSE} "
                         "markers to stamp the time line into")
    cell["source"] = TIME_RE.sub(lambda _: line, "".join(cell["source"])).splitlines(keepends=True)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    if sources.source_of(path).is_file():
        sources.write([path])
    return True


def drop_contradicted(figures: Sequence[str], fresh: Sequence[bool]) -> list[str]:
    """Return (first run, full, quick) minutes with each carried figure that a fresh one contradicts as "?".

    A first run (every cache empty) is never shorter than a run with warm caches, and quick mode never
    longer than full mode, so a carried figure on the wrong side of a freshly measured one of the same
    notebook is stale (the notebook grew or shrank since): it is dropped rather than stated beside it.
    """
    out = list(figures)

    def value(i: int) -> float | None:
        try:
            return float(out[i])
        except ValueError:
            return None

    for longer, shorter in ((0, 1), (0, 2), (1, 2)):  # first run >= full >= quick
        a, b = value(longer), value(shorter)
        if a is None or b is None or a >= b or fresh[longer] == fresh[shorter]:
            continue
        out[shorter if fresh[longer] else longer] = "?"
    return out


def stamp_table(readme: str, quick: dict[str, Any] | None, full: dict[str, Any] | None,
                cold: dict[str, Any] | None = None) -> tuple[str, int]:
    """Return README text with the notebook table stamped, and how many rows were stamped."""
    runs = {"first run": _passed(cold), "full": _passed(full), "quick": _passed(quick)}
    out, stamped, in_table = [], 0, False
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if cells and cells[0] == "notebook":
            in_table = True
            cells[2] = MINUTES_HEADER
            if cells[-1] != STAMP_HEADER:
                cells.append(STAMP_HEADER)
            line = "| " + " | ".join(cells) + " |"
        elif cells and set(cells[0]) <= {"-", ":"} and in_table:
            line = "|" + "---|" * (len(out[-1].strip().strip("|").split("|")))
        elif in_table and cells:
            match = NOTEBOOK_RE.search(cells[0])
            if len(cells) == 4:
                cells.append("")
            name = match.group(1) if match else None
            if name and any(name in r for r in runs.values()):
                old = [v.strip() for v in cells[2].split("/")]
                old = ["?"] * (3 - len(old)) + old if len(old) < 3 else old[:3]  # "full / quick" rows
                fresh = [name in r for r in runs.values()]
                figures = drop_contradicted([_minutes(r[name]["seconds"]) if name in r else previous
                                             for r, previous in zip(runs.values(), old, strict=True)], fresh)
                cells[2] = " / ".join(figures)
                measured = parse_passed(cells[-1])  # modes not re-run keep their own torch and date
                for mode, summary, figure in zip(MODES, (cold, full, quick), figures, strict=True):
                    if name in runs[mode]:
                        measured[mode] = (summary["torch"], summary["date"])  # type: ignore[index]
                    elif figure == "?":
                        measured.pop(mode, None)  # a dropped figure keeps no date
                cells[-1] = format_passed(measured)
                stamped += 1
            line = "| " + " | ".join(cells) + " |"
        elif in_table and not cells:
            in_table = False
        out.append(line)
    return "\n".join(out) + "\n", stamped


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_utils stamp [--quick FILE] [--full FILE] [--cold FILE] [--workshop FILE]``."""
    import argparse

    build = config.build_dir(create=False)
    parser = argparse.ArgumentParser(prog="python -m course_utils stamp")
    parser.add_argument("--quick", type=Path, default=build / "workshop" / "summary.json")
    parser.add_argument("--full", type=Path, default=build / "report" / "summary.json")
    parser.add_argument("--cold", type=Path, default=build / "report-cold" / "summary.json")
    parser.add_argument("--workshop", type=Path, default=None,
                        help="the workshop-check summary whose elapsed time README's workshop line states "
                             "(default: the --quick one), e.g. a two-at-a-time run beside a one-at-a-time --quick")
    parser.add_argument("--readme", type=Path, default=config.REPO_ROOT / "README.md")
    parser.add_argument("--notebooks", type=Path, default=config.REPO_ROOT / "notebooks")
    args = parser.parse_args(argv)
    quick, full, cold = load_summary(args.quick), load_summary(args.full), load_summary(args.cold)
    if quick is None and full is None and cold is None:
        print(f"no run summaries ({args.cold}, {args.full}, {args.quick}): run `make report-cold`, "
              "`make report` and/or `make workshop-check` first")
        return 1
    workshop_run = load_summary(args.workshop) if args.workshop else quick
    text, workshop = stamp_workshop(args.readme.read_text(encoding="utf-8"), workshop_run)
    quick = per_notebook(quick)  # several notebooks at a time: no per-notebook minutes from it
    text, n = stamp_table(text, quick, full, cold)
    args.readme.write_text(text, encoding="utf-8")
    print(f"stamped {n} notebook rows{' and the workshop line' if workshop else ''} in {args.readme}")
    stated, dates = stated_minutes(text), stated_dates(text)  # the table now: runs and carried figures alike
    done = [p.name for p in sorted(args.notebooks.glob("[0-9][0-9]_*.ipynb"))
            if stamp_notebook(p, cold, full, quick, stated.get(p.name), dates.get(p.name))]
    print(f"stamped the time line of {len(done)} notebooks in {args.notebooks}")
    return 0
