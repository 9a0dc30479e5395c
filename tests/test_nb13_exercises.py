"""Notebook 13's checkers: other right answers are accepted, odd answers get a hint, never a crash (the
notebook's own stubs: test_exercise_stubs.py)."""

from __future__ import annotations

import math

import pytest

from course_utils import exercises


def _locate_divmod(table, block, pos):
    logical, offset = divmod(pos, block)
    if logical >= len(table):
        raise IndexError("past the table")
    return [table[logical], offset]          # a list is as good as a tuple


def _accept_loop(draft, predicted):
    kept = []
    for d, p in zip(draft, predicted):
        kept.append(p)
        if d != p:
            return kept
    return kept + [predicted[len(draft)]]


@pytest.mark.parametrize("name, answer", [
    ("13.blocks_needed", lambda n, block: math.ceil(n / block)),
    ("13.blocks_needed", lambda n, block: (n + block - 1) // block),
    ("13.locate", _locate_divmod),
    ("13.locate", lambda table, block, pos: (table[pos // block], pos % block)),   # the list raises IndexError
    ("13.accept_drafts", _accept_loop),
    ("13.accept_drafts", lambda draft, predicted: tuple(_accept_loop(draft, predicted))),
])
def test_other_right_answers_are_accepted(name, answer):
    fb = exercises.check(name, answer, strict=True)
    assert fb.correct, fb.message


@pytest.mark.parametrize("name, answer, hint", [
    ("13.locate", lambda table, block, pos: table[pos // block], "return a pair"),
    ("13.locate", lambda table, block, pos: (table[min(pos // block, len(table) - 1)], pos % block), "IndexError"),
    ("13.blocks_needed", lambda n, block: n / block, "returned"),
    ("13.accept_drafts", lambda draft, predicted: predicted[len(draft) + 5], "raised IndexError"),
    ("13.blocks_needed", 5, "expected a function"),
])
def test_odd_answers_are_feedback_not_a_crash(name, answer, hint):
    fb = exercises.check(name, answer, strict=True)
    assert not fb.correct and hint in fb.message, fb.message
