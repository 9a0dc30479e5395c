"""How long does this take? Timing built on ``torch.utils.benchmark``, and headline results.

- ``time_fn``: warm up, then a median and IQR over many timed blocks.
- ``first_call``: seconds for one call (what a first ``torch.compile`` call costs).
- ``page_faults_per_call``: minor page faults per call (fresh memory touched for the first time).
- ``compare``: several variants timed side by side in one run, with ratios.
- ``band_verdict``: higher / lower / no clear difference for figures without a spread.
- ``record``: append a headline result to the ``COURSE_RESULTS`` file (the ledger lives in
  ``course_utils.results``; notebooks call it as ``bench.record`` beside their timings).
- ``record_verdict``: the same for a printed verdict, under its own stable name; ``verdict``,
  ``describe`` and ``band_verdict`` record theirs when given ``name=``.
- ``bar_chart``: a matplotlib bar chart of a comparison.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.utils import benchmark

from . import config, threads
from .device import synchronize
from .results import read_results, record, record_verdict  # noqa: F401 (the notebooks' bench.record)

#: A row whose IQR exceeds this share of its median makes a table print a "timings are rough" note.
NOISY_SPREAD = 0.2
#: How far apart two medians must be, at least, for ``Comparison.verdict`` to call one faster.
VERDICT_MARGIN = 0.05
#: Other programs' CPU use (cores) from which a noisy table's note blames them.
BUSY_LOAD = 0.5


def _sync_all() -> None:
    """Wait for the accelerator torch sees (CUDA, ROCm, XPU or MPS), so a timing covers its queued work."""
    from .device import accelerator

    acc = accelerator()
    if acc is not None:
        synchronize(acc)


@dataclass(frozen=True)
class Timing:
    """Median and interquartile range of one callable's run time, in seconds."""

    label: str
    median_s: float
    iqr_s: float
    samples: int

    @property
    def median_ms(self) -> float:
        """Return the median in milliseconds."""
        return self.median_s * 1e3


def _quantiles(times: list[float]) -> tuple[float, float]:
    if len(times) == 1:
        return times[0], 0.0
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return statistics.median(times), q3 - q1


def _timer(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
           label: str, num_threads: int | None) -> benchmark.Timer:
    return benchmark.Timer(
        stmt="fn(*args, **kwargs)",
        globals={"fn": fn, "args": args, "kwargs": kwargs},
        label=label,
        # Timer defaults to ONE thread; use what torch uses unless told otherwise.
        num_threads=num_threads or torch.get_num_threads(),
    )


def _warm(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], warmup: int) -> None:
    for _ in range(warmup):
        fn(*args, **kwargs)
    _sync_all()


def time_fn(fn: Callable[..., Any], *args: Any, label: str = "", warmup: int = 3,
            min_run_time: float | None = None, num_threads: int | None = None,
            rounds: int = 3, **kwargs: Any) -> Timing:
    """Return the steady-state ``Timing`` of ``fn(*args, **kwargs)``.

    Calls it ``warmup`` times first (so compilation is not timed), then runs
    ``torch.utils.benchmark.Timer.blocked_autorange`` ``rounds`` times, sharing
    ``min_run_time`` seconds (0.2 s in quick mode, 1 s otherwise). Each round gives
    at least one timed block, so the median and IQR always rest on ``rounds`` or
    more samples, even when a busy machine makes the timer pick long blocks.
    CUDA work is synchronised.
    """
    if not callable(fn):
        raise TypeError(f"expected a callable, got {type(fn).__name__}")
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    label = label or getattr(fn, "__name__", "fn")
    _warm(fn, args, kwargs, warmup)
    run_time = (min_run_time if min_run_time is not None else config.pick(0.2, 1.0)) / rounds
    timer = _timer(fn, args, kwargs, label, num_threads)
    times: list[float] = []
    for _ in range(rounds):
        times += list(timer.blocked_autorange(min_run_time=run_time).times)
    median, iqr = _quantiles(times)
    return Timing(label, median, iqr, len(times))


def first_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
    """Return the wall-clock seconds of one call to ``fn`` (with CUDA synchronised).

    Call it on a freshly compiled function to measure compile latency.
    """
    _sync_all()
    start = time.perf_counter()
    fn(*args, **kwargs)
    _sync_all()
    return time.perf_counter() - start


