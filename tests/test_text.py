"""course_utils.text: counts written as English."""

import numpy as np
import pytest

from course_utils.text import about, counted, whole_percents


@pytest.mark.parametrize(("n", "expected"), [(0, "0 loops"), (1, "1 loop"), (2, "2 loops"), (1024, "1,024 loops")])
def test_counted_regular_plural(n: int, expected: str) -> None:
    assert counted(n, "loop") == expected


def test_counted_irregular_plural_and_numpy_integers() -> None:
    assert counted(1, "body", "bodies") == "1 body"
    assert counted(3, "body", "bodies") == "3 bodies"
    assert counted(np.int64(2), "graph") == "2 graphs"


@pytest.mark.parametrize("bad", [1.5, "3", None, True])
def test_counted_rejects_what_is_not_a_count(bad: object) -> None:
    with pytest.raises(TypeError, match="whole number"):
        counted(bad, "loop")  # type: ignore[arg-type]


def test_counted_rejects_negative_counts_and_empty_nouns() -> None:
    with pytest.raises(ValueError, match="zero or more"):
        counted(-1, "loop")
    with pytest.raises(ValueError, match="needs a noun"):
        counted(2, " ")


@pytest.mark.parametrize("shares, expected", [
    ([0.874, 0.003, 0.052, 0.071], [88, 0, 5, 7]),   # rounding each would give 99 in all
    ([1 / 3] * 3, [34, 33, 33]),
    ([0.5, 0.5], [50, 50]),
    ([0.2, 0.3], [20, 30]),                          # shares that sum below 1 keep their own total
    ([], []),
])
def test_whole_percents_add_up_to_the_rounded_total(shares: list[float], expected: list[int]) -> None:
    out = whole_percents(shares)
    assert out == expected and sum(out) == round(100 * sum(shares))


@pytest.mark.parametrize("bad", [[-0.1, 0.5], [float("nan")], [float("inf")]])
def test_whole_percents_rejects_negative_or_non_finite_shares(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="finite shares"):
        whole_percents(bad)


@pytest.mark.parametrize("n, text", [(185_942, "about 190,000 calls"), (1_225, "about 1,200 calls"),
                                     (474, "about 470 calls"), (14, "about 14 calls"), (13.2, "about 14 calls"),
                                     (0.3, "about 1 call"), (0, "about 0 calls"), (99.5, "about 100 calls"),
                                     (995, "about 1,000 calls")])
def test_about_rounds_an_estimate_to_two_figures(n, text):
    assert about(n, "call") == text


def test_about_keeps_more_digits_when_asked_and_rejects_bad_counts():
    assert about(185_942, "call", digits=3) == "about 186,000 calls"
    for bad in (-1, float("nan"), float("inf"), True, "12"):
        with pytest.raises(ValueError, match="finite count"):
            about(bad, "call")
    with pytest.raises(ValueError, match="digits"):
        about(10, "call", digits=0)
