"""Self-checking exercises.

In a notebook::

    from course_utils import exercises
    exercises.check("00.break_even", my_break_even)   # right: confirmed; wrong: a hint
    print(exercises.solution_source("00.break_even"))  # reveal the reference solution
    print(exercises.progress_report())                 # what you have passed so far

Every check is appended to the learner's progress record (``progress.py``: where it lives, what a
line holds); ``python -m course_utils progress`` and ``python -m course_utils answers`` read the
record and the reference solutions from a terminal.

Each notebook's exercises live in a module ``nbNN.py`` here and register themselves, mostly
through ``framework.function_exercise`` (cases, a reference, mistakes with their hints); the test
suite runs every checker in strict mode against its reference solution and against every declared
wrong answer, asserting the hint each one gets.
"""

import importlib
import pkgutil

from .framework import (Exercise, Feedback, Wrong, check, expect_function, get, names, solution,
                        solution_source)
from .progress import report as progress_report

# Importing a notebook's module registers its exercises: load every nbNN module here.
for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _info.name.startswith("nb"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["Exercise", "Feedback", "Wrong", "check", "expect_function", "get", "names", "progress_report",
           "solution", "solution_source"]
