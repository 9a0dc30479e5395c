"""The checker framework: a registry of exercises, table-driven checkers, and ``check`` that never crashes.

A checker takes the learner's answer and returns a success message, or raises ``Wrong("hint")``.
Most checkers are built by ``function_exercise`` from a table: the cases to call the learner's
function with, what each must give (written out by hand in a ``Case``, or computed by a reference
implemented differently from the solution: never the solution itself), and the mistakes learners
make, each with its hint. A wrong result equal to a mistake's result gets that mistake's hint. The mistakes are
also the wrong answers the test suite feeds to the checker, so every hint is tested.

What the learner's code raises becomes a hint too (``run``). Anything else a checker raises is a
bug in the course: ``check(..., strict=True)`` (the test suite) lets it propagate, while a learner
gets a one-line message instead of a traceback. Every verdict is also appended to the learner's
progress record (``progress.py``; ``python -m course_utils progress`` shows it).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import io
import logging
import math
import numbers
import re
import textwrap
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import progress


class Wrong(Exception):
    """Raised by a checker: the answer is wrong, and the message is the hint."""


#: A wrong answer (or a mistaken function) and text that the hint it gets must contain.
Mistake = tuple[Any, str]
#: An exception type, or a piece of an error message, and the hint for that failure.
ErrorHint = tuple[Any, str]


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
    """One exercise: its checker, a reference solution, and wrong answers with the hint each must get."""

    name: str
    checker: Callable[[Any], str]
    solution: Callable[[], Any]
    wrong_answers: Callable[[], list[Mistake]]


_REGISTRY: dict[str, Exercise] = {}


def exercise(name: str, solution: Callable[[], Any],
             wrong_answers: Callable[[], list[Mistake]]) -> Callable[[Callable[[Any], str]], Callable[[Any], str]]:
    """Return a decorator that registers a checker under ``name``.

    ``solution`` returns a correct answer; ``wrong_answers`` returns (wrong answer, hint) pairs,
    where the hint is text the checker's message must contain. Both take no arguments, so nothing
    is built at import.
    """
    def register(checker: Callable[[Any], str]) -> Callable[[Any], str]:
        if name in _REGISTRY:
            raise ValueError(f"exercise {name!r} is registered twice")
        _REGISTRY[name] = Exercise(name, checker, solution, wrong_answers)
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


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Keep torch's log records, warnings and printed output out of the learner's view while checking."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with (warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()),
              contextlib.redirect_stderr(io.StringIO())):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def check(name: str, answer: Any, *, strict: bool = False) -> Feedback:
    """Return feedback on ``answer`` to exercise ``name``; only with ``strict`` may a bug in a checker raise.

    The verdict on a registered exercise is appended to the learner's progress record
    (``progress.record``); a record that cannot be written costs a warning line, never the verdict.
    """
    try:
        ex = get(name)
    except KeyError as err:  # a misspelt name is not an attempt: nothing is recorded
        return Feedback(str(name), False, str(err.args[0]))
    feedback = _verdict(ex, answer, strict=strict)
    progress.record(feedback.exercise, feedback.correct, feedback.message)
    return feedback


def _verdict(ex: Exercise, answer: Any, *, strict: bool) -> Feedback:
    """Return the checker's feedback on ``answer``; a checker bug raises only with ``strict``."""
    try:
        with quiet():
            message = ex.checker(answer)
    except Wrong as hint:
        return Feedback(ex.name, False, str(hint))
    except Exception as err:  # the checker's own code failed, not the learner's
        if strict:
            raise
        return Feedback(ex.name, False, f"sorry, the checker itself failed ({summary(err)}): a bug in the "
                                        "course, not a verdict on your answer. Compare with "
                                        f"exercises.solution_source({ex.name!r}).")
    return Feedback(ex.name, True, message)


def solution(name: str) -> Any:
    """Return the reference answer to exercise ``name`` (a value or a function)."""
    return get(name).solution()


def uncompiled(fn: Any) -> Any:
    """Return the plain function behind a ``torch.compile`` wrapper (anything else unchanged), so that a
    checker can compile or trace a learner's answer however it was passed."""
    return getattr(fn, "_torchdynamo_orig_callable", fn)


def solution_source(name: str) -> str:
    """Return the source code of the reference solution, for a learner who asks to see it."""
    answer = get(name).solution()
    target = answer if callable(answer) and not inspect.isclass(answer) else get(name).solution
    target = uncompiled(target)
    try:
        return textwrap.dedent(inspect.getsource(target))
    except (OSError, TypeError):
        return repr(answer)


# --- Running the learner's code and describing what went wrong, in one line.

