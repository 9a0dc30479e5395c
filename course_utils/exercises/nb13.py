"""Exercises of notebook 13: blocks a sequence needs, the block table lookup, accepting speculative drafts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .framework import Mistake, Raises, Wrong, case, function_exercise, short
from ..text import counted

# --- 13.blocks_needed: how many blocks of `block` positions hold `n_tokens` tokens.


def blocks_needed(n_tokens: int, block: int) -> int:
    """Return the number of blocks of ``block`` positions that hold ``n_tokens`` tokens (rounded up)."""
    return -(-n_tokens // block)


def _blocks_mistakes() -> list[Mistake]:
    # round() first: where it fails, floor division fails too, and round's hint is the telling one
    return [(lambda n, block: round(n / block), "round() goes to the nearest whole number, sometimes down: "
                                                "round up instead."),
            (lambda n, block: n // block, "Round UP: a sequence that fills part of a block still needs that block "
                                          "(16 tokens in blocks of 16 need 1, 17 need 2)."),
            (lambda n, block: n // block + 1, "n // block + 1 is one too many when n fills its last block exactly "
                                              "(and for n = 0): round up with -(-n // block) or math.ceil."),
            (lambda n, block: n * block, "Divide the tokens by the block size (rounding up), do not multiply.")]


function_exercise(
    "13.blocks_needed",
    solution=blocks_needed,
    cases=lambda: [case(n, block, gives=blocks) for n, block, blocks in (
        (31, 16, 2), (17, 16, 2), (16, 16, 1), (1, 16, 1), (0, 16, 0),   # 16 fills one block exactly; 0 needs none
        (511, 16, 32), (512, 16, 32), (100, 7, 15), (6, 4, 2))],          # 7 x 14 = 98 < 100
    mistakes=_blocks_mistakes,
    errors=[((TypeError, ValueError, ZeroDivisionError), "Use integer arithmetic on the two numbers.")],
    normalise=lambda result: int(result) if isinstance(result, float) and result.is_integer() else result,
    otherwise="Divide and round up: -(-n_tokens // block).",
    success="you round up, so a partly filled last block is counted.",
)

# --- 13.locate: where a position's keys and values live, through the block table.


def locate(table: Sequence[int], block: int, pos: int) -> tuple[int, int]:
    """Return (physical block, offset) of position ``pos`` for a sequence with block table ``table``."""
    logical = pos // block
    if not 0 <= logical < len(table):
        raise IndexError(f"position {pos} is beyond the {counted(len(table), 'block')} of this table")
    return table[logical], pos % block


def _as_pair(result: Any) -> Any:
    """A pair as a tuple (a list is as good); a result that is not a pair gets its own hint."""
    if isinstance(result, (list, tuple)):
        return tuple(result)
    raise Wrong(f"return a pair (physical_block, offset), not {short(result)}.")


def _locate_mistakes() -> list[Mistake]:
    return [(lambda table, block, pos: (table[pos // block], pos // block),
             "The offset inside the block is pos % block; pos // block is which entry of the table to read."),
            (lambda table, block, pos: (pos // block, pos % block),
             "pos // block is the LOGICAL block; the physical block is what the table holds there: "
             "table[pos // block]."),
            (lambda table, block, pos: (table[pos % block], pos // block),
             "Swapped: the table entry is table[pos // block], the offset pos % block."),
            (lambda table, block, pos: (table[(pos // block) % len(table)], pos % block),
             "A position past the end of the table has no block: raise IndexError instead of wrapping around."),
            (lambda table, block, pos: (table[pos // block - 1], pos % block),
             "Blocks are counted from 0: positions 0..block-1 live in table[0].")]


function_exercise(
    "13.locate",
    solution=locate,
    normalise=_as_pair,
    cases=lambda: [case([7, 2, 9], 16, 0, gives=(7, 0)), case([7, 2, 9], 16, 15, gives=(7, 15)),
                   case([7, 2, 9], 16, 16, gives=(2, 0)), case([7, 2, 9], 16, 47, gives=(9, 15)),
                   case([5, 0, 3, 8], 4, 9, gives=(3, 1)),                # 9 = 2 x 4 + 1: table[2] = 3
                   case([7, 2, 9], 16, 48, gives=Raises(IndexError)),     # 3 blocks hold positions 0..47
                   case([4], 16, 20, gives=Raises(IndexError))],
    mistakes=_locate_mistakes,
    errors=[((TypeError, ValueError, KeyError, ZeroDivisionError),
             "Index the table with pos // block and take the offset pos % block.")],
    otherwise="The physical block is table[pos // block] and the offset pos % block; past the table, IndexError.",
    success="you translate positions to (block, offset) through the table, and refuse positions past it.",
)

# --- 13.accept_drafts: speculative decoding's greedy acceptance rule.


def accept_drafts(draft: Sequence[int], predicted: Sequence[int]) -> list[int]:
    """Return the tokens to keep: ``draft`` up to its first mismatch with ``predicted``, then the model's token."""
    n = 0
    while n < len(draft) and draft[n] == predicted[n]:
        n += 1
    return list(predicted[:n + 1])


def _accept_mistakes() -> list[Mistake]:
    def all_matches(draft, predicted):
        return [d for d, p in zip(draft, predicted) if d == p]

    def no_bonus(draft, predicted):
        return accept_drafts(draft, predicted)[:-1]

    def keeps_going(draft, predicted):   # keeps matches after a mismatch
        return [d for d, p in zip(draft, predicted) if d == p] + [predicted[len(draft)]]

    def whole_draft(draft, predicted):
        return list(draft) + [predicted[len(draft)]]

    return [(all_matches, "Stop at the first mismatch, and add the model's own token at that point: it is "
                          "always correct, so every pass yields at least one token."),
            (no_bonus, "After the accepted drafts, keep the model's token at the first mismatch (or after the "
                       "last draft when all match): predicted[n]."),
            (keeps_going, "A draft after the first mismatch was conditioned on a wrong token: stop at the first "
                          "mismatch."),
            (whole_draft, "Compare each draft token with the model's prediction at its position; keep only the "
                          "matching prefix.")]


function_exercise(
    "13.accept_drafts",
    solution=accept_drafts,
    normalise=lambda result: list(result) if isinstance(result, (list, tuple)) else result,
    cases=lambda: [case([4, 6, 7], [5, 6, 7, 8], gives=[5]),           # the first draft is wrong: the model's 5
                   case([5, 6, 7], [5, 6, 9, 1], gives=[5, 6, 9]),     # two accepted, then the model's 9
                   case([5, 6, 7], [5, 6, 7, 8], gives=[5, 6, 7, 8]),  # all accepted, plus the bonus token
                   case([], [3], gives=[3]),
                   case([1, 2, 1, 2], [1, 3, 1, 2, 0], gives=[1, 3])],  # later matches do not count
    mistakes=_accept_mistakes,
    errors=[((IndexError, TypeError, ValueError), "predicted has one more entry than draft; walk both while they "
                                                  "match.")],
    otherwise="Keep draft[:n] where n is the length of the matching prefix, then predicted[n].",
    success="you keep exactly what greedy decoding would have produced, and at least one token per pass.",
)
