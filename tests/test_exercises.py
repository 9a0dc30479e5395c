"""Every checker accepts its reference solution and gives each declared wrong answer its own hint.

Checks run in strict mode: a bug in a checker's own code fails the test instead of becoming
"[Not yet]" feedback. What the learner's code raises is feedback in both modes.
"""

import dataclasses

import pytest
import torch
from torch.export import Dim

from course_utils import exercises
from course_utils.exercises import framework, nb02


@pytest.mark.parametrize("name", exercises.names())
def test_reference_solution_is_accepted(name):
    fb = exercises.check(name, exercises.solution(name), strict=True)
    assert fb.correct, fb.message
    assert bool(fb) and str(fb).startswith("[Correct]")


@pytest.mark.parametrize("name", exercises.names())
def test_wrong_answers_get_their_hint(name):
    wrong = exercises.get(name).wrong_answers()
    assert len(wrong) >= 3, f"{name} declares too few wrong answers"
    for answer, hint in wrong:
        fb = exercises.check(name, answer, strict=True)
        label = getattr(answer, "__name__", repr(answer))
        assert not fb.correct, f"{name} accepted a wrong answer: {label}"
        assert hint in fb.message, f"{name}, {label}: expected a hint containing {hint!r}, got {fb.message!r}"
        assert "Traceback" not in fb.message and "\n" not in fb.message and len(fb.message) < 600, fb.message


def _float_counter(x):
    return torch.while_loop(lambda n, y: y.abs().max() > 1, lambda n, y: (n + 1, y / 2), (torch.zeros(()), x))[0]


def _item_predicate(x):
    peak = x.abs().max()
    return torch.cond(peak.item() > 1.0, lambda x, p: x / p, lambda x, p: x.clone(), (x, peak))


def _where_rescale(x):
    peak = x.abs().max()
    return torch.where(peak > 1, x / peak, x)


def _topk_median(x):
    return x.topk((x.shape[1] + 1) // 2, dim=1, largest=False).values[:, -1]


#: Right answers other than the reference solution, written the way learners write them.
OTHER_RIGHT_ANSWERS = [
    ("04.halvings", _float_counter),
    ("04.cond_export", _item_predicate),
    ("06.cond_export", _where_rescale),
    ("06.dynamic_batch", {"x": {0: Dim.AUTO(min=1, max=256)}}),
    ("06.dynamic_batch", {"x": {0: Dim.DYNAMIC(max=256)}}),
    ("06.dynamic_batch", ({0: Dim("b", max=256)},)),
    ("07.median_rewrite", _topk_median),
    ("07.dynamic_shapes", {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}),
    ("07.dynamic_shapes", {"input_ids": {0: Dim.AUTO, 1: Dim.AUTO}, "attention_mask": {0: Dim.AUTO, 1: Dim.AUTO}}),
    ("02.recompile", "B, C, D, F"),
    ("02.count_breaks", 2.0),
    ("02.size_one", lambda x: (x @ nb02.SCORE_WEIGHTS).view(-1)),
    ("02.size_one", lambda x: (x @ nb02.SCORE_WEIGHTS)[:, 0]),
]


@pytest.mark.parametrize("name, answer", OTHER_RIGHT_ANSWERS, ids=[n for n, _ in OTHER_RIGHT_ANSWERS])
def test_other_right_answers_are_accepted(name, answer):
    fb = exercises.check(name, answer, strict=True)
    assert fb.correct, fb.message


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
    fb = exercises.check("00.rms_norm", torch.ones(2))
    assert "tensor" in fb.message and "function itself" in fb.message
    fb = exercises.check("00.break_even", lambda a, b, c: (a - c) / (b - c))
    assert not fb.correct  # divides by zero on the 'never pays' case, or returns a float
    fb = exercises.check("00.break_even", lambda a, b, c: 0 if b > c else None)
    assert "starts at 1" in fb.message


def test_learner_errors_are_feedback_even_in_strict_mode():
    def explodes(*_):
        raise RuntimeError("boom")

    for strict in (False, True):
        fb = exercises.check("00.break_even", explodes, strict=strict)
        assert not fb.correct and "RuntimeError: boom" in fb.message


def test_checker_bugs_raise_in_strict_mode_and_apologise_otherwise(monkeypatch):
    def buggy_checker(answer):
        return {}["a key the checker forgot"]

    buggy = dataclasses.replace(exercises.get("00.break_even"), checker=buggy_checker)
    monkeypatch.setitem(framework._REGISTRY, "00.break_even", buggy)
    with pytest.raises(KeyError):
        exercises.check("00.break_even", exercises.solution("00.break_even"), strict=True)
    fb = exercises.check("00.break_even", exercises.solution("00.break_even"))
    assert not fb.correct and "checker itself failed" in fb.message and "\n" not in fb.message


def test_a_failing_compile_is_one_quiet_line(capfd):
    def rms_norm(x):  # forgets keepdim=True: Dynamo fails while tracing and logs a traceback
        return x * torch.rsqrt(x.pow(2).mean(dim=-1) + 1e-6)

    fb = exercises.check("00.rms_norm", torch.compile(rms_norm), strict=True)
    assert "keepdim=True" in fb.message and "\n" not in fb.message and len(fb.message) < 400
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out + err)[:500]


