"""Every checker accepts its reference solution and rejects plausible wrong answers with a hint."""

import pytest

from course_utils import exercises


@pytest.mark.parametrize("name", exercises.names())
def test_reference_solution_is_accepted(name):
    fb = exercises.check(name, exercises.solution(name))
    assert fb.correct, fb.message
    assert bool(fb) and str(fb).startswith("[Correct]")


@pytest.mark.parametrize("name", exercises.names())
def test_wrong_answers_are_rejected_with_a_hint(name):
    wrong = list(exercises.get(name).wrong_answers())
    assert wrong, f"{name} has no wrong answers to test against"
    for answer in wrong:
        fb = exercises.check(name, answer)
        assert not fb.correct, f"{name} accepted a wrong answer: {answer!r}"
        assert len(fb.message) > 20, fb.message
        assert "Traceback" not in fb.message


@pytest.mark.parametrize("name", exercises.names())
def test_solution_source_is_revealable(name):
    src = exercises.solution_source(name)
    assert "def " in src or "return" in src


def test_every_notebook_has_registered_exercises():
    from course_utils.config import REPO_ROOT

    numbers = {p.name[:2] for p in (REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    registered = {n.split(".")[0] for n in exercises.names()}
    assert numbers and numbers <= registered, f"notebooks without checkers: {numbers - registered}"


def test_unknown_exercise_is_feedback_not_a_crash():
    fb = exercises.check("99.nope", 1)
    assert not fb.correct and "known:" in fb.message


def test_specific_hints_for_nb00():
    import torch

    fb = exercises.check("00.rms_norm", torch.ones(2))
    assert "tensor" in fb.message and "function itself" in fb.message
    fb = exercises.check("00.break_even", lambda a, b, c: (a - c) / (b - c))
    assert not fb.correct  # divides by zero on the 'never pays' case, or returns a float
    fb = exercises.check("00.break_even", lambda a, b, c: 0 if b > c else None)
    assert "starts at 1" in fb.message


def test_checker_crash_becomes_feedback():
    def explodes(*_):
        raise RuntimeError("boom")

    fb = exercises.check("00.break_even", explodes)
    assert not fb.correct and "RuntimeError: boom" in fb.message


def test_duplicate_registration_is_refused():
    from course_utils.exercises.framework import exercise

    with pytest.raises(ValueError, match="twice"):
        exercise("00.rms_norm", "p", lambda: None, lambda: [])(lambda a: None)


def test_expect_function_names_the_expected_call():
    exercises.expect_function(len, "f(x)")  # a callable passes silently
    with pytest.raises(exercises.Wrong, match=r"expected a function halvings\(x\), got int\. try again"):
        exercises.expect_function(3, "halvings(x)", hint="try again")
    import torch

    with pytest.raises(exercises.Wrong, match=r"passed a tensor .* pass the function itself, halvings\(x\)"):
        exercises.expect_function(torch.ones(2), "halvings(x)")