def page_faults_per_call(fn: Callable[..., Any], *args: Any, calls: int = 10, **kwargs: Any) -> float | None:
    """Return the minor page faults this process took per call of ``fn``, over ``calls`` calls after one
    warm call; None where the OS does not count them for Python (``resource`` is missing on Windows).

    A minor fault is the first touch of a fresh page of memory: the kernel maps and zeroes it. A call
    whose new tensors come straight from the operating system pays one per 4 KiB page of them; one whose
    allocator reuses freed memory pays none. The count is the whole process's, so other threads' faults
    meanwhile count too.
    """
    try:
        import resource
    except ImportError:  # Windows
        return None
    if calls < 1:
        raise ValueError(f"calls must be at least 1, got {calls}")
    fn(*args, **kwargs)
    _sync_all()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        fn(*args, **kwargs)
    _sync_all()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


#: What Inductor's on-disk FX graph cache can do with one compiled graph: find it from an earlier run (hit),
#: compile and store it (miss), or decline to store it (bypass, e.g. a graph holding ``torch.cond``).
CACHE_EVENTS = ("hit", "miss", "bypass")


def first_call_and_cache(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[float, dict[str, int]]:
    """Return ``first_call(fn, ...)`` and what Inductor's graph cache did meanwhile, as counts of each of
    ``CACHE_EVENTS`` (all zero when nothing was compiled or the cache is off)."""
    from torch._dynamo.utils import counters

    before = {e: counters["inductor"][f"fxgraph_cache_{e}"] for e in CACHE_EVENTS}
    seconds = first_call(fn, *args, **kwargs)
    return seconds, {e: counters["inductor"][f"fxgraph_cache_{e}"] - before[e] for e in CACHE_EVENTS}


def _checked_events(events: Mapping[str, int]) -> dict[str, int]:
    unknown = set(events) - set(CACHE_EVENTS)
    if unknown:
        raise ValueError(f"unknown graph-cache events {sorted(unknown)}; expected some of {CACHE_EVENTS}")
    bad = {e: n for e, n in events.items() if not isinstance(n, int) or isinstance(n, bool) or n < 0}
    if bad:
        raise ValueError(f"graph-cache event counts must be whole numbers from 0 up, got {bad}")
    return {e: events.get(e, 0) for e in CACHE_EVENTS}


def cache_words(events: Mapping[str, int]) -> str:
    """One call's graph-cache events as counts, as ``first_call_and_cache`` returns them: ``"miss 2"``,
    ``"hit 1, bypass 1"``, or ``"no cache events"`` when there were none."""
    counts = _checked_events(events)
    return ", ".join(f"{e} {n}" for e, n in counts.items() if n) or "no cache events"


def graphs_built(events: Mapping[str, int]) -> int:
    """How many graphs a first call compiled itself, from its graph-cache events as ``first_call_and_cache``
    returns them: misses plus bypasses (a hit's code came from the cache)."""
    counts = _checked_events(events)
    return counts["miss"] + counts["bypass"]


def first_call_words(events: Mapping[str, int]) -> str:
    """What a first call did, read from its graph-cache events: ``"compiled: miss 2"``, ``"traced, code from the
    cache: hit 2"`` (Dynamo still traces; the generated code was found), ``"compiled, part from the cache: hit 1,
    miss 1"``, or ``"no cache events"`` (nothing compiled, or the cache is off)."""
    counts = _checked_events(events)
    built = graphs_built(counts)
    if not counts["hit"] and not built:
        return "no cache events"
    what = ("traced, code from the cache" if not built else "compiled" if not counts["hit"]
            else "compiled, part from the cache")
    return f"{what}: {cache_words(counts)}"


@dataclass(frozen=True)
class Row:
    """One variant in a comparison: its timing and its speed-up over the baseline."""

    label: str
    median_s: float
    iqr_s: float
    speedup: float

    @property
    def band(self) -> tuple[float, float]:
        """The interquartile band the verdicts compare: (median - IQR/2, median + IQR/2), in seconds."""
        return self.median_s - self.iqr_s / 2, self.median_s + self.iqr_s / 2


def bands_overlap(a: Row, b: Row) -> bool:
    """Whether two rows' interquartile bands share any value (rows may come from different comparisons)."""
    return a.band[0] <= b.band[1] and b.band[0] <= a.band[1]


@dataclass(frozen=True)
class Comparison:
    """Variants timed side by side; ``speedup`` is baseline time / variant time (>1 is faster).

    ``device`` is where the variants ran (``"cpu"`` or ``"cuda"``); a recorded verdict carries it.
    ``other_load`` is how many cores' worth of CPU other programs used just after the timings
    (``threads.other_load``; ``compare`` samples it only when the spread is large), None if unknown.
    """

    baseline: str
    rows: list[Row] = field(default_factory=list)
    device: str = "cpu"
    other_load: float | None = None

    @classmethod
    def from_samples(cls, samples: Mapping[str, list[float]], baseline: str | None = None, *,
                     device: torch.device | str | None = None) -> Comparison:
        """Return a comparison of timings measured elsewhere (seconds per sample, for example one
        per training epoch), so they get the same noise-aware ``verdict`` as ``compare``'s.
        ``device`` is where they were measured (default: the CPU)."""
        if not samples or any(not times for times in samples.values()):
            raise ValueError("from_samples() needs at least one timing for every variant")
        baseline = baseline or next(iter(samples))
        if baseline not in samples:
            raise KeyError(f"baseline {baseline!r} is not one of {list(samples)}")
        stats = {name: _quantiles(list(times)) for name, times in samples.items()}
        base = stats[baseline][0]
        where = torch.device(device).type if device is not None else "cpu"
        return cls(baseline, [Row(name, med, iqr, base / med) for name, (med, iqr) in stats.items()], where)

    def row(self, label: str) -> Row:
        """Return the row called ``label``; KeyError names the labels that exist."""
        for r in self.rows:
            if r.label == label:
                return r
        raise KeyError(f"no variant {label!r}; variants: {[r.label for r in self.rows]}")

    def speedup(self, label: str) -> float:
        """Return baseline median / ``label`` median."""
        return self.row(label).speedup

    def ratio(self, slower: str, faster: str) -> float:
        """Return ``slower`` median / ``faster`` median for any two variants."""
        return self.row(slower).median_s / self.row(faster).median_s

    def verdict(self, label: str, against: str | None = None, margin: float = VERDICT_MARGIN, *,
                name: str | None = None) -> str:
        """Return "faster", "slower" or "no clear difference" for ``label`` against ``against``.

        The rule: ``label`` is faster when its median is more than ``margin`` (5%) below the
        other's *and* the two interquartile bands (median ± IQR/2, timed in interleaved
        rounds) do not overlap; slower the other way round; anything else is no clear
        difference. ``against`` defaults to the baseline. With ``name``, the verdict is also
        recorded under that name (``record_verdict``), with the ratio and whether either row's
        spread was large.
        """
        other = against or self.baseline
        a, b = self.row(label), self.row(other)
        (a_lo, a_hi), (b_lo, b_hi) = a.band, b.band
        if a.median_s < b.median_s * (1 - margin) and a_hi < b_lo:
            word = "faster"
        elif a.median_s > b.median_s * (1 + margin) and a_lo > b_hi:
            word = "slower"
        else:
            word = "no clear difference"
        if name is not None:
            noisy = any(r.median_s and r.iqr_s / r.median_s > NOISY_SPREAD for r in (a, b))
            record_verdict(name, word, noisy=noisy, device=self.device, label=label, against=other,
                           ratio=round(b.median_s / a.median_s, 4), margin=margin)
        return word

    def describe(self, label: str, against: str | None = None, *, name: str | None = None,
                 against_as: str | None = None) -> str:
        """Return a phrase such as "2.31x faster than fp32 eager" or "not clearly different from ...".

        Uses ``verdict`` (so a difference inside the timing spread is never called a speed-up); a
        "not clearly different" phrase says which rule decided: the medians within the 5% margin, or
        the timing spread. Where the 5% margin decided but the speed ratio rounds to 1.05x or 0.95x, the
        phrase gives the gap in time, which is what the margin is on. ``name`` records that verdict.
        ``against_as`` names the other row in the phrase where its table label reads badly in a sentence
        (``against_as="eager PyTorch"`` for the row "eager, 2 tokens").
        """
        other = against or self.baseline
        ratio = self.ratio(other, label)
        word = self.verdict(label, other, name=name)
        shown = against_as or other
        if word == "faster":
            return f"{ratio:.2f}x faster than {shown}"
        if word == "slower":
            return f"{1 / ratio:.2f}x slower than {shown} (it takes {1 / ratio:.2f}x the time)"
        if not self.within_margin(label, other):
            return f"not clearly different from {shown} ({ratio:.2f}x, inside the timing spread)"
        if abs(float(f"{ratio:.2f}") - 1) < VERDICT_MARGIN - 1e-9:
            return f"not clearly different from {shown} ({ratio:.2f}x, within {VERDICT_MARGIN:.0%})"
        # The margin is on the median time; as a speed ratio the same gap can round to 1.05x or 0.95x, which
        # would read as outside a 5% margin, so say how far apart the times are.
        a, b = self.row(label).median_s, self.row(other).median_s
        gap = f"{abs(a - b) / b:.1%} {'less' if a < b else 'more'} time than {shown}"
        return f"not clearly different from {shown} ({ratio:.2f}x: {gap}, within the {VERDICT_MARGIN:.0%} margin)"

    def bands_text(self, label: str, against: str | None = None) -> str:
        """Return the two interquartile bands ``verdict`` compares (median ± IQR/2, in ms) and whether
        they overlap, e.g. "median ± IQR/2: a 2.510-3.320 ms, b 3.290-7.180 ms; the bands overlap"."""
        other = against or self.baseline
        a, b = self.row(label), self.row(other)
        (a_lo, a_hi), (b_lo, b_hi) = a.band, b.band
        overlap = bands_overlap(a, b)
        return (f"median ± IQR/2: {label} {a_lo * 1e3:.3f}-{a_hi * 1e3:.3f} ms, {other} {b_lo * 1e3:.3f}-"
                f"{b_hi * 1e3:.3f} ms; the bands {'overlap' if overlap else 'are apart'}")

    def within_margin(self, label: str, against: str | None = None) -> bool:
        """True when ``label``'s median is within ``VERDICT_MARGIN`` (5%) of ``against``'s (default: the
        baseline): a tie the margin decides, as opposed to one the overlapping timing spreads decide."""
        a, b = self.row(label), self.row(against or self.baseline)
        return b.median_s * (1 - VERDICT_MARGIN) <= a.median_s <= b.median_s * (1 + VERDICT_MARGIN)

    def to_markdown(self) -> str:
        """Return the comparison as a Markdown table."""
        lines = [f"| variant | median (ms) | IQR (ms) | speed-up vs {self.baseline} |",
                 "|---|---:|---:|---:|"]
        lines += [f"| {r.label} | {r.median_s * 1e3:.3f} | {r.iqr_s * 1e3:.3f} | {r.speedup:.2f}x |"
                  for r in self.rows]
        return "\n".join(lines)

    def with_load(self) -> Comparison:
        """Return this comparison with ``other_load`` sampled now where ``compare`` left it unsampled (it samples
        only for a large spread), so a reason can name other programs' load whatever the spread. Call it right
        after the timings."""
        return self if self.other_load is not None else replace(self, other_load=threads.other_load())

    def load_note(self) -> str:
        """Return "other programs used about 1.1 cores just after the timings" when ``other_load`` was
        sampled at ``BUSY_LOAD`` or more; "" when it was lower or not sampled. A reason names other
        programs' load as a cause only through this, so it never blames load nobody measured."""
        if self.other_load is None or self.other_load < BUSY_LOAD:
            return ""
        return f"other programs used about {self.other_load:.1f} cores just after the timings"

    def spread_note(self, limit: float = NOISY_SPREAD, *, cause: str | None = None) -> str:
        """Return one line warning that the timings are rough when a row's IQR exceeds ``limit``
        (20%) of its median; "" otherwise. ``cause`` says why the spread is large where the caller
        knows; by default the note goes by ``other_load``: other programs busy (at least ``BUSY_LOAD``
        cores) just after the timings, other programs quiet (so the calls themselves varied), or unknown."""
        worst = max(self.rows, key=lambda r: r.iqr_s / r.median_s if r.median_s else 0.0, default=None)
        if worst is None or not worst.median_s or worst.iqr_s / worst.median_s <= limit:
            return ""
        share = f"{worst.iqr_s / worst.median_s:.0%}"
        if share == f"{limit:.0%}":  # just over the limit, which rounds to it: a decimal more
            share = f"{worst.iqr_s / worst.median_s:.1%}"
        head = f"note: the spread is large (IQR {share} of the median for {worst.label!r}): "
        return head + (cause if cause is not None else _spread_cause(self.other_load)).rstrip(".") + self._order_holds(worst)

    def _order_holds(self, worst: Row) -> str:
        """Return "; even so, ..." when the noisiest row is clearly faster or slower than every other row by
        ``verdict``'s rule (5% margin, bands apart), so the note does not leave a learner doubting a ranking
        the spread cannot overturn; "" otherwise (or in a one-row table)."""
        others = [r for r in self.rows if r is not worst]
        if not others or any(self.verdict(worst.label, r.label) == "no clear difference" for r in others):
            return ""
        whom = repr(others[0].label) if len(others) == 1 else "every other row"
        return (f"; even so, {worst.label!r} stays clearly apart from {whom} (beyond the 5% margin, with the "
                "median ± IQR/2 bands apart), so the spread does not change the order, only the exact figures")

    def format(self, *, cause: str | None = None) -> str:
        """Return the comparison as a text table, with ``spread_note(cause=cause)`` under it when
        the spread is large (``str(comparison)`` is ``format()``)."""
        width = max(len(r.label) for r in self.rows) if self.rows else 7
        head = f"{'variant':<{width}}  {'median ms':>10}  {'IQR ms':>8}  {'vs ' + self.baseline:>12}"
        body = [f"{r.label:<{width}}  {r.median_s * 1e3:>10.3f}  {r.iqr_s * 1e3:>8.3f}  {r.speedup:>11.2f}x"
                for r in self.rows]
        note = self.spread_note(cause=cause)
        return "\n".join([head, *body, *([note] if note else [])])

    def __str__(self) -> str:
        return self.format()


def _spread_cause(other_load: float | None) -> str:
    """Why timings spread, by how many cores other programs used just after them (None: unknown)."""
    if other_load is None:
        return ("the timings varied from call to call, so treat them as rough and rerun the cell; "
                "close other programs first if any are busy")
    if other_load >= BUSY_LOAD:
        return (f"other programs were using about {other_load:.1f} cores just after the timings, so treat "
                "them as rough and rerun the cell when the machine is quiet")
    return (f"other programs were nearly idle just after the timings (about {other_load:.1f} cores), so the "
            "calls themselves varied (clock speed, caches, memory, or a burst of other work that had ended); "
            "treat them as rough and rerun the cell")


def noisy_note(tables: Mapping[str, Comparison], *, where: str = "for") -> str:
    """Return one note for several comparisons (label -> table) naming those whose spread is large
    (``Comparison.spread_note``) and why, by the other programs' load each of them saw (tables with
    different causes get a clause each); "" when none.

    ``where`` joins the labels to the sentence: "note: the timing spread (IQR) was over 20% of the median
    {where} {labels}: {cause}".
    """
    noisy = [label for label, table in tables.items() if table.spread_note()]
    if not noisy:
        return ""
    # Group the tables by the cause their own load sample gives: busy, nearly idle, or not sampled.
    groups: dict[str, list[str]] = {}
    for label in noisy:
        load = tables[label].other_load
        kind = "unknown" if load is None else "busy" if load >= BUSY_LOAD else "idle"
        groups.setdefault(kind, []).append(label)

    def cause(kind: str) -> str:
        loads = [tables[label].other_load for label in groups[kind]]
        return _spread_cause(None if kind == "unknown" else max(loads) if kind == "busy" else min(loads))

    head = f"note: the timing spread (IQR) was over {NOISY_SPREAD:.0%} of the median {where} {', '.join(noisy)}: "
    if len(groups) == 1:
        return head + cause(next(iter(groups)))
    return head + "; ".join(f"{where} {', '.join(groups[kind])}, {cause(kind)}"
                            for kind in ("busy", "idle", "unknown") if kind in groups)


def band_verdict(value: float, other: float, band: float = 0.1, *, name: str | None = None,
                 device: torch.device | str | None = None) -> str:
    """Return "higher", "lower" or "no clear difference" for two figures that carry no spread of their
    own (one load run each, or speed-ups taken from two different tables): ``value`` is higher only
    when it exceeds ``other`` by more than ``band`` (10%) as a ratio, lower when below ``other / (1 +
    band)``. State the band beside the verdict; timings with a spread use ``Comparison.verdict``.
    With ``name``, the verdict is also recorded under that name (``record_verdict``), as measured on
    ``device`` (default: the CPU)."""
    if not (value > 0 and other > 0) or band < 0:
        raise ValueError(f"band_verdict needs two positive figures and band >= 0, got {value!r}, {other!r}, {band!r}")
    ratio = value / other
    word = "higher" if ratio > 1 + band else "lower" if ratio < 1 / (1 + band) else "no clear difference"
    if name is not None:
        record_verdict(name, word, device=device, value=value, other=other, band=band)
    return word


def ratio_text(ratio: float, band: float = 0.1) -> str:
    """Return ``ratio`` as "1.23x" for printing beside a ``band_verdict``, with a third decimal where two
    would print an edge of the band ("0.87x, lower" beside "a ratio between 0.87x and 1.15x is called no
    clear difference" reads as a contradiction; "0.867x" does not)."""
    if not ratio > 0 or band < 0:
        raise ValueError(f"ratio must be > 0 and band >= 0, got {ratio!r} and {band!r}")
    edges = {f"{1 / (1 + band):.2f}", f"{1 + band:.2f}"}
    return f"{ratio:.3f}x" if f"{ratio:.2f}" in edges else f"{ratio:.2f}x"


def band_text(band: float = 0.1, *, inside: bool = False) -> str:
    """Say the rule of a ``band_verdict`` as the ratio interval it uses: "a ratio between 0.87x and
    1.15x is called no clear difference" for ``band=0.15``; with ``inside``, the words for a ratio
    that fell in it ("the ratio was between 0.87x and 1.15x"). The interval is not symmetric in
    percent (a 15% rise, a 13% drop), so print this rather than "differences under 15%"."""
    if band < 0:
        raise ValueError(f"band must be >= 0, got {band!r}")
    ratios = f"between {1 / (1 + band):.2f}x and {1 + band:.2f}x"
    return f"the ratio was {ratios}" if inside else f"a ratio {ratios} is called no clear difference"


def compare(variants: Mapping[str, Callable[..., Any]], *args: Any, baseline: str | None = None,
            rounds: int = 3, warmup: int = 3, min_run_time: float | None = None,
            num_threads: int | None = None, device: torch.device | str | None = None,
            **kwargs: Any) -> Comparison:
    """Return a ``Comparison`` of every variant called with the same arguments.

    All variants are warmed up first; then ``rounds`` rounds time each variant in
    turn (interleaved, so a slow spell on a busy machine hits all of them), and each
    variant's median and IQR are taken over all its timed blocks. ``baseline``
    (default: the first variant) is the denominator of the speed-ups. ``device`` says where the
    variants run, for the verdicts the comparison records; without it, the device of the first
    tensor among the arguments, else the CPU (pass it when the variants take no tensors).
    """
    if not variants:
        raise ValueError("compare() needs at least one variant")
    for name, fn in variants.items():
        if not callable(fn):
            raise TypeError(f"variant {name!r} is not callable ({type(fn).__name__})")
    baseline = baseline or next(iter(variants))
    if baseline not in variants:
        raise KeyError(f"baseline {baseline!r} is not one of {list(variants)}")
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    run_time = (min_run_time if min_run_time is not None else config.pick(0.3, 1.5)) / rounds
    timers = {}
    for name, fn in variants.items():
        _warm(fn, args, kwargs, warmup)
        timers[name] = _timer(fn, args, kwargs, name, num_threads)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, timer in timers.items():
            samples[name] += list(timer.blocked_autorange(min_run_time=run_time).times)
    table = Comparison.from_samples(samples, baseline,
                                    device=device if device is not None else _device_of(args, kwargs))
    if table.spread_note():  # a large spread: note whether other programs were busy (0.2 s to sample)
        table = replace(table, other_load=threads.other_load())
    return table


def _device_of(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.device:
    """Return the device of the first tensor among ``args`` and ``kwargs``' values, else the CPU."""
    return next((a.device for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), torch.device("cpu"))


def bar_chart(comparison: Comparison, title: str | None = None, ax: Any = None) -> Any:
    """Return a matplotlib Figure: median time per variant with IQR error bars and speed-ups."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(6, 0.6 + 0.5 * len(comparison.rows)))
    else:
        fig = ax.figure
    labels = [r.label for r in comparison.rows]
    medians = [r.median_s * 1e3 for r in comparison.rows]
    iqrs = [r.iqr_s * 1e3 for r in comparison.rows]
    ax.barh(labels, medians, xerr=iqrs, color="tab:blue", alpha=0.8)
    for i, r in enumerate(comparison.rows):
        ax.annotate(f" {r.speedup:.2f}x", (medians[i], i), va="center")
    ax.invert_yaxis()
    ax.set_xlabel("median time per call (ms)")
    ax.set_title(title or f"speed-up vs {comparison.baseline}")
    ax.set_xlim(0, max(medians) * 1.25 if medians else 1)
    fig.tight_layout()
    return fig
