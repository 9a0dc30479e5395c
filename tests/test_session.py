import random

import pytest
import torch

from course_utils import session


def test_start_seeds_everything_and_returns_summary():
    line = session.start(seed=7)
    a = (random.random(), torch.rand(1).item())
    session.start(seed=7)
    b = (random.random(), torch.rand(1).item())
    assert a == b
    assert "torch" in line and "\n" not in line


def test_start_resets_compiled_state():
    calls = {"n": 0}

    def backend(gm, example_inputs):
        calls["n"] += 1
        return gm.forward

    @torch.compile(backend=backend)
    def f(x):
        return x * 2

    f(torch.ones(3))
    f(torch.ones(3))
    assert calls["n"] == 1  # cached
    session.start()
    f(torch.ones(3))
    assert calls["n"] == 2  # compiled again after the reset


def test_start_rejects_a_non_int_seed():
    with pytest.raises(TypeError):
        session.start(seed="0")


def test_summary_is_one_line_with_torch_version():
    line = session.summary()
    assert "\n" not in line
    assert torch.__version__ in line and "mode:" in line


def test_python_3_13_0_is_named_once_in_the_setup_line():
    note = session.python_note((3, 13, 0, "final", 0))
    assert "3.13.0" in note and "3.13.1" in note and "make doctor" in note
    assert session.python_note((3, 13, 1)) == session.python_note((3, 12, 1)) == ""
    line = session.start()
    assert (session.python_note() in line) if session.python_note() else ("3.13.1" not in line)
    if session.python_note():  # torch's own warning would then come from whichever cell compiles first
        assert torch._dynamo.config.issue_3_13_0_warning is False
