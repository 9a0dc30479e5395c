"""course_utils.serving.extras.tokentimes: token timestamps, TTFT, inter-token gaps, percentiles by nearest rank."""

from __future__ import annotations

import math

import pytest

from course_utils.serving.extras.tokentimes import TokenClock


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_ttft_and_gaps_from_a_scripted_clock():
    fake = FakeClock()
    tc = TokenClock(fake)
    tc.arrive("a")
    fake.now = 0.5
    tc.arrive("b")
    fake.now = 1.0
    tc.token("a")
    fake.now = 1.25
    tc.token("a")
    tc.token("b", count=2)   # two tokens at once: one gap of zero
    fake.now = 2.0
    tc.token("a")
    assert tc.ttft_s() == [1.0, 0.75]
    assert sorted(tc.gaps_s()) == [0.0, 0.25, 0.75]
    assert tc.gaps_s(["b"]) == [0.0]
    s = tc.summary_ms()
    assert s["ttft"]["p50"] == pytest.approx(750.0) and s["ttft"]["p99"] == pytest.approx(1000.0)
    assert s["itl"]["p99"] == pytest.approx(750.0)


def test_requests_without_tokens_are_left_out_and_empty_is_nan():
    tc = TokenClock(FakeClock())
    tc.arrive(1)
    assert tc.ttft_s() == [] and tc.gaps_s() == []
    s = tc.summary_ms()
    assert math.isnan(s["ttft"]["p50"]) and math.isnan(s["itl"]["p99"])


def test_explicit_arrival_time_and_bad_input_is_a_clear_error():
    fake = FakeClock()
    tc = TokenClock(fake)
    tc.arrive("x", at=-2.0)
    tc.token("x")
    assert tc.ttft_s() == [2.0]
    with pytest.raises(ValueError, match="already arrived"):
        tc.arrive("x")
    with pytest.raises(KeyError, match="never arrived"):
        tc.token("y")
    with pytest.raises(ValueError, match="positive int"):
        tc.token("x", count=0)
    assert len(tc.tokens["x"]) == 1   # nothing lost by the refused calls
