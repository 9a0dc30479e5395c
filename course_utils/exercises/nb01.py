"""Exercises of notebook 01: bisecting with backends, timing training honestly, cache directories."""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .framework import Wrong, exercise, expect_function

# ---------------------------------------------------------------------------
# 01.first_bad_backend: compile with each backend in turn; return the first that differs.
# ---------------------------------------------------------------------------

BISECT_RTOL, BISECT_ATOL = 1e-4, 1e-5


def _passthrough(gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
    """A correct backend: run the captured graph unchanged."""
    return gm.forward


def _also_passthrough(gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
    """Another correct backend (a distinct object, so answers cannot rely on identity tricks)."""
    return gm.forward


def _shifting(amount: float) -> Callable[..., Any]:
    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            out = gm(*args)
            return type(out)(o + amount if isinstance(o, torch.Tensor) else o for o in out)

        return run

    backend.__name__ = f"shift_by_{amount:g}"
    return backend


_off_by_one = _shifting(1.0)          # clearly wrong
_off_by_half = _shifting(0.5)         # clearly wrong, a second culprit
_rounding_noise = _shifting(1e-7)     # differs, but well inside the tolerance: counts as agreeing


def _bisect_fn(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2 + x


#: (backends in order, index of the expected answer or None)
BISECT_CASES: tuple[tuple[tuple[Callable[..., Any], ...], int | None], ...] = (
    ((_passthrough, _also_passthrough, _off_by_one), 2),
    ((_passthrough, _rounding_noise, _off_by_one, _also_passthrough), 2),
    ((_passthrough, _off_by_half, _off_by_one), 1),
    ((_off_by_one, _passthrough), 0),
    ((_passthrough, _rounding_noise), None),
)


def _name(backend: Any) -> str:
    return getattr(backend, "__name__", repr(backend))


def _first_bad_solution() -> Callable[..., Any]:
    def first_bad_backend(fn, args, backends):
        expected = fn(*args)
        for backend in backends:
            out = torch.compile(fn, backend=backend)(*args)
            if not torch.allclose(out, expected, rtol=1e-4, atol=1e-5):
                return backend
        return None

    return first_bad_backend


def _first_bad_wrong() -> list[Any]:
    def last_backend(fn, args, backends):  # blames the last stage without testing
        return backends[-1]

    def exact_compare(fn, args, backends):  # no tolerance: rounding noise counts as a failure
        expected = fn(*args)
        for backend in backends:
            if not torch.equal(torch.compile(fn, backend=backend)(*args), expected):
                return backend
        return None

    def first_good(fn, args, backends):  # returns the first backend that *agrees*
        expected = fn(*args)
        for backend in backends:
            if torch.allclose(torch.compile(fn, backend=backend)(*args), expected, rtol=1e-4, atol=1e-5):
                return backend
        return None

    def last_bad(fn, args, backends):  # keeps looking after the first failure
        expected, bad = fn(*args), None
        for backend in backends:
            if not torch.allclose(torch.compile(fn, backend=backend)(*args), expected, rtol=1e-4, atol=1e-5):
                bad = backend
        return bad

    return [last_backend, exact_compare, first_good, last_bad, "inductor", None]


@exercise(
    "01.first_bad_backend",
    prompt="write first_bad_backend(fn, args, backends) that compiles fn with each backend in order and "
           "returns the first backend whose output differs from eager fn(*args) "
           "(torch.allclose with rtol=1e-4, atol=1e-5), or None if all agree.",
    solution=_first_bad_solution,
    wrong_answers=_first_bad_wrong,
)
def check_first_bad_backend(answer: Any) -> str:
    """Accept a function that returns the first backend whose result differs from eager."""
    expect_function(answer, "first_bad_backend(fn, args, backends)")
    x = torch.linspace(-2.0, 2.0, 16)
    for backends, expected_index in BISECT_CASES:
        torch._dynamo.reset()  # each case starts clean, whatever the answer does
        try:
            got = answer(_bisect_fn, (x,), list(backends))
        finally:
            torch._dynamo.reset()
        names = [_name(b) for b in backends]
        expected = None if expected_index is None else backends[expected_index]
        if expected is None:
            if got is not None:
                if got is _rounding_noise:
                    raise Wrong(f"with backends {names} you returned {_name(got)}, whose output differs from "
                                "eager by 1e-7 only: compare with a tolerance (torch.allclose, rtol=1e-4, "
                                "atol=1e-5), not exactly. All backends agree here: return None.")
                raise Wrong(f"with backends {names} every backend agrees with eager, so return None; "
                            f"you returned {_name(got)}.")
            continue
        if got is expected:
            continue
        if isinstance(got, str) and got == _name(expected):
            raise Wrong("you returned the backend's name; return the backend object itself (the element of "
                        "`backends` you compiled with).")
        position = next((i for i, b in enumerate(backends) if b is got), None)
        if got is _rounding_noise:
            hint = ("its output differs from eager by 1e-7 only, which is rounding, not a bug: compare with "
                    "torch.allclose(out, expected, rtol=1e-4, atol=1e-5).")
        elif got is None:
            hint = "one of the backends does give a different result: compare each one with eager."
        elif position is not None and position > expected_index:
            hint = "that one is also wrong, but an earlier backend already differs: stop at the first."
        elif position is not None:
            hint = "that backend agrees with eager; return the first one that does NOT."
        else:
            hint = "return one of the backends you were given."
        raise Wrong(f"with backends {names} the first that differs is {_name(expected)}; "
                    f"you returned {_name(got)}. {hint}")
    return "you find the first backend that breaks a result, and ignore rounding noise."


# ---------------------------------------------------------------------------
# 01.steady_speedup: speed-up from epoch times, leaving the first epoch out, with medians.
# ---------------------------------------------------------------------------

#: (eager epoch seconds, compiled epoch seconds) -> expected speed-up
SPEEDUP_CASES: tuple[tuple[tuple[float, ...], tuple[float, ...]], ...] = (
    ((2.0, 1.0, 1.0), (9.0, 0.5, 0.6)),                  # 1.0 / 0.55
    ((5.0, 1.0, 1.0, 4.0), (20.0, 0.5, 0.5, 0.5)),       # a slow epoch the median ignores: 2.0
    ((1.2, 0.9, 1.1, 1.0, 1.3), (30.0, 1.0, 0.95, 1.05, 1.1)),
    ((3.0, 2.0), (12.0, 4.0)),                            # compiled slower: 0.5
)


def _speedup_reference(eager: Sequence[float], compiled: Sequence[float]) -> float:
    return statistics.median(eager[1:]) / statistics.median(compiled[1:])


def _speedup_solution() -> Callable[[list[float], list[float]], float]:
    def steady_speedup(eager_epoch_s, compiled_epoch_s):
        # The first epoch of each run carries warm-up (and, for a compiled model, maybe the compile).
        return statistics.median(eager_epoch_s[1:]) / statistics.median(compiled_epoch_s[1:])

    return steady_speedup


def _speedup_wrong() -> list[Any]:
    def with_first(eager, compiled):
        return statistics.median(eager) / statistics.median(compiled)

    def with_means(eager, compiled):
        return statistics.mean(eager[1:]) / statistics.mean(compiled[1:])

    def inverted(eager, compiled):
        return statistics.median(compiled[1:]) / statistics.median(eager[1:])

    def totals(eager, compiled):
        return sum(eager) / sum(compiled)

    return [with_first, with_means, inverted, totals, 2.0, None]


@exercise(
    "01.steady_speedup",
    prompt="write steady_speedup(eager_epoch_s, compiled_epoch_s): leave out each run's first epoch, take "
           "the median of the remaining epoch times, and return eager median / compiled median.",
    solution=_speedup_solution,
    wrong_answers=_speedup_wrong,
)
def check_steady_speedup(answer: Any) -> str:
    """Accept a function computing median(eager[1:]) / median(compiled[1:])."""
    expect_function(answer, "steady_speedup(eager_epoch_s, compiled_epoch_s)")
    for eager, compiled in SPEEDUP_CASES:
        expected = _speedup_reference(eager, compiled)
        call = f"steady_speedup({list(eager)}, {list(compiled)})"
        got = answer(list(eager), list(compiled))
        if isinstance(got, bool) or not isinstance(got, (int, float)) or not math.isfinite(got):
            raise Wrong(f"{call} returned {got!r}; return the speed-up as a number.")
        if math.isclose(got, expected, rel_tol=1e-6):
            continue
        if math.isclose(got, 1 / expected, rel_tol=1e-6):
            hint = "you divided compiled by eager; the speed-up is eager time / compiled time (>1 means faster)."
        elif math.isclose(got, statistics.median(eager) / statistics.median(compiled), rel_tol=1e-6):
            hint = "leave out each run's first epoch: it carries warm-up, and for a compiled model the compile."
        elif math.isclose(got, statistics.mean(eager[1:]) / statistics.mean(compiled[1:]), rel_tol=1e-6):
            hint = "use the median, not the mean: one slow epoch on a busy machine should not move the result."
        else:
            hint = "median of eager_epoch_s[1:] divided by median of compiled_epoch_s[1:]."
        raise Wrong(f"{call} returned {got:.4g}, expected {expected:.4g}. Hint: {hint}")
    return "median of the steady epochs, first epoch left out: the same way section 6 measured it."


# ---------------------------------------------------------------------------
# 01.cache_env: the environment for a subprocess with its own Inductor cache directory.
# ---------------------------------------------------------------------------

CACHE_VAR = "TORCHINDUCTOR_CACHE_DIR"


def _cache_env_solution() -> Callable[[Any], dict[str, str]]:
    def cache_env(cache_dir):
        return {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)}

    return cache_env


def _cache_env_wrong() -> list[Any]:
    def mutates(cache_dir):  # changes this process's environment too
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
        return dict(os.environ)

    def only_the_variable(cache_dir):  # the subprocess would lose PATH, HOME, ...
        return {"TORCHINDUCTOR_CACHE_DIR": str(cache_dir)}

    def path_value(cache_dir):  # subprocess needs strings
        return {**os.environ, "TORCHINDUCTOR_CACHE_DIR": Path(cache_dir)}

    def wrong_name(cache_dir):
        return {**os.environ, "TORCH_CACHE_DIR": str(cache_dir)}

    return [mutates, only_the_variable, path_value, wrong_name, "TORCHINDUCTOR_CACHE_DIR", None]


@exercise(
    "01.cache_env",
    prompt="write cache_env(cache_dir) returning a copy of os.environ with TORCHINDUCTOR_CACHE_DIR set to "
           "str(cache_dir), without changing os.environ.",
    solution=_cache_env_solution,
    wrong_answers=_cache_env_wrong,
)
def check_cache_env(answer: Any) -> str:
    """Accept a function returning a copied environment with the cache variable set."""
    expect_function(answer, "cache_env(cache_dir)")
    before = dict(os.environ)
    target = Path("/tmp") / "course_nb01_check" / "inductor cache"
    try:
        for cache_dir in (target, str(target) + "_str"):
            env = answer(cache_dir)
            changed = dict(os.environ) != before
            if changed:
                raise Wrong("your function changed os.environ (this process's own environment); build a new "
                            "dict instead, e.g. {**os.environ, 'TORCHINDUCTOR_CACHE_DIR': ...}.")
            if not isinstance(env, Mapping) or env is os.environ:
                raise Wrong(f"return a new dict (got {type(env).__name__}).")
            new_keys = [k for k in env if k not in before]
            if env.get(CACHE_VAR) in (None, before.get(CACHE_VAR)) and str(cache_dir) != before.get(CACHE_VAR):
                raise Wrong(f"the variable Inductor reads is {CACHE_VAR}"
                            + (f"; you set {new_keys}." if new_keys else "; your dict does not set it."))
            if not isinstance(env[CACHE_VAR], str):
                raise Wrong(f"{CACHE_VAR} is a {type(env[CACHE_VAR]).__name__}; subprocess needs strings: "
                            "use str(cache_dir).")
            if env[CACHE_VAR] != str(cache_dir):
                raise Wrong(f"{CACHE_VAR} should be {str(cache_dir)!r}, got {env[CACHE_VAR]!r}.")
            missing = [k for k in before if k != CACHE_VAR and env.get(k) != before[k]]
            if missing:
                raise Wrong(f"{len(missing)} variables of the current environment (e.g. {missing[0]}) are missing "
                            "or changed; start from a copy of os.environ so the subprocess still finds "
                            "Python, its libraries and your settings.")
    finally:
        for key in [k for k in os.environ if k not in before]:  # undo a wrong answer's side effects
            del os.environ[key]
        for key, value in before.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
    return "a copied environment with its own cache directory, and this process left untouched."