def expect_function(answer: Any, usage: str, hint: str = "") -> None:
    """Return None when ``answer`` is callable; otherwise raise ``Wrong`` naming the expected ``usage``.

    ``usage`` is how the learner's function is called, e.g. ``"halvings(x)"``. A tensor gets
    its own hint: it is almost always the result of calling the function instead of passing it.
    """
    if isinstance(answer, torch.Tensor):
        raise Wrong(f"you passed a tensor (the result of a call); pass the function itself, {usage}.")
    if not callable(answer):
        raise Wrong(f"expected a function {usage}, got {type(answer).__name__}.{' ' + hint if hint else ''}")


def usage_of(fn: Callable[..., Any]) -> str:
    """Return how ``fn`` is called, from its signature: ``"count_ops(fn, *args)"``."""
    def word(p: inspect.Parameter) -> str:
        return {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name

    return f"{fn.__name__}({', '.join(word(p) for p in inspect.signature(fn).parameters.values())})"


def summary(err: BaseException) -> str:
    """Return ``err`` as one short line: its type and the most telling line of its message."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err))
    if "## Exception summary" in text:  # torch.onnx.export summarises the real error at the end
        text = text.split("## Exception summary", 1)[1]
    text = re.sub(r"<class '(?:\w+\.)*(\w+)'>", r"\1", text)  # <class 'torch.SymFloat'> -> SymFloat
    quoted = re.search(r"got \w+\((['\"])(.*?)\1\)", text)  # Dynamo quotes the original error
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    generic = ("This higher order operator doesn't work", "RuntimeError when making fake tensor call")
    line = " ".join(quoted.group(2).replace("\\n", " ").split()) if quoted else next(
        (ln for ln in lines if not ln.startswith(generic)), lines[0] if lines else "")
    line = line if len(line) <= 200 else line[:197] + "..."
    return f"{type(err).__name__}: {line}" if line else type(err).__name__


def run(fn: Callable[..., Any], *args: Any, call: str, errors: Sequence[ErrorHint] = ()) -> Any:
    """Return ``fn(*args)``; what the learner's code raises becomes ``Wrong``: a one-line summary and a hint.

    ``errors`` pairs an exception type, or a piece of the error message, with the hint for it.
    """
    try:
        return fn(*args)
    except Wrong:
        raise
    except Exception as err:  # noqa: BLE001 - the learner's code failed: that is feedback
        text = f"{type(err).__name__}: {err}"
        hint = next((h for key, h in errors if (key in text if isinstance(key, str) else isinstance(err, key))), "")
        wrong = Wrong(sentences(f"{call} raised {summary(err)}", hint))
        wrong.raised, wrong.hinted = type(err), bool(hint)  # for function_exercise: a mistake that raises alike
        raise wrong from None


def sentences(*parts: str) -> str:
    """Return the non-empty ``parts`` joined with spaces, each ending in a full stop (or ? or !)."""
    parts = tuple(p.strip().rstrip(":") for p in parts if p.strip())
    return " ".join(p if p.endswith((".", "?", "!")) else p + "." for p in parts)


def short(value: Any) -> str:
    """Return a short description of ``value`` for a message: small values in full, big ones by size."""
    if isinstance(value, torch.Tensor):
        small = value.dim() <= 1 and value.numel() <= 6
        return " ".join(repr(value).split()) if small else f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, torch.nn.Module):
        return f"<{type(value).__name__}>"
    if isinstance(value, float):
        return repr(value) if len(repr(value)) <= 8 else f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        if len(value) > 6:
            return f"<{len(value)} values>"
        inner = ", ".join(short(v) for v in value) + ("," if isinstance(value, tuple) and len(value) == 1 else "")
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if callable(value) and hasattr(value, "__name__"):
        return value.__name__
    if type(value).__repr__ is object.__repr__:
        return f"<{type(value).__name__}>"
    text = repr(value)
    if isinstance(value, dict) and len(text) > 80:
        return f"<dict with keys {list(value)[:4]}>"
    return text if len(text) <= 80 else text[:77] + "..."


def differs(got: Any, expected: Any, rtol: float = 1e-5, atol: float = 1e-6) -> str | None:
    """Return None when ``got`` matches ``expected`` (tensors and floats within tolerance), else what is off."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{short(got)}, not a tensor"
        if got.shape != expected.shape:
            return f"shape {tuple(got.shape)} instead of {tuple(expected.shape)}"
        if got.dtype != expected.dtype and not (got.is_floating_point() and expected.is_floating_point()):
            return f"dtype {got.dtype} instead of {expected.dtype}"  # float32 for float64 is fine; int8 is not
        error = (got.detach().double() - expected.double()).abs()
        ok = torch.allclose(got.detach().double(), expected.double(), rtol=rtol, atol=atol)
        return None if ok else f"values off by up to {error.max().item():.3g}"
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return f"{short(got)}, not a dict"
        if set(got) != set(expected):
            return f"keys {sorted(map(str, got))} instead of {sorted(map(str, expected))}"
        return next((f"{p} for {k!r}" for k in expected if (p := differs(got[k], expected[k], rtol, atol))), None)
    if isinstance(expected, (tuple, list)):
        if isinstance(got, (tuple, list)) and len(got) != len(expected) and len(expected) <= 6:
            return f"{short(got)} instead of {short(expected)}"  # both short: the expected items say more than a count
        if not isinstance(got, (tuple, list)) or len(got) != len(expected):
            n = len(expected)
            return f"{short(got)}, not a {type(expected).__name__} of {n} item{'' if n == 1 else 's'}"
        return next((f"{p} in item {i}" for i, (g, e) in enumerate(zip(got, expected))
                     if (p := differs(g, e, rtol, atol))), None)
    if isinstance(expected, numbers.Real) and not isinstance(expected, bool):
        if got is None:  # a missing answer, not a wrong type: say what was expected (None may be right elsewhere)
            return f"None instead of {expected!r}"
        whole = isinstance(expected, numbers.Integral)
        if isinstance(got, bool) or not isinstance(got, numbers.Integral if whole else numbers.Real):
            return f"{short(got)}, not {'a whole number (an int)' if whole else 'a number'}"
        same = got == expected if whole else math.isclose(got, expected, rel_tol=rtol, abs_tol=atol)
        # the expected number in full: a rounded one would be the next wrong answer a learner types in
        return None if same else f"{short(got)} instead of {expected!r}"
    try:
        same = got is expected or (type(got) is type(expected) and bool(got == expected))
    except Exception:  # noqa: BLE001 - an object that cannot be compared is not the expected one
        same = False
    return None if same else f"{short(got)} instead of {short(expected)}"


def _fresh(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Return copies of the mutable arguments (tensors, containers, modules), so no call sees another's changes."""
    return tuple(copy.deepcopy(a) if isinstance(a, (torch.Tensor, torch.nn.Module, list, dict, tuple)) else a
                 for a in args)


# --- Checkers built from a table: cases, what each must give, and mistakes with their hints.

@dataclass(frozen=True)
class Raises:
    """An expected outcome: the call raises ``error`` (raising it is the right answer)."""

    error: type[BaseException]

    def __str__(self) -> str:
        return f"raising {self.error.__name__}"


@dataclass(frozen=True)
class Case:
    """The arguments of one call and what it must give: a value, or ``Raises(SomeError)``."""

    args: tuple[Any, ...]
    expected: Any


def case(*args: Any, gives: Any) -> Case:
    """Return a ``Case``: calling the answer with ``args`` must give ``gives`` (a value or ``Raises(...)``)."""
    return Case(args, gives)


def _outcome(fn: Callable[..., Any], args: tuple[Any, ...], expected: Any, **run_args: Any) -> Any:
    """Return ``fn(*args)``, or ``expected`` itself when that is ``Raises(E)`` and the call raises an E."""
    if not isinstance(expected, Raises):
        return run(fn, *args, **run_args)

    def catching(*a: Any) -> Any:
        try:
            return fn(*a)
        except expected.error:
            return expected

    return run(catching, *args, **run_args)


def function_exercise(name: str, *, solution: Callable[..., Any],
                      cases: Callable[[], Iterable[Case | tuple[Any, ...]]], success: str,
                      reference: Callable[..., Any] | None = None,
                      mistakes: Callable[[], list[Mistake]] = list, wrong: Callable[[], list[Mistake]] = list,
                      otherwise: str | Callable[[Any], str] = "", errors: Sequence[ErrorHint] = (),
                      prepare: Callable[[Any], Callable[..., Any]] = lambda answer: answer,
                      normalise: Callable[[Any], Any] = lambda result: result,
                      after: Callable[[Any], None] = lambda answer: None,
                      passed_as: Callable[[Callable[..., Any]], Any] = lambda fn: fn,
                      tol: tuple[float, float] = (1e-5, 1e-6)) -> None:
    """Register exercise ``name``: a function like ``solution`` that must give the expected result on every case.

    - ``solution`` is the reference answer, a function as a learner would write it (its signature is
      how the checker names the call); the learner passes ``passed_as(solution)`` (say,
      ``torch.compile(rms_norm)``). It is never what the answers are compared with.
    - ``cases`` returns ``Case``s, whose expected results are written out (``Raises(E)``: raising E is
      the answer), or argument tuples, whose expected results ``reference`` computes: a second,
      independent implementation (torch's own, a loop, a library). Tensors and floats are compared
      with ``tol`` = (rtol, atol).
    - ``mistakes`` returns (mistaken function, hint) pairs: a wrong result equal to a mistake's result
      gets its hint, any other wrong result ``otherwise`` (text, or a function of the answer).
    - The tests feed the mistakes, ``wrong``'s (answer, hint) pairs, None, a string and a tensor to the checker.
    - ``errors`` pairs what the learner's function may raise with hints (see ``run``).
    - ``prepare`` turns an answer (or a mistake) into what is called and may raise ``Wrong``;
      ``normalise`` maps every result (and computed or written expected value) before comparing;
      ``after`` checks how a right answer computes (compiled, one graph, no loop, exportable) and
      raises ``Wrong`` if it does not.
    """
    if reference is solution:
        raise ValueError(f"{name}: the reference must be independent of the solution it checks")
    usage = usage_of(solution)
    func_name = solution.__name__

    def expected_of(item: Case | tuple[Any, ...]) -> tuple[tuple[Any, ...], Any]:
        if isinstance(item, Case):
            return item.args, item.expected if isinstance(item.expected, Raises) else normalise(item.expected)
        if reference is None:
            raise TypeError(f"{name}: a case without its expected result needs a reference")
        return item, normalise(reference(*_fresh(item)))

    def gives(mistake: Callable[..., Any], args: tuple[Any, ...], expected: Any, got: Any) -> bool:
        try:
            outcome = _outcome(prepare(mistake), _fresh(args), expected, call="")
            return differs(got, outcome if outcome is expected else normalise(outcome), *tol) is None
        except Exception:  # noqa: BLE001 - a mistake that fails on this case is not the one made
            return False

    def raises_alike(mistake: Callable[..., Any], args: tuple[Any, ...], expected: Any, raised: type) -> bool:
        try:
            _outcome(prepare(mistake), _fresh(args), expected, call="")
        except Wrong as err:
            return getattr(err, "raised", None) is raised
        except Exception:  # noqa: BLE001 - prepare itself failed: not this mistake
            return False
        return False

    def checker(answer: Any) -> str:
        expect_function(answer, usage)
        fn = prepare(answer)
        for item in cases():
            args, expected = expected_of(item)
            call = f"{func_name}({', '.join(short(a) for a in args)})"
            mine = _fresh(args)
            try:
                got = _outcome(fn, mine, expected, call=call, errors=errors)
            except Wrong as err:  # the answer raised: a mistake that raises the same way has the hint
                raised = getattr(err, "raised", None)
                if raised is None or err.hinted:
                    raise
                hint = next((h for m, h in mistakes() if raises_alike(m, args, expected, raised)), None)
                raise Wrong(sentences(str(err), hint or "")) from None
            got = got if got is expected else normalise(got)
            if any(isinstance(a, torch.Tensor) and not torch.equal(a, b) for a, b in zip(mine, args)):
                raise Wrong(f"{call} changed its input in place; compute a new tensor instead.")
            problem = (f"{short(got)} instead of {expected}" if isinstance(expected, Raises) and got is not expected
                       else differs(got, expected, *tol))
            if problem:
                hint = next((h for m, h in mistakes() if gives(m, args, expected, got)), None)
                hint = hint if hint is not None else otherwise(answer) if callable(otherwise) else otherwise
                raise Wrong(sentences(f"{call} returned {problem}", hint))
        after(answer)
        return success

    generic = [(None, "expected a function"), (func_name, "expected a function"), (torch.ones(3), "pass the function itself")]
    exercise(name, lambda: passed_as(solution), lambda: [*mistakes(), *wrong(), *generic])(checker)


def capture(fn: Callable[..., Any], *args: Any) -> list[torch.fx.GraphModule]:
    """Return the graphs, sub-graphs included, that Dynamo captures from ``fn(*args)`` with fullgraph=True.

    Raises what Dynamo raises when ``fn`` is not one graph; nothing is compiled to code.
    """
    graphs: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        graphs.append(gm)
        return gm.forward

    torch.compile(fn, backend=keep, fullgraph=True)(*args)
    return [m for gm in graphs for m in gm.modules() if isinstance(m, torch.fx.GraphModule)]


class OpCounter(TorchDispatchMode):
    """Counts the ATen operations dispatched while it is active (in ``ops``)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops += 1
        return func(*args, **(kwargs or {}))


def nodes(graphs: list[torch.fx.GraphModule]) -> Iterator[torch.fx.Node]:
    """Return an iterator over every node of ``graphs``."""
    return (node for gm in graphs for node in gm.graph.nodes)


def clean_dynamo(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Return ``fn`` wrapped so that each call starts and ends with a reset Dynamo.

    For answers that compile the checker's functions themselves: no call reuses what an earlier one
    compiled, and repeated checks never reach the recompile limit.
    """
    def call(*args: Any) -> Any:
        torch._dynamo.reset()
        try:
            return fn(*args)
        finally:
            torch._dynamo.reset()

    return call
