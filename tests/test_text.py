"""course_utils.text: counts written as English."""

import numpy as np
import pytest

from course_utils.text import counted


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
