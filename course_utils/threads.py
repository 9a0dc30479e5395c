"""How many threads does torch use here, and will they hold up on a busy laptop?

The course's thread policy, in three rules:

1. **Waiting threads sleep.** torch's CPU kernels (and the C++ Inductor generates) split work
   across OpenMP threads. By default a thread that finishes early *spins* while it waits for
   the others. On a quiet machine that saves microseconds; on a 2-core laptop where another
   program keeps one core busy, the spinning thread and the busy program fight over a core
   and small operations can get up to a hundred times slower, unpredictably (``python
   tools/busy_threads.py`` on a 2-core machine with one core busy: an epoch of small batches
   took 0.016 s to 1.5 s with two spinning threads, 0.010 s to 0.036 s with two sleeping
   ones, in repeated runs). With ``OMP_WAIT_POLICY=PASSIVE`` waiting threads sleep instead,
   which cost nothing measurable on a quiet machine there and keeps a busy one usable. OpenMP reads the variable once, when torch
   is imported, so it must be in the kernel's environment: the course kernel (``make kernel``,
   ``make lab``), the notebook runner and the test suite set it (``KERNEL_ENV``).
2. **One thread per core, as torch chooses**, unless ``COURSE_THREADS=N`` says otherwise
   (``session.start`` applies it). The course does not guess from the load average: on a
   shared machine it lags by a minute and mostly measures the previous notebook.
3. **Say when the machine is busy.** ``state()`` samples how much CPU other programs use for a
   fifth of a second; ``session.start`` prints it, so a learner knows the timings that follow
   are rough. ``bench`` times with ``torch.get_num_threads()`` threads and flags tables whose
   spread is large.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: Variables every kernel the course starts gets (see rule 1 above).
KERNEL_ENV: dict[str, str] = {"OMP_WAIT_POLICY": "PASSIVE"}
#: Other programs using at least this many cores' worth of CPU make the machine "busy".
BUSY_CORES = 0.5


@dataclass(frozen=True)
class ThreadState:
    """What the thread policy found and did."""

    threads: int
    cores: int
    wait_policy: str
    busy_cores: float | None
    forced: bool

    @property
    def passive(self) -> bool:
        """True when waiting OpenMP threads sleep instead of spinning."""
        return self.wait_policy.upper() == "PASSIVE"

    @property
    def busy(self) -> bool:
        """True when other programs used at least ``BUSY_CORES`` cores while sampled."""
        return self.busy_cores is not None and self.busy_cores >= BUSY_CORES

    def line(self) -> str:
        """Return the policy's part of the setup cell's summary line ("" when nothing to say
        beyond the thread count, which ``session.summary`` already prints)."""
        parts = []
        if self.forced:
            parts.append(f"{self.threads} threads set by COURSE_THREADS")
        if self.passive:
            parts.append("idle threads sleep")
        elif self.threads > 1:
            parts.append("idle threads SPIN (set OMP_WAIT_POLICY=PASSIVE before starting Jupyter; "
                         "`make lab` does): small ops slow down badly when the machine is busy")
        if self.busy:
            parts.append(f"BUSY: other programs use about {self.busy_cores:.1f} of "
                         f"{self.cores} CPUs, timings will be noisy")
        return " | ".join(parts)


def usable_cores() -> int:
    """Return the number of cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def requested_threads() -> int | None:
    """Return ``COURSE_THREADS`` as a positive int, None when unset; ValueError when invalid."""
    raw = os.environ.get("COURSE_THREADS", "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"COURSE_THREADS must be a whole number of threads, got {raw!r}") from None
    if n < 1:
        raise ValueError(f"COURSE_THREADS must be at least 1, got {n}")
    return n


def _own_cpu_seconds(me) -> float:
    """CPU seconds (user + system) used so far by process ``me`` and its live child processes
    (compile workers, servers a notebook started); a child that exits meanwhile is skipped."""
    import psutil

    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except (psutil.Error, OSError):
            pass
    return total


def other_load(seconds: float = 0.2) -> float | None:
    """Return how many cores' worth of CPU *other* processes used over ``seconds``.

    Whole-machine CPU use minus this process's own and its child processes' (so a notebook's own
    compile workers or servers do not count as other programs); None when psutil cannot tell.
    """
    try:
        import psutil
    except ImportError:
        return None
    me = psutil.Process()
    try:
        mine_before = _own_cpu_seconds(me)
        psutil.cpu_percent(interval=None)
        total_pct = psutil.cpu_percent(interval=seconds)
        mine = _own_cpu_seconds(me) - mine_before
    except (psutil.Error, OSError):
        return None
    total_cores = total_pct / 100 * (psutil.cpu_count() or 1)
    return max(0.0, total_cores - mine / seconds)


def apply(sample_seconds: float = 0.2) -> ThreadState:
    """Apply the thread policy (``COURSE_THREADS``) and return what it found."""
    import torch  # not at module level: the root conftest imports KERNEL_ENV before torch loads

    forced = requested_threads()
    if forced is not None:
        torch.set_num_threads(forced)
    busy = other_load(sample_seconds) if sample_seconds > 0 else None
    return ThreadState(threads=torch.get_num_threads(), cores=usable_cores(),
                       wait_policy=os.environ.get("OMP_WAIT_POLICY", "default"),
                       busy_cores=busy, forced=forced is not None)
