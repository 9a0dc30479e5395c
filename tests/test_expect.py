import sys

import pytest

from course_utils.expect import expect_error


def fails(message, *, kind=ValueError):
    raise kind(message)


def test_returns_the_matching_exception():
    err = expect_error(fails, "Tensor has 3 dims", match=r"\d dims")
    assert isinstance(err, ValueError) and str(err) == "Tensor has 3 dims"


def test_match_is_a_case_insensitive_search_and_kwargs_reach_the_call():
    err = expect_error(fails, "Data-dependent branch", kind=RuntimeError, match="data-DEPENDENT")
    assert isinstance(err, RuntimeError)


def test_a_call_that_succeeds_is_an_assertion_error():
    with pytest.raises(AssertionError, match="the call succeeded"):
        expect_error(lambda: 1, match="anything")


def test_another_message_is_an_assertion_error_that_shows_it():
    with pytest.raises(AssertionError, match=r"expected an error matching 'shape'.*KeyError.*weight") as info:
        expect_error(fails, "weight", kind=KeyError, match="shape")
    assert isinstance(info.value.__cause__, KeyError)


def test_stderr_of_the_failing_call_is_hidden(capsys):
    def noisy():
        print("half-built graph", file=sys.stderr)
        raise RuntimeError("boom")

    expect_error(noisy, match="boom")
    assert "half-built" not in capsys.readouterr().err
