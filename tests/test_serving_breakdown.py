"""serving.extras.breakdown: threads' CPU seconds, core pinning, and the engine's counters between snapshots."""

from __future__ import annotations

import os
import sys
import threading
import time

import httpx
import pytest

from course_utils.models.checkpoint import load_tiny_gpt
from course_utils.serving import ServeSettings
from course_utils.serving.extras.breakdown import (WALL_PARTS, Breakdown, Snapshot, _metric_values, core_busy, core_times,
                                           measure, own_core_plan, pin_process, pinned, thread_cpu_seconds)
from course_utils.serving.server.metrics import ServingMetrics
from course_utils.serving.server.runner import ThreadedServer

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@linux
def test_a_busy_thread_gains_cpu_seconds_and_a_missing_process_has_none():
    before = thread_cpu_seconds(os.getpid())
    assert threading.get_native_id() in before
    done = threading.Event()
    tid: list[int] = []

    def spin() -> None:
        tid.append(threading.get_native_id())
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass
        done.wait(10)  # stay alive until measured

    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.05)
    deadline = time.time() + 10
    while thread_cpu_seconds(os.getpid()).get(tid[0], 0.0) < 0.1 and time.time() < deadline:
        time.sleep(0.05)
    assert thread_cpu_seconds(os.getpid())[tid[0]] >= 0.1
    done.set()
    t.join()
    assert thread_cpu_seconds(2**22 + 12345) == {}


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_pinning_puts_every_thread_on_the_cores_asked_and_refuses_what_cannot_be():
    old = os.sched_getaffinity(0)
    first = min(old)
    try:
        assert pin_process(os.getpid(), {first})
        assert os.sched_getaffinity(0) == {first}
        assert not pin_process(os.getpid(), set())
        assert not pin_process(os.getpid(), {10_000})  # no such core
        assert not pin_process(2**22 + 12345, {first})  # no such process
    finally:
        pin_process(os.getpid(), old)
    assert own_core_plan(1) is None
    if len(old) >= 2:
        server, client = own_core_plan()
        assert len(server) == 1 and server.isdisjoint(client) and server | client == old


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_pinned_holds_for_the_block_and_gives_this_process_its_cores_back():
    old = os.sched_getaffinity(0)
    first = min(old)
    with pinned({os.getpid(): {first}}) as ok:
        assert ok and os.sched_getaffinity(0) == {first}
    assert os.sched_getaffinity(0) == old
    with pinned({}) as ok:
        assert not ok
    with pinned({os.getpid(): {first}, 2**22 + 12345: {first}}) as ok:  # one pin fails: not all took
        assert not ok
    assert os.sched_getaffinity(0) == old


def test_breakdown_reads_the_engine_counters_between_two_snapshots():
    metrics = ServingMetrics()
    first = Snapshot(0.0, _metric_values(metrics.render().decode()), {1: 1.0, 2: 0.5})
    for rows in (4, 6):
        metrics.batch_size.observe(rows)
    metrics.prefill_size.observe(3)
    metrics.tokens.inc(13)
    metrics.engine_seconds.labels("forward").inc(0.5)
    metrics.engine_seconds.labels("prefix").inc(0.25)
    later = Snapshot(2.0, _metric_values(metrics.render().decode()), {1: 2.0, 2: 0.5, 3: 0.4})
    b = later.since(first)
    assert (b.wall_s, b.steps, b.mean_rows, b.prefills, b.mean_prefill_size, b.tokens) == (2.0, 2, 5.0, 1, 3.0, 13)
    assert b.phases_s["forward"] == 0.5 and b.phases_s["prefix"] == 0.25 and b.phases_s["idle"] == 0.0
    assert b.thread_cpu_s == [1.0, 0.4]  # busiest first; a thread that did nothing is left out
    text = "\n".join(b.lines())
    assert "2 forward passes with 5.0 rows" in text and "forward 25%" in text and "50%, 20%" in text


