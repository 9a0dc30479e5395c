"""Notebook 11's checkers: other right answers are accepted, odd answers get a hint (the notebook's own stubs:
test_exercise_stubs.py)."""

from __future__ import annotations

import math

import pytest
import torch

from course_utils import exercises
from course_utils.exercises import nb11


def _attention_where(q, k, v, mask):
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * q.shape[-1] ** -0.5
    return torch.where(mask, scores, torch.tensor(float("-inf"))).softmax(-1) @ v


def _attention_exp(q, k, v, mask):   # an explicit softmax, max-subtracted
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, float("-inf"))
    weights = (scores - scores.amax(-1, keepdim=True)).exp()
    return weights / weights.sum(-1, keepdim=True) @ v


def _window_other_form(window):
    return lambda b, h, q_idx, kv_idx: (kv_idx <= q_idx) & (kv_idx > q_idx - window)


def _sparsity_loop(mask, block):
    n = mask.shape[0] // block
    empty = sum(not bool(mask[i * block:(i + 1) * block, j * block:(j + 1) * block].any())
                for i in range(n) for j in range(n))
    return torch.tensor(empty / (n * n))   # a 0-d tensor is accepted too


@pytest.mark.parametrize("name, answer", [("11.attention", _attention_where), ("11.attention", _attention_exp),
                                          ("11.sliding_window", _window_other_form),
                                          ("11.block_sparsity", _sparsity_loop)])
def test_other_right_answers_are_accepted(name, answer):
    fb = exercises.check(name, answer, strict=True)
    assert fb.correct, fb.message


def test_block_sparsity_agrees_with_create_block_mask():
    """The reference counts what FlexAttention's BlockMask reports, on a mask of its own size."""
    from torch.nn.attention.flex_attention import create_block_mask

    window = nb11.make_sliding_window(200)
    block_mask = create_block_mask(window, None, None, 1024, 1024, device="cpu")
    dense = nb11.dense_mask(window, 1024)
    assert math.isclose(nb11.block_sparsity(dense, block_mask.BLOCK_SIZE[0]) * 100, block_mask.sparsity(), abs_tol=1e-6)


def test_a_mask_mod_that_returns_a_float_gets_a_hint():
    fb = exercises.check("11.sliding_window", lambda window: (lambda b, h, q, kv: (q - kv).float()), strict=True)
    assert not fb.correct and "boolean tensor" in fb.message
    fb = exercises.check("11.sliding_window", lambda window: 3, strict=True)
    assert not fb.correct and "inner function" in fb.message


def test_sliding_window_feedback_shows_the_call_the_learner_wrote():
    """make_sliding_window takes one argument: feedback shows that call and names the grid its mask_mod ran on."""
    stub = exercises.check("11.sliding_window", lambda window: (lambda b, h, q, kv: q >= kv), strict=True)
    assert not stub.correct
    assert stub.message.startswith("make_sliding_window(1) returned a mask_mod that, on a 6x6 grid of indices, "
                                   "lets q_idx=1 attend to kv_idx=0 instead of a window of 1"), stub.message
    too_narrow = exercises.check("11.sliding_window", lambda window: (lambda b, h, q, kv: q == kv), strict=True)
    assert "make_sliding_window(3) returned" in too_narrow.message and "keeps q_idx=1 from kv_idx=0" in too_narrow.message
    one_dim = exercises.check("11.sliding_window", lambda window: (lambda b, h, q, kv: (q >= kv).any(-1)), strict=True)
    assert not one_dim.correct and "gives a mask of shape (6,)" in one_dim.message, one_dim.message
