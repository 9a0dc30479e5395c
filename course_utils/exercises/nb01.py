"""Exercises of notebook 01: bisecting with backends, timing training honestly, cache directories."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from .framework import (Mistake, Wrong, case, clean_dynamo, exercise, expect_function, function_exercise, run,
                        usage_of)

# --- 01.first_bad_backend: compile with each backend in turn; return the first that differs.


def _passthrough(gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
    """A correct backend: run the captured graph unchanged."""
    return gm.forward


def _also_passthrough(gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
    """Another correct backend (a distinct object, so answers cannot rely on identity tricks)."""
    return gm.forward


def _shifting(amount: float) -> Callable[..., Any]:
    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        def shifted(*args: Any) -> Any:
            out = gm(*args)
            return type(out)(o + amount if isinstance(o, torch.Tensor) else o for o in out)

        return shifted

    backend.__name__ = f"shift_by_{amount:g}"
    return backend


_off_by_one, _off_by_half = _shifting(1.0), _shifting(0.5)   # clearly wrong
_rounding_noise = _shifting(1e-7)    # differs, but well inside the tolerance: counts as agreeing


def _bisect_fn(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2 + x


def _bisect_cases() -> list[Any]:
    x = torch.linspace(-2.0, 2.0, 16)
    return [case(_bisect_fn, (x,), backends, gives=first_bad) for backends, first_bad in (
        ([_passthrough, _also_passthrough, _off_by_one], _off_by_one),                     # the last one
        ([_passthrough, _rounding_noise, _off_by_one, _also_passthrough], _off_by_one),    # noise is not a failure
        ([_passthrough, _off_by_half, _off_by_one], _off_by_half),                         # stop at the first
        ([_off_by_one, _passthrough], _off_by_one),
        ([_passthrough, _rounding_noise], None))]                                          # all agree: None


def first_bad_backend(fn: Callable[..., torch.Tensor], args: tuple[Any, ...], backends: list[Any]) -> Any:
    """Return the first backend whose compiled fn(*args) differs from eager, or None."""
    expected = fn(*args)
    for backend in backends:
        out = torch.compile(fn, backend=backend)(*args)
        if not torch.allclose(out, expected, rtol=1e-4, atol=1e-5):
            return backend
    return None


def _first_bad_mistakes() -> list[Mistake]:
    def differ(fn, args, backend):
        return not torch.allclose(torch.compile(fn, backend=backend)(*args), fn(*args), rtol=1e-4, atol=1e-5)

    def exact_compare(fn, args, backends):  # no tolerance: rounding noise counts as a failure
        return next((b for b in backends if not torch.equal(torch.compile(fn, backend=b)(*args), fn(*args))), None)

    def first_good(fn, args, backends):  # returns the first backend that *agrees*
        return next((b for b in backends if not differ(fn, args, b)), None)

    def last_bad(fn, args, backends):  # keeps looking after the first failure
        return ([None] + [b for b in backends if differ(fn, args, b)])[-1]

    def last_backend(fn, args, backends):  # blames the last stage without testing
        return backends[-1]

    def name_only(fn, args, backends):
        return getattr(first_bad_backend(fn, args, backends), "__name__", None)

    return [(exact_compare, "Compare with a tolerance (torch.allclose, rtol=1e-4, atol=1e-5), not exactly: a "
                            "difference of 1e-7 is rounding, not a bug."),
            (first_good, "That backend agrees with eager; return the first one that does NOT agree."),
            (last_bad, "That one is wrong too, but an earlier backend already differs: stop at the first."),
            (last_backend, "Test, don't guess: compile fn with each backend in order and compare its output "
                           "with eager fn(*args)."),
            (name_only, "Return the backend object itself (the element of backends you compiled with), not its "
                        "name.")]


function_exercise(
    "01.first_bad_backend",
    solution=first_bad_backend,
    cases=_bisect_cases,
    mistakes=_first_bad_mistakes,
    prepare=clean_dynamo,
    otherwise="Compile fn with each backend in order, compare with eager fn(*args) using torch.allclose "
              "(rtol=1e-4, atol=1e-5), and return the first backend that differs, or None if all agree.",
    success="you find the first backend that breaks a result, and ignore rounding noise.",
)

# --- 01.steady_speedup: speed-up from epoch times, leaving the first epoch out, with medians.


def steady_speedup(eager_epoch_s: list[float], compiled_epoch_s: list[float]) -> float:
    """Return the eager / compiled ratio of median epoch times, first epochs left out."""
    # The first epoch of each run carries warm-up (and, for a compiled model, maybe the compile).
    return statistics.median(eager_epoch_s[1:]) / statistics.median(compiled_epoch_s[1:])


def _speedup_mistakes() -> list[Mistake]:
    return [
        (lambda e, c: statistics.median(e) / statistics.median(c),
         "Leave out each run's first epoch: it carries warm-up, and for a compiled model the compile."),
        (lambda e, c: statistics.mean(e[1:]) / statistics.mean(c[1:]),
         "Use the median, not the mean: one slow epoch on a busy machine should not move the result."),
        (lambda e, c: statistics.median(c[1:]) / statistics.median(e[1:]),
         "You divided compiled by eager; the speed-up is eager time / compiled time (>1 means faster)."),
        (lambda e, c: sum(e) / sum(c), "Totals include the first epoch and every slow one: take the medians of "
                                       "the epochs after the first."),
    ]


function_exercise(
    "01.steady_speedup",
    solution=steady_speedup,
    cases=lambda: [case([2.0, 1.0, 1.0], [9.0, 0.5, 0.6], gives=1.0 / 0.55),      # medians 1.0 and 0.55
                   case([5.0, 1.0, 1.0, 4.0], [20.0, 0.5, 0.5, 0.5], gives=2.0),  # the median ignores the 4.0
                   case([1.2, 0.9, 1.1, 1.0, 1.3], [30.0, 1.0, 0.95, 1.05, 1.1],
                        gives=1.05 / 1.025),                                      # even counts: middle pairs' means
                   case([3.0, 2.0], [12.0, 4.0], gives=0.5)],                     # compiled slower: 0.5
    mistakes=_speedup_mistakes,
    otherwise="Leave out each run's first epoch (it holds the compile) and compare the medians of the rest, eager "
              "over compiled, the way section 6 did.",
    tol=(1e-6, 1e-9),
    success="median of the steady epochs, first epoch left out: the same way section 6 measured it.",
)

# --- 01.cache_env: the environment for a subprocess with its own Inductor cache directory.

CACHE_VAR = "TORCHINDUCTOR_CACHE_DIR"


def cache_env(cache_dir: str | os.PathLike) -> dict[str, str]:
    """Return a copy of the environment whose Inductor cache directory is cache_dir."""
    return {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)}


def _cache_env_wrong() -> list[Mistake]:
    def mutates(cache_dir):  # changes this process's environment too
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
        return dict(os.environ)

    return [(mutates, "changed os.environ"),
            (lambda d: {CACHE_VAR: str(d)}, "start from a copy of os.environ"),
            (lambda d: {**os.environ, CACHE_VAR: Path(d)}, "subprocess needs strings: use str(cache_dir)"),
            (lambda d: {**os.environ, "TORCH_CACHE_DIR": str(d)}, "you set ['TORCH_CACHE_DIR']"),
            (lambda d: os.environ, "return a new dict"),
            (CACHE_VAR, "expected a function"), (None, "expected a function")]


def _check_env(answer: Any, cache_dir: Any, before: dict[str, str]) -> None:
    env = run(answer, cache_dir, call=f"cache_env({cache_dir!r})")
    if dict(os.environ) != before:
        raise Wrong("your function changed os.environ (this process's own environment); build a new dict "
                    "instead, e.g. {**os.environ, 'TORCHINDUCTOR_CACHE_DIR': ...}.")
    if not isinstance(env, Mapping) or env is os.environ:
        raise Wrong(f"return a new dict (got {type(env).__name__}).")
    new_keys = [k for k in env if k not in before]
    if CACHE_VAR not in env or (env[CACHE_VAR] == before.get(CACHE_VAR) != str(cache_dir)):
        raise Wrong(f"the variable Inductor reads is {CACHE_VAR}"
                    + (f"; you set {new_keys}." if new_keys else "; your dict does not set it."))
    if env[CACHE_VAR] != str(cache_dir):
        raise Wrong(f"{CACHE_VAR} should be {str(cache_dir)!r}, got {env[CACHE_VAR]!r}"
                    + ("; subprocess needs strings: use str(cache_dir)." if not isinstance(env[CACHE_VAR], str) else "."))
    missing = [k for k in before if k != CACHE_VAR and env.get(k) != before[k]]
    if missing:
        raise Wrong(f"{len(missing)} variables of the current environment (e.g. {missing[0]}) are missing or "
                    "changed; start from a copy of os.environ so the subprocess still finds Python, its "
                    "libraries and your settings.")


@exercise(
    "01.cache_env",
    solution=lambda: cache_env,
    wrong_answers=_cache_env_wrong,
)
def check_cache_env(answer: Any) -> str:
    """Return the success message for a function returning a copied environment with the cache variable set."""
    expect_function(answer, usage_of(cache_env))
    before = dict(os.environ)
    target = Path("/tmp") / "course_nb01_check" / "inductor cache"
    try:
        for cache_dir in (target, str(target) + "_str"):
            _check_env(answer, cache_dir, before)
    finally:
        for key in [k for k in os.environ if k not in before]:  # undo a wrong answer's side effects
            del os.environ[key]
        os.environ.update({k: v for k, v in before.items() if os.environ.get(k) != v})
    return "a copied environment with its own cache directory, and this process left untouched."
