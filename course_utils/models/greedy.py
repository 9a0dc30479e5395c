"""Do two greedy decodings of the same prompts agree, allowing only for a near-tie float rounding can flip?

Two ways of computing the same model (with or without a cache, one row or a padded batch, whole prompts
or chunks) add the same numbers in different orders, so their logits can differ in the last bits. Greedy
decoding takes the largest logit: the outputs are identical unless the two best tokens were so close
that such a difference swaps them. ``same_greedy`` checks exactly that: where two outputs differ, it
recomputes the logits at the first differing token with a plain forward pass and accepts the difference
only when the two best tokens there are within ``tol`` of each other (a near-tie); any other difference
fails with the request, the position and the gap, as a bug would.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

#: Logits closer than this count as a near-tie: float32 rounding over the model's sums moves a logit of
#: order 10 by about 1e-6 to 1e-5, so a gap this small may flip between two ways of computing it.
NEAR_TIE = 1e-4


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Return the first position where token lists ``a`` and ``b`` differ (their shorter length when one
    is a prefix of the other), or None when they are equal."""
    if list(a) == list(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@torch.no_grad()
def top2_gap(model: nn.Module, context: Sequence[int]) -> float:
    """Return how far apart the two largest next-token logits are after ``context`` (one plain forward pass)."""
    logits = model(torch.tensor([list(context)]))[0, -1].float()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def same_greedy(model: nn.Module, prompts: Sequence[Sequence[int]], got: Sequence[Sequence[int]],
                want: Sequence[Sequence[int]], *, what: str, tol: float = NEAR_TIE) -> str:
    """Check that greedy outputs ``got`` and ``want`` of the same ``prompts`` agree token for token.

    Returns "" when they do, and a note naming each near-tie when they differ only where the two best
    tokens were within ``tol``; raises AssertionError (naming ``what`` changed the outputs, the request,
    the position and the gap) for any other difference, and ValueError when the lists' lengths differ.
    """
    if not len(prompts) == len(got) == len(want):
        raise ValueError(f"{what}: {len(prompts)} prompts, {len(got)} and {len(want)} outputs")
    notes = []
    for n, (prompt, a, b) in enumerate(zip(prompts, got, want)):
        i = first_difference(a, b)
        if i is None:
            continue
        if i >= min(len(a), len(b)):
            raise AssertionError(f"{what} changed the outputs: request {n} has {len(a)} and {len(b)} tokens")
        gap = top2_gap(model, [*prompt, *b[:i]])
        if gap >= tol:
            raise AssertionError(f"{what} changed the outputs: request {n} differs at token {i} ({a[i]} against "
                                 f"{b[i]}), where the two best tokens are {gap:.3g} apart, more than rounding flips")
        notes.append(f"request {n} from token {i} on (the two best tokens there were {gap:.2g} apart)")
    if not notes:
        return ""
    return (f"{what}: the outputs differ only where the two best tokens were within float rounding of each other, "
            f"a near-tie that a different order of additions can flip, not a bug: " + "; ".join(notes))
