"""Where a server's time goes under load: its threads' CPU seconds, its engine's phases, core pinning.

``Snapshot.take(url, pid)`` reads a running course server's ``/metrics`` (the worker's seconds per
phase, steps, rows per step, prefills), its threads' CPU seconds and each core's CPU times (psutil);
``later.since(earlier)`` is a ``Breakdown`` of what happened in between (``busy_cores`` says how
busy given cores were, whoever used them), whose ``wall_seconds(bare_tokens_per_s)`` splits the
wall time into the bare model's floor and each loss beyond it; ``measure(url, pid, work)`` takes the
two snapshots around one load run. ``pin_process`` and ``pinned`` put processes on cores of their
own (Linux), ``engine_child`` finds a server's engine process; where the OS cannot, they say so
(``False``, ``None``, empty dicts) instead of failing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")

#: The engine's phases (``serve_engine_seconds_total{phase=...}``).
PHASES = ("forward", "prefix", "idle", "other")
#: Where a run's wall time went (``Breakdown.wall_seconds``), the floor first.
WALL_PARTS = (
    "forward passes at the bare model's speed (the floor)",
    "forward passes beyond that (fewer rows per step, prompt tokens in the steps, a busy CPU)",
    "prefix cache copies (filing and loading prompt blocks)",
    "worker bookkeeping (tokens, rows, metrics)",
    "worker waiting for the GIL or a core in the middle of its work",
    "worker idle (no request waiting)",
)


def process_tree(pid: int) -> list[int]:
    """Return ``pid`` and its descendants (``[]`` when the process is gone)."""
    try:
        return [pid] + [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def thread_cpu_seconds(pid: int, children: bool = True) -> dict[int, float]:
    """Return {thread id: CPU seconds (user + system)} of process ``pid`` and, with ``children``,
    of every process it started (a server's engine process); {} when the process is gone."""
    out: dict[int, float] = {}
    for proc in process_tree(pid) if children else [pid]:
        try:
            out.update({t.id: t.user_time + t.system_time for t in psutil.Process(proc).threads()})
        except psutil.Error:
            continue  # it ended meanwhile
    return out


def pin_process(pid: int, cores: set[int], children: bool = True) -> bool:
    """Put every thread of process ``pid`` (and, with ``children``, of the processes it started)
    on ``cores``; return False where the OS cannot (no ``sched_setaffinity``: macOS, Windows; or
    a core that does not exist)."""
    if not hasattr(os, "sched_setaffinity") or not cores:
        return False
    try:
        tids = [t.id for proc in (process_tree(pid) if children else [pid]) for t in psutil.Process(proc).threads()]
        for tid in tids:
            os.sched_setaffinity(tid, cores)
    except (OSError, ValueError, psutil.Error):
        return False
    return bool(tids)


def engine_child(server_pid: int) -> int | None:
    """Return the pid of a course server's engine process (``engine_process=True``): its descendant
    that ``multiprocessing`` spawned and that is not the resource tracker; None when it has none
    (an engine thread)."""
    for pid in process_tree(server_pid)[1:]:
        try:
            cmd = " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            continue
        if "spawn_main" in cmd and "resource_tracker" not in cmd:
            return pid
    return None


@contextmanager
def pinned(plan: Mapping[int, set[int]]) -> Iterator[bool]:
    """Pin processes for the length of a ``with`` block; yield whether every pin took.

    ``plan`` maps a pid to its cores and is applied in order, each process with its children
    except this one (a notebook's kernel keeps the servers it started where they are put). This
    process's own affinity is given back at the end; the others are processes the block owns.
    An empty plan pins nothing and yields False.
    """
    me = os.getpid()
    before = os.sched_getaffinity(0) if me in plan and hasattr(os, "sched_getaffinity") else None
    ok = bool(plan) and all(pin_process(pid, cores, children=pid != me) for pid, cores in plan.items())
    try:
        yield ok
    finally:
        if before is not None:
            pin_process(me, before, children=False)


def own_core_plan(n_cores: int | None = None) -> tuple[set[int], set[int]] | None:
    """Return (server cores, client cores): the first core usable by this process for the server,
    the rest for the load generator; None with fewer than two cores or no affinity support."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    usable = sorted(os.sched_getaffinity(0))
    if n_cores is not None:
        usable = usable[:n_cores]
    if len(usable) < 2:
        return None
    return {usable[0]}, set(usable[1:])


def core_times() -> list[Any]:
    """Return ``psutil.cpu_times(percpu=True)``: one entry per online core, in order, so entry ``i`` is
    core ``i`` (the numbering of ``os.sched_getaffinity``) unless a core below it is offline; [] when
    psutil cannot tell."""
    try:
        return list(psutil.cpu_times(percpu=True))
    except (psutil.Error, OSError, NotImplementedError):
        return []


def _busy_and_total(times: Any) -> tuple[float, float]:
    """Return (busy, total) seconds of one core's CPU times, as ``psutil.cpu_percent`` counts them:
    idle and I/O wait are not busy; guest time is already part of user time on Linux."""
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total - times.idle - getattr(times, "iowait", 0.0), total


def core_busy(before: Sequence[Any], after: Sequence[Any]) -> dict[int, float]:
    """Return {core: fraction of the time it was busy, 0 to 1} between two ``core_times()`` readings,
    whoever used the core (any process); a core missing from either reading, or without elapsed
    time, is left out."""
    out: dict[int, float] = {}
    for core, (old, new) in enumerate(zip(before, after)):
        (busy0, total0), (busy1, total1) = _busy_and_total(old), _busy_and_total(new)
        if total1 - total0 > 0:
            out[core] = min(1.0, max(0.0, (busy1 - busy0) / (total1 - total0)))
    return out


def _metric_values(text: str) -> dict[str, float]:
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "serve_engine_seconds_total":
                values[f"phase:{sample.labels.get('phase')}"] = sample.value
            elif sample.name in ("serve_batch_size_count", "serve_batch_size_sum",
                                 "serve_prefill_batch_size_count", "serve_prefill_batch_size_sum",
                                 "serve_tokens_generated_total"):
                values[sample.name] = sample.value
    return values


@dataclass
class Breakdown:
    """What a server did between two snapshots."""

    wall_s: float
    phases_s: dict[str, float]
    steps: int
    mean_rows: float
    prefills: int
    mean_prefill_size: float
    tokens: int
    #: CPU seconds of each server thread that used any, busiest first
    thread_cpu_s: list[float] = field(default_factory=list)
    #: {core: fraction of the run it was busy, by any process}; {} where the OS does not say
    core_busy: dict[int, float] = field(default_factory=dict)

    def share(self, seconds: float) -> float:
        """Return ``seconds`` as a fraction of the wall time."""
        return seconds / self.wall_s if self.wall_s > 0 else 0.0

    def worker_on_cpu(self) -> float | None:
        """Return the fraction of its working (non-idle) time the model worker actually ran, from
        the busiest thread's CPU seconds; None where the OS does not report them."""
        working = sum(self.phases_s.get(p, 0.0) for p in ("forward", "prefix", "other"))
        if not self.thread_cpu_s or working <= 0:
            return None
        return min(1.0, self.thread_cpu_s[0] / working)

    def wall_seconds(self, bare_tokens_per_s: float) -> dict[str, float]:
        """Split the run's time into where it went, in seconds, given the bare model's tokens/s.

        The floor is the bare model's time for the same tokens. The worker's phases are clock time;
        the part of them it did not run (``worker_on_cpu``; assumed spread evenly over the phases)
        is the wait for the GIL or a core. Where CPU seconds are unknown the worker counts as
        always running. The keys are ``WALL_PARTS``.
        """
        if bare_tokens_per_s <= 0:
            raise ValueError(f"bare_tokens_per_s must be positive, got {bare_tokens_per_s!r}")
        ph = {p: self.phases_s.get(p, 0.0) for p in PHASES}
        on_cpu = self.worker_on_cpu()
        on_cpu = 1.0 if on_cpu is None else on_cpu
        floor = self.tokens / bare_tokens_per_s
        forward = ph["forward"] * on_cpu
        values = (min(floor, forward), max(0.0, forward - floor), ph["prefix"] * on_cpu, ph["other"] * on_cpu,
                  (ph["forward"] + ph["prefix"] + ph["other"]) * (1 - on_cpu), ph["idle"])
        return dict(zip(WALL_PARTS, values))

    def largest_loss(self, bare_tokens_per_s: float) -> str:
        """Return the name of the largest part of ``wall_seconds`` beyond the floor."""
        loss = {k: v for k, v in self.wall_seconds(bare_tokens_per_s).items() if k != WALL_PARTS[0]}
        return max(loss, key=loss.__getitem__)

    def busy_cores(self, cores: Iterable[int]) -> float | None:
        """Return how many cores' worth of CPU every process together (this server, its clients,
        other programs) used on ``cores`` over the run: 0.75 for one core busy three quarters of
        the time; None when a core's busy time is unknown. Subtract what the processes you know
        used on those cores to get other programs' share."""
        cores = list(cores)
        if not cores or any(c not in self.core_busy for c in cores):
            return None
        return sum(self.core_busy[c] for c in cores)

    def lines(self) -> list[str]:
        """Return a readable report, one finding per line."""
        out = [f"{self.tokens:,} tokens in {self.wall_s:.2f} s: {self.steps:,} forward passes with "
               f"{self.mean_rows:.1f} rows on average; {self.prefills:,} of them also computed prompts "
               f"({self.mean_prefill_size:.1f} prompt chunks on average)"]
        worker = " + ".join(f"{p} {self.share(self.phases_s.get(p, 0.0)):.0%}" for p in PHASES)
        out.append(f"model worker thread, share of the wall time by phase: {worker}")
        if self.thread_cpu_s:
            busy = ", ".join(f"{self.share(s):.0%}" for s in self.thread_cpu_s[:3])
            out.append(f"server threads on a CPU, share of the wall time (busiest first): {busy}")
        return out


@dataclass
class Snapshot:
    """The counters of a running server at one moment."""

    at: float
    values: dict[str, float]
    threads: dict[int, float]
    #: ``core_times()`` at that moment
    cores: list[Any] = field(default_factory=list)

    @classmethod
    def take(cls, url: str, pid: int | None = None, timeout: float = 10.0) -> Snapshot:
        """Read ``url``'s ``/metrics``, each core's CPU times and, when ``pid`` is given, its threads'
        CPU seconds."""
        text = httpx.get(f"{url}/metrics", timeout=timeout, trust_env=False).text
        return cls(time.perf_counter(), _metric_values(text), thread_cpu_seconds(pid) if pid else {}, core_times())

    def since(self, earlier: Snapshot) -> Breakdown:
        """Return what happened between ``earlier`` and this snapshot."""
        def delta(key: str) -> float:
            return self.values.get(key, 0.0) - earlier.values.get(key, 0.0)

        steps, prefills = delta("serve_batch_size_count"), delta("serve_prefill_batch_size_count")
        cpu = sorted((s - earlier.threads.get(tid, 0.0) for tid, s in self.threads.items()), reverse=True)
        return Breakdown(wall_s=self.at - earlier.at,
                         phases_s={p: delta(f"phase:{p}") for p in PHASES},
                         steps=int(steps), mean_rows=delta("serve_batch_size_sum") / steps if steps else 0.0,
                         prefills=int(prefills),
                         mean_prefill_size=delta("serve_prefill_batch_size_sum") / prefills if prefills else 0.0,
                         tokens=int(delta("serve_tokens_generated_total")),
                         thread_cpu_s=[c for c in cpu if c > 0.005],
                         core_busy=core_busy(earlier.cores, self.cores))


def measure(url: str, pid: int | None, work: Callable[[], T]) -> tuple[T, Breakdown]:
    """Run ``work()`` (a load against the server at ``url``, process ``pid``); return its result and
    the server's ``Breakdown`` over exactly that run."""
    before = Snapshot.take(url, pid)
    result = work()
    return result, Snapshot.take(url, pid).since(before)
