"""The course's one SSE module and its one percentile definition, on their own (no server)."""

import json
import math
import random
import statistics

import pytest

from course_utils.serving.server import loadgen
from course_utils.serving.server.percentile import nearest_rank, percentiles
from course_utils.serving.server.sse import END, ERROR, TOKEN, MalformedStream, SSEParser, format_event, token_event

#: Token texts that look like the format itself, or that JSON escapes.
TRICKY = ["He", " ", "\n", "\n\n", "data: x", "event: end", '"', "\\", "caf\u00e9", "\u2028", "\U0001f600", ":", ""]


def a_stream(tokens, end=None, error=None) -> str:
    text = "".join(token_event(t, i) for i, t in enumerate(tokens))
    text += format_event(error, ERROR) if error is not None else ""
    return text + (format_event(end, END) if end is not None else "")


def parse_lines(text: str) -> list:
    parser, events = SSEParser(), []
    for line in text.split("\n"):
        events += parser.feed(line)
    return events + parser.finish()


def parse_bytes(data: bytes, cuts: list[int]) -> list:
    parser, events, start = SSEParser(), [], 0
    for cut in [*cuts, len(data)]:
        events += parser.feed_bytes(data[start:cut])
        start = cut
    return events + parser.finish()


@pytest.mark.parametrize("token", TRICKY)
def test_token_event_is_exactly_the_general_formatter(token):
    assert token_event(token, 7) == format_event({"token": token, "index": 7})
    assert json.loads(token_event(token, 7)[len("data: "):]) == {"token": token, "index": 7}


def test_format_event_writes_the_event_line_only_when_given():
    assert format_event({"a": 1}) == 'data: {"a": 1}\n\n'
    assert format_event({"a": 1}, "end") == 'event: end\ndata: {"a": 1}\n\n'
    for bad in ("", "two\nlines", "cr\r"):
        with pytest.raises(ValueError, match="single line"):
            format_event({}, bad)


def test_what_the_writer_writes_the_parser_reads_back_however_the_bytes_are_cut():
    end = {"reason": "length", "tokens": len(TRICKY)}
    text = a_stream(TRICKY, end)
    expected = [(TOKEN, t) for t in TRICKY] + [(END, end)]
    assert parse_lines(text) == expected
    data = text.encode("utf-8")
    rng = random.Random(0)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(data)), rng.randint(1, 12)))  # inside UTF-8 characters too
        assert parse_bytes(data, cuts) == expected
    assert parse_bytes(data, list(range(1, len(data)))) == expected  # one byte at a time


def test_an_error_event_and_comments_and_crlf_lines():
    failure = {"detail": "server is stopping", "status": 503}
    assert parse_lines(a_stream(["a"], error=failure)) == [(TOKEN, "a"), (ERROR, failure)]
    text = ': a comment\r\ndata: {"token": "a", "index": 0}\r\n\r\nevent: end\r\ndata: {"tokens": 1}\r\n\r\n'
    assert parse_bytes(text.encode(), [5]) == [(TOKEN, "a"), (END, {"tokens": 1})]
    assert parse_lines('event: message\ndata: {"token": "a", "index": 0}\n') == [(TOKEN, "a")]  # the SSE default


def test_a_data_field_over_several_lines_is_joined():
    assert parse_lines('event: end\ndata: {"tokens":\ndata:  3}\n\n') == [(END, {"tokens": 3})]


def test_an_event_line_without_data_does_not_leak_into_the_next_event():
    text = 'event: end\n\ndata: {"token": "a", "index": 0}\n\n'
    assert parse_lines(text) == [(TOKEN, "a")]
    assert parse_bytes(text.encode(), [3]) == [(TOKEN, "a")]


@pytest.mark.parametrize("text, match", [
    ('data: {"token": "b", "index": 1}\n\n', "out of order"),
    ('data: {"token": 5, "index": 0}\n\n', "malformed"),
    ('data: {"token": "a", "index": false}\n\n', "malformed"),
    ('data: [1, 2]\n\n', "malformed"),
    ("data: not json\n\n", "not JSON"),
    ('event: surprise\ndata: {}\n\n', "unknown event type"),
    ("garbage\n\n", "unexpected line"),
])
def test_broken_streams_raise_malformed_stream(text, match):
    with pytest.raises(MalformedStream, match=match):
        parse_lines(text)
    with pytest.raises(MalformedStream, match=match):
        parse_bytes(text.encode(), [])


def test_a_body_that_ends_inside_an_event_is_malformed():
    parser = SSEParser()
    assert parser.feed_bytes(b'data: {"token": "a", "index": 0}\n\ndata: {"tok') == [(TOKEN, "a")]
    with pytest.raises(MalformedStream, match="ended inside an event"):
        parser.finish()
    with pytest.raises(MalformedStream, match="not UTF-8"):
        SSEParser().feed_bytes(b"event: \xff\ndata: {}\n\n")


def test_the_load_generator_re_exports_the_shared_parser():
    assert loadgen.SSEParser is SSEParser and loadgen.MalformedStream is MalformedStream


# ---- percentiles: the nearest-rank rule -------------------------------------------------------

@pytest.mark.parametrize("values, p, expected", [
    ([float(i) for i in range(200, 0, -1)], 99, 198.0),   # rank ceil(198.0) = 198
    ([float(i) for i in range(1, 101)], 99, 99.0),
    ([5.0] * 98 + [40.0, 900.0], 99, 40.0),              # one slow outlier is not the p99
    ([3.0, 1.0, 2.0], 99, 3.0),                          # a tiny sample: the maximum
    ([1.0, 2.0, 3.0, 4.0], 50, 2.0),                     # no averaging of the two middle values
    ([12.5], 1, 12.5),
    (list(range(1, 1001)), 99.9, 999),                   # exact: floats could round the rank up to 1000
])
def test_nearest_rank_by_hand(values, p, expected):
    assert nearest_rank(values, p) == expected


def test_nearest_rank_is_always_a_measured_value_and_differs_from_interpolation():
    rng = random.Random(1)
    for n in (1, 2, 7, 99, 100, 101, 1000):
        values = [rng.expovariate(0.01) for _ in range(n)]
        for p in (50, 95, 99):
            got = nearest_rank(values, p)
            assert got in values
            k = math.ceil(p * n / 100)
            assert sum(v <= got for v in values) == max(k, 1)  # exactly `rank` values are at most it
    values = [float(i) for i in range(1, 11)]
    assert nearest_rank(values, 95) == 10.0 != statistics.quantiles(values, n=100, method="inclusive")[94]


def test_percentiles_names_each_and_gives_nan_without_values():
    assert percentiles([4.0, 1.0, 3.0, 2.0], (50, 95, 99)) == {"p50": 2.0, "p95": 4.0, "p99": 4.0}
    assert all(math.isnan(v) for v in percentiles([], (50, 99)).values())


@pytest.mark.parametrize("values, p", [([], 50), ([1.0], 0), ([1.0], 101), ([1.0], -5), ([1.0], float("nan"))])
def test_bad_percentile_arguments_raise(values, p):
    with pytest.raises(ValueError):
        nearest_rank(values, p)
