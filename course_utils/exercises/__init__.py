"""Self-checking exercises.

In a notebook::

    from course_utils import exercises
    exercises.check("00.break_even", my_break_even)   # right: confirmed; wrong: a hint
    print(exercises.solution("00.break_even"))         # reveal the reference solution

Each notebook's exercises live in a module ``nbNN.py`` here and register
themselves with ``framework.exercise``; the test suite runs every checker
against its reference solution and against plausible wrong answers.
"""

from .framework import Exercise, Feedback, Wrong, check, get, names, solution, solution_source

# Importing a module registers its exercises.
from . import nb00  # noqa: E402,F401  (registration side effect)

__all__ = ["Exercise", "Feedback", "Wrong", "check", "get", "names", "solution", "solution_source"]