def test_duplicate_registration_is_refused():
    from course_utils.exercises.framework import exercise

    with pytest.raises(ValueError, match="twice"):
        exercise("00.rms_norm", lambda: None, lambda: [])(lambda a: None)


def test_expect_function_names_the_expected_call():
    exercises.expect_function(len, "f(x)")  # a callable passes silently
    with pytest.raises(exercises.Wrong, match=r"expected a function halvings\(x\), got int\. try again"):
        exercises.expect_function(3, "halvings(x)", hint="try again")
    with pytest.raises(exercises.Wrong, match=r"passed a tensor .* pass the function itself, halvings\(x\)"):
        exercises.expect_function(torch.ones(2), "halvings(x)")


def test_short_and_differs_describe_values_briefly():
    assert framework.short(torch.zeros(100, 3)) == "a tensor of shape (100, 3)"
    assert framework.short(list(range(10))) == "<10 values>"
    assert framework.differs(torch.ones(2), torch.ones(2)) is None
    assert framework.differs(torch.ones(2, 1), torch.ones(2)) == "shape (2, 1) instead of (2,)"
    assert framework.differs(2.0, 2) == "2.0, not a whole number (an int)"
    assert framework.differs(None, 2) == "None instead of 2"   # a missing answer names what was expected
    assert framework.differs(torch.ones(2, dtype=torch.float64), torch.ones(2)) is None
    assert framework.differs(torch.ones(2), torch.ones(2, dtype=torch.int8)) == "dtype torch.float32 instead of torch.int8"
    assert framework.differs(("a", {}), ("a", None)) == "{} instead of None in item 1"
    assert framework.differs({"w": torch.ones(3)}, {"w": torch.ones(2, 3)}) == "shape (3,) instead of (2, 3) for 'w'"
    # the expected number in full, so a learner does not copy a rounded one
    assert framework.differs((0.0, 1.0), (0.299761054102, 1.0)) == "0.0 instead of 0.299761054102 in item 0"
    assert framework.differs([6, 7], [5]) == "[6, 7] instead of [5]"   # short lists: the items, not a count
    assert framework.differs(5, [5]) == "5, not a list of 1 item"


def test_usage_comes_from_the_signature():
    def count_ops(fn, *args, scale=1, **options):
        return 0

    assert framework.usage_of(count_ops) == "count_ops(fn, *args, scale, **options)"
    fb = exercises.check("12.global_batch", 3)
    assert "expected a function global_batch(per_rank, world, accumulation), got int" in fb.message


def _register_throwaway(name, **table):
    def half(n):
        if n < 0:
            raise ValueError("negative")
        return n // 2

    framework.function_exercise(name, solution=half, success="ok", **table)
    return half


def test_a_reference_must_not_be_the_solution(monkeypatch):
    monkeypatch.setattr(framework, "_REGISTRY", dict(framework._REGISTRY))
    with pytest.raises(ValueError, match="independent"):
        framework.function_exercise("99.self", solution=len, reference=len, cases=list, success="ok")
    _register_throwaway("99.no_expected", cases=lambda: [(4,)])   # no reference and no written result
    with pytest.raises(TypeError, match="needs a reference"):
        exercises.check("99.no_expected", lambda n: n // 2, strict=True)


def test_raising_can_be_the_expected_outcome(monkeypatch):
    monkeypatch.setattr(framework, "_REGISTRY", dict(framework._REGISTRY))
    half = _register_throwaway("99.half", cases=lambda: [framework.case(4, gives=2),
                                                        framework.case(-1, gives=framework.Raises(ValueError))],
                               mistakes=lambda: [(lambda n: abs(n) // 2, "refuse negative numbers")])
    assert exercises.check("99.half", half, strict=True).correct
    fb = exercises.check("99.half", lambda n: abs(n) // 2, strict=True)   # returns where it must raise
    assert not fb.correct and "returned 0 instead of raising ValueError" in fb.message
    assert "refuse negative numbers" in fb.message
    fb = exercises.check("99.half", lambda n: n // 2 if n >= 0 else {}[n], strict=True)   # raises the wrong error
    assert not fb.correct and "raised KeyError" in fb.message
    fb = exercises.check("99.half", lambda n: [][n], strict=True)   # raises where a value is expected
    assert not fb.correct and "half(4) raised IndexError" in fb.message


def test_an_error_a_mistake_also_raises_gets_that_mistakes_hint():
    swapped = exercises.get("13.locate").wrong_answers()[2][0]   # table[pos % block]: IndexError at pos 15
    fb = exercises.check("13.locate", swapped, strict=True)
    assert "raised IndexError" in fb.message and "Swapped" in fb.message


def test_a_quoted_error_is_one_line_with_single_spaces():
    from course_utils.exercises.framework import summary

    err = RuntimeError("got RuntimeError('When merging two branches,  expected same dim\\n  but got 2 and 1.')")
    assert summary(err) == "RuntimeError: When merging two branches, expected same dim but got 2 and 1."
