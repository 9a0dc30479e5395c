"""The checker framework: a registry of exercises, and ``check`` that never crashes.

A checker is a function ``answer -> str | None`` that returns a success message
(or None) when the answer is right and raises ``Wrong("hint")`` when it is not.
``check`` turns anything else a checker raises (say, the learner's function
blowing up) into feedback too, so a wrong answer never shows a traceback.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


class Wrong(Exception):
    """Raised by a checker: the answer is wrong, and the message is the hint."""


def expect_function(answer: Any, usage: str, hint: str = "") -> None:
    """Return None when ``answer`` is callable; otherwise raise ``Wrong`` naming the expected ``usage``.

    ``usage`` is how the learner's function is called, e.g. ``"halvings(x)"``. A tensor gets
    its own hint: it is almost always the result of calling the function instead of passing it.
    """
    import torch

    if isinstance(answer, torch.Tensor):
        raise Wrong(f"you passed a tensor (the result of a call); pass the function itself, {usage}.")
    if not callable(answer):
        raise Wrong(f"expected a function {usage}, got {type(answer).__name__}.{' ' + hint if hint else ''}")


@dataclass(frozen=True)
class Feedback:
    """The verdict on one answer; truthy when correct. Displays itself in a notebook."""

    exercise: str
    correct: bool
    message: str

    def __bool__(self) -> bool:
        return self.correct

    def __str__(self) -> str:
        mark = "Correct" if self.correct else "Not yet"
        return f"[{mark}] {self.exercise}: {self.message}"

    __repr__ = __str__


@dataclass(frozen=True)
class Exercise:
    """One exercise: its checker, a reference solution, and wrong answers the checker must reject."""

    name: str
    prompt: str
    checker: Callable[[Any], str | None]
    solution: Callable[[], Any]
    wrong_answers: Callable[[], Iterable[Any]]


_REGISTRY: dict[str, Exercise] = {}


def exercise(name: str, prompt: str, solution: Callable[[], Any],
             wrong_answers: Callable[[], Iterable[Any]]) -> Callable[[Callable[[Any], str | None]],
                                                                     Callable[[Any], str | None]]:
    """Return a decorator that registers a checker under ``name``.

    ``solution`` returns a correct answer; ``wrong_answers`` returns plausible
    wrong ones. Both are zero-argument callables so nothing is built at import.
    """
    def register(checker: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
        if name in _REGISTRY:
            raise ValueError(f"exercise {name!r} is registered twice")
        _REGISTRY[name] = Exercise(name, prompt, checker, solution, wrong_answers)
        return checker

    return register


def names() -> list[str]:
    """Return the names of all registered exercises, sorted."""
    return sorted(_REGISTRY)


def get(name: str) -> Exercise:
    """Return the exercise called ``name``; KeyError lists the names that exist."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no exercise {name!r}; known: {', '.join(names())}") from None


def check(name: str, answer: Any) -> Feedback:
    """Return feedback on ``answer`` to exercise ``name``; never raises."""
    try:
        ex = get(name)
    except KeyError as err:
        return Feedback(str(name), False, str(err.args[0]))
    try:
        message = ex.checker(answer)
    except Wrong as hint:
        return Feedback(name, False, str(hint))
    except Exception as err:  # the learner's code failed inside the checker
        return Feedback(
            name, False,
            f"checking your answer raised {type(err).__name__}: {err}. "
            f"The exercise asks: {ex.prompt}",
        )
    return Feedback(name, True, message or "well done.")


def solution(name: str) -> Any:
    """Return the reference answer to exercise ``name`` (a value or a function)."""
    return get(name).solution()


def solution_source(name: str) -> str:
    """Return the source code of the reference solution, for a learner who asks to see it."""
    answer = get(name).solution()
    target = answer if callable(answer) and not inspect.isclass(answer) else get(name).solution
    target = getattr(target, "_torchdynamo_orig_callable", target)
    try:
        return textwrap.dedent(inspect.getsource(target))
    except (OSError, TypeError):
        return repr(answer)
