import torch

from course_utils.breaks import BreakReport, break_report


def three_breaks(x, temperature):
    y = torch.sin(x) * torch.cos(x) + x
    print("stage one")                 # break 1: print
    y = y * torch.sigmoid(y)
    t = temperature.item()             # break 2: a tensor value into Python
    y = torch.tanh(y / t)
    if temperature > 1:                # break 3: a Python branch on tensor data
        y = y * 0.5
    else:
        y = y * 2.0
    return y + torch.sigmoid(x)


def no_break(x, temperature):
    return torch.tanh(torch.sin(x) / temperature) * torch.where(temperature > 1, 0.5, 2.0) + 1


def break_at_the_end(x):
    y = torch.relu(x) * 2
    print("done")
    return y


def test_three_breaks_give_four_graphs_and_three_reasons(capsys):
    report = break_report(three_breaks, torch.randn(4, 4), torch.tensor(1.5))
    assert isinstance(report, BreakReport)
    assert (report.graphs, report.breaks, len(report.reasons)) == (4, 3, 3)
    assert all(reason and "\n" not in reason for reason in report.reasons)
    assert report.first_reason == report.reasons[0]
    assert "stage one" not in capsys.readouterr().out  # what fn prints is kept out of the way


def test_no_break():
    report = break_report(no_break, torch.randn(4, 4), torch.tensor(1.5))
    assert (report.graphs, report.breaks, report.reasons, report.first_reason) == (1, 0, [], "")


def test_a_break_with_nothing_after_it_counts_but_adds_no_graph():
    report = break_report(break_at_the_end, torch.randn(4))
    assert (report.graphs, report.breaks) == (1, 1)


def test_keyword_arguments_reach_the_call():
    report = break_report(three_breaks, torch.randn(4, 4), temperature=torch.tensor(0.5))
    assert report.breaks == 3
