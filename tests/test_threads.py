"""The course's thread policy (course_utils.threads) and where it is applied."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from course_utils import session, threads
from course_utils.kit import runner


def test_requested_threads_parses_course_threads(monkeypatch):
    monkeypatch.delenv("COURSE_THREADS", raising=False)
    assert threads.requested_threads() is None
    monkeypatch.setenv("COURSE_THREADS", " 3 ")
    assert threads.requested_threads() == 3
    for bad, rule in (("two", "whole number"), ("0", "at least 1"), ("-2", "at least 1")):
        monkeypatch.setenv("COURSE_THREADS", bad)
        with pytest.raises(ValueError, match=rule):
            threads.requested_threads()


def test_apply_sets_torch_threads_from_course_threads(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setenv("COURSE_THREADS", "1")
    try:
        state = threads.apply(sample_seconds=0)
        assert torch.get_num_threads() == 1
        assert state.threads == 1 and state.forced and state.busy_cores is None
        assert "1 threads set by COURSE_THREADS" in state.line()
    finally:
        torch.set_num_threads(before)


def _state(**kw):
    base = dict(threads=2, cores=2, wait_policy="PASSIVE", busy_cores=0.0, forced=False)
    return threads.ThreadState(**{**base, **kw})


def test_line_says_what_a_learner_needs():
    assert _state().line() == "idle threads sleep"
    spin = _state(wait_policy="default").line()
    assert "SPIN" in spin and "OMP_WAIT_POLICY=PASSIVE" in spin and "make lab" in spin
    assert _state(wait_policy="default", threads=1).line() == ""  # one thread: nothing waits
    busy = _state(busy_cores=1.2).line()
    assert "BUSY" in busy and "1.2 of 2" in busy and "noisy" in busy
    assert not _state(busy_cores=threads.BUSY_CORES - 0.01).busy
    assert not _state(busy_cores=None).busy


def _spin(detached: bool) -> int:
    """Start a process that spins on one core and return its pid: this process's child, or (detached)
    a grandchild whose parent has exited, so it belongs to no process of ours."""
    if not detached:
        return subprocess.Popen([sys.executable, "-c", "while True: pass"]).pid
    out = subprocess.run(["sh", "-c", f"'{sys.executable}' -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # not our child: init reaps it


def test_other_load_sees_a_busy_process():
    """A process of someone else's spinning on one core is other programs' load (this process is idle)."""
    quiet = threads.other_load(0.3)
    assert quiet is None or quiet >= 0.0
    pid = _spin(detached=True)
    try:
        time.sleep(0.5)
        busy = threads.other_load(0.5)
    finally:
        _stop(pid)
    if busy is None:
        pytest.skip("psutil cannot read CPU use here")
    assert busy >= threads.BUSY_CORES, busy


def test_other_load_counts_this_process_s_children_as_its_own():
    """A notebook's own child processes (compile workers, a server it started) are not other programs:
    their CPU time is counted with this process's, which other_load subtracts."""
    psutil = pytest.importorskip("psutil")
    me = psutil.Process()
    pid = _spin(detached=False)
    try:
        time.sleep(0.3)
        before = threads._own_cpu_seconds(me)
        time.sleep(1.0)                       # this process sleeps; only the child works
        used = threads._own_cpu_seconds(me) - before
    finally:
        _stop(pid)
    assert used >= 0.1, used                  # a spinning child gets well over a tenth of a core even when busy


def test_tests_and_their_kernels_get_the_policy():
    """The root conftest sets it for pytest and the nbval kernels it starts; the runner for its kernels."""
    for key, value in threads.KERNEL_ENV.items():
        assert os.environ.get(key) == value
    with runner._environment(quick=True, blocked=False, results=None):
        assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"


def test_session_start_reports_the_policy():
    line = session.start()
    assert "\n" not in line and "idle threads sleep" in line