def test_wall_seconds_split_the_run_from_the_floor_to_the_idle_time():
    b = Breakdown(wall_s=10.0, phases_s={"prefix": 2.0, "forward": 6.0, "other": 0.5, "idle": 1.0}, steps=100,
                  mean_rows=30.0, prefills=10, mean_prefill_size=2.0, tokens=3000, thread_cpu_s=[6.8, 2.0])
    assert b.worker_on_cpu() == pytest.approx(0.8)  # 6.8 CPU seconds over 8.5 working seconds
    parts = b.wall_seconds(bare_tokens_per_s=1000.0)  # the floor: 3000 tokens / 1000 per s = 3 s
    assert list(parts) == list(WALL_PARTS)
    assert list(parts.values()) == pytest.approx([3.0, 6.0 * 0.8 - 3.0, 1.6, 0.4, 8.5 * 0.2, 1.0])
    assert sum(parts.values()) == pytest.approx(9.5)  # everything but the 0.5 s the worker was in no phase
    assert b.largest_loss(1000.0) == WALL_PARTS[1]
    fast_bare = b.wall_seconds(bare_tokens_per_s=100.0)  # a floor above what decoding took is capped at it
    assert fast_bare[WALL_PARTS[0]] == pytest.approx(4.8) and fast_bare[WALL_PARTS[1]] == 0.0
    unknown = Breakdown(**{**b.__dict__, "thread_cpu_s": []})  # no CPU seconds: the worker counts as running
    assert unknown.worker_on_cpu() is None and unknown.wall_seconds(1000.0)[WALL_PARTS[4]] == 0.0
    with pytest.raises(ValueError, match="positive"):
        b.wall_seconds(0.0)


def test_core_busy_is_each_cores_busy_share_between_two_readings_whoever_used_it():
    from collections import namedtuple

    Times = namedtuple("Times", "user nice system idle iowait irq softirq steal guest guest_nice")
    before = [Times(10, 0, 5, 100, 1, 0, 0, 0, 0, 0), Times(20, 0, 0, 50, 0, 0, 0, 0, 0, 0)]
    # core 0: 3 s user + 1 s system busy, 3 s idle + 1 s I/O wait not; core 1: 2 s user, of it 2 s
    # guest (already in user), and 6 s idle; core 2 only in the later reading
    after = [Times(13, 0, 6, 103, 2, 0, 0, 0, 0, 0), Times(22, 0, 0, 56, 0, 0, 0, 0, 2, 0),
             Times(1, 0, 0, 1, 0, 0, 0, 0, 0, 0)]
    busy = core_busy(before, after)
    assert busy == pytest.approx({0: 0.5, 1: 0.25})
    assert core_busy(before, before) == {}  # no time passed: nothing to say
    b = Breakdown(wall_s=1.0, phases_s={}, steps=0, mean_rows=0.0, prefills=0, mean_prefill_size=0.0, tokens=0,
                  core_busy=busy)
    assert b.busy_cores({0}) == pytest.approx(0.5) and b.busy_cores([0, 1]) == pytest.approx(0.75)
    assert b.busy_cores({2}) is None and b.busy_cores([]) is None
    assert Breakdown(**{**b.__dict__, "core_busy": {}}).busy_cores({0}) is None
    now = core_times()  # this machine: one reading per core, each fraction between 0 and 1
    time.sleep(0.05)
    assert all(0.0 <= f <= 1.0 for f in core_busy(now, core_times()).values())


def test_breakdown_of_a_real_server_counts_the_tokens_it_streamed():
    model, tok = load_tiny_gpt()
    with ThreadedServer(ServeSettings(embed=False, threads=1), model=model, tokenizer=tok) as srv:
        def two_requests() -> list[int]:
            with httpx.Client(timeout=30) as client:
                return [client.post(srv.url + "/generate", json={"prompt": "The ", "max_new_tokens": 5}).status_code
                        for _ in range(2)]

        statuses, b = measure(srv.url, os.getpid(), two_requests)
    assert statuses == [200, 200]
    assert b.tokens == 10 and b.prefills == 2 and b.steps == 10  # each request: 1 pass with its prompt, 4 more
    assert b.phases_s["forward"] > 0 and b.wall_s > 0
    if core_times():  # psutil reads each core's times here
        assert b.core_busy and all(0.0 <= f <= 1.0 for f in b.core_busy.values())
