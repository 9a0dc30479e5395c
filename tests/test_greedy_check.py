"""course_utils.models.greedy: greedy outputs agree, or differ only at a near-tie rounding can flip."""

import pytest
import torch
from torch import nn

from course_utils.models.greedy import first_difference, same_greedy, top2_gap


class FixedLogits(nn.Module):
    """A stand-in model: next-token logits depend only on the context's length (a table)."""

    def __init__(self, table: list[list[float]]) -> None:
        super().__init__()
        self.table = torch.tensor(table)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.table[: idx.shape[1]].unsqueeze(0)


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_equal_outputs_pass_silently():
    model = FixedLogits([[0.0, 1.0]] * 4)
    assert same_greedy(model, [[0], [1]], [[1, 1], [1]], [[1, 1], [1]], what="x") == ""


def test_a_difference_at_a_near_tie_is_accepted_and_named():
    # context of length 2 (prompt 1 token + 1 output token): logits 3.0 and 3.00001, a near-tie
    model = FixedLogits([[0.0, 9.0], [3.0, 3.00001], [5.0, 0.0]])
    assert top2_gap(model, [0, 1]) == pytest.approx(1e-5, abs=1e-6)
    note = same_greedy(model, [[0]], [[1, 0]], [[1, 1]], what="chunking")
    assert note.startswith("chunking: the outputs differ only where the two best tokens were within float rounding")
    assert "request 0 from token 1 on" in note


def test_any_other_difference_fails_with_where_and_how_far():
    model = FixedLogits([[0.0, 9.0], [3.0, 4.0], [5.0, 0.0]])
    with pytest.raises(AssertionError, match=r"paging changed the outputs: request 0 differs at token 1 \(0 against 1\)"):
        same_greedy(model, [[0]], [[1, 0]], [[1, 1]], what="paging")
    with pytest.raises(AssertionError, match="request 0 has 1 and 2 tokens"):
        same_greedy(model, [[0]], [[1]], [[1, 1]], what="paging")
    with pytest.raises(ValueError, match="1 prompts, 2 and 1 outputs"):
        same_greedy(model, [[0]], [[1], [1]], [[1]], what="paging")
