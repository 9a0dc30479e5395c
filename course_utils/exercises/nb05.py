"""Exercises of notebook 05: per-sample gradients, picking a Jacobian mode, ensembles with vmap."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, jacfwd, jacrev, stack_module_state, vmap

from .framework import Wrong, exercise, expect_function


def _small_mlp(seed: int, n_in: int = 8, hidden: int = 16, n_out: int = 3) -> nn.Module:
    with torch.random.fork_rng(devices=[]):  # leave the learner's random stream alone
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, n_out))


class _CallCounter:
    """Counts forward calls of a module through a forward pre-hook (removed with ``close``)."""

    def __init__(self, module: nn.Module) -> None:
        self.calls = 0
        self._handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, module: nn.Module, args: Any) -> None:
        self.calls += 1

    def close(self) -> None:
        self._handle.remove()


# ---------------------------------------------------------------------------
# 05.per_sample_grads: vmap(grad(...)) instead of a loop over the batch.
# ---------------------------------------------------------------------------


def _loop_per_sample_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    names = [n for n, _ in model.named_parameters()]
    params = list(model.parameters())
    per_sample = []
    for i in range(x.shape[0]):
        loss = F.cross_entropy(model(x[i]), y[i])
        per_sample.append(torch.autograd.grad(loss, params))
    return {n: torch.stack(gs) for n, gs in zip(names, zip(*per_sample))}


def _psg_solution() -> Callable[[nn.Module, torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]:
    def per_sample_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        params = {name: p.detach() for name, p in model.named_parameters()}

        def loss_one(params: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(functional_call(model, params, (xi,)), yi)

        return vmap(grad(loss_one), in_dims=(None, 0, 0))(params, x, y)

    return per_sample_grads


def _psg_wrong() -> list[Any]:
    def looped(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return _loop_per_sample_grads(model, x, y)  # right values, B forward passes

    def batch_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        params = {name: p.detach() for name, p in model.named_parameters()}

        def loss(params: dict[str, torch.Tensor]) -> torch.Tensor:
            return F.cross_entropy(functional_call(model, params, (x,)), y)

        return grad(loss)(params)  # one gradient for the whole batch

    def scaled_by_batch(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        params = {name: p.detach() for name, p in model.named_parameters()}
        n = x.shape[0]

        def loss_one(params: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(functional_call(model, params, (xi,)), yi) / n

        return vmap(grad(loss_one), in_dims=(None, 0, 0))(params, x, y)

    def stub(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {}

    return [looped, batch_gradient, scaled_by_batch, stub, None, {"0.weight": torch.zeros(3)}]


@exercise(
    "05.per_sample_grads",
    prompt="write per_sample_grads(model, x, y) that returns {parameter name: tensor of shape "
           "(batch, *parameter.shape)} holding the gradient of each sample's cross-entropy loss, "
           "computed with vmap(grad(...)) and functional_call (no Python loop over the batch).",
    solution=_psg_solution,
    wrong_answers=_psg_wrong,
)
def check_per_sample_grads(answer: Any) -> str:
    """Accept a vmap-based function returning per-sample gradients equal to the loop's."""
    if isinstance(answer, dict):
        raise Wrong("you passed a dict of results; pass the function per_sample_grads itself.")
    expect_function(answer, "per_sample_grads(model, x, y)")
    model = _small_mlp(0)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 8, generator=gen)
    y = torch.randint(0, 3, (6,), generator=gen)
    expected = _loop_per_sample_grads(model, x, y)
    counter = _CallCounter(model)
    try:
        got = answer(model, x, y)
    finally:
        counter.close()
    if not isinstance(got, dict):
        raise Wrong(f"your function returned {type(got).__name__}; return a dict "
                    "{parameter name: per-sample gradients}, as vmap(grad(loss_one)) does "
                    "when the parameters are passed as a dict.")
    if not got:
        raise Wrong("your function returned an empty dict: still the stub? Build "
                    "params = {name: p.detach() for name, p in model.named_parameters()}, a "
                    "one-sample loss with functional_call, and vmap(grad(loss_one), in_dims=(None, 0, 0)).")
    if set(got) != set(expected):
        raise Wrong(f"the keys should be the parameter names {sorted(expected)}, got {sorted(got)}.")
    for name, ref in expected.items():
        g = got[name]
        if not isinstance(g, torch.Tensor):
            raise Wrong(f"{name!r} maps to {type(g).__name__}; expected a tensor.")
        if tuple(g.shape) == tuple(ref.shape[1:]):
            raise Wrong(f"{name!r} has shape {tuple(g.shape)}, the parameter's own shape: that is one "
                        "gradient for the whole batch. Per-sample gradients have a leading batch "
                        f"dimension, {tuple(ref.shape)}: vmap over the samples, grad inside.")
        if g.shape != ref.shape:
            raise Wrong(f"{name!r} has shape {tuple(g.shape)}, expected {tuple(ref.shape)} "
                        "(batch first, then the parameter's shape).")
        if not torch.allclose(g.detach(), ref, rtol=1e-4, atol=1e-6):
            if torch.allclose(g.detach() * x.shape[0], ref, rtol=1e-4, atol=1e-6):
                raise Wrong(f"{name!r} is off by a factor of the batch size: each sample's loss is "
                            "its own cross-entropy, not divided by the batch size.")
            raise Wrong(f"{name!r} differs from the per-sample gradients of a loop over the batch. "
                        "Check that each sample gets F.cross_entropy(logits, label) on its own.")
    if counter.calls >= x.shape[0]:
        raise Wrong(f"the values are right, but the model ran {counter.calls} times for "
                    f"{x.shape[0]} samples: that is a loop. Use vmap(grad(loss_one)) so the whole "
                    "batch goes through the model in one call.")
    return "your per-sample gradients match a loop over the batch, computed in one vmapped call."


# ---------------------------------------------------------------------------
# 05.jac_mode: forward or reverse mode for a Jacobian of a given shape?
# ---------------------------------------------------------------------------

#: (n_in, n_out) -> the transform that should win; None where either is fine (square).
JAC_CASES: tuple[tuple[tuple[int, int], Any], ...] = (
    ((3, 2000), jacfwd),    # tall: few inputs, many outputs
    ((10_000, 1), jacrev),  # a loss: many inputs, one output
    ((784, 10), jacrev),    # wide
    ((2, 64), jacfwd),      # tall
    ((50, 50), None),       # square: no clear winner, accept both
)


def _jac_solution() -> Callable[[int, int], Any]:
    def pick_jacobian(n_in: int, n_out: int) -> Any:
        # jacfwd builds the Jacobian one column (one input) per forward pass,
        # jacrev one row (one output) per backward pass: pick the smaller count.
        return jacfwd if n_in < n_out else jacrev

    return pick_jacobian


def _jac_wrong() -> list[Any]:
    def reversed_rule(n_in: int, n_out: int) -> Any:
        return jacrev if n_in < n_out else jacfwd

    def always_reverse(n_in: int, n_out: int) -> Any:
        return jacrev

    def by_name(n_in: int, n_out: int) -> Any:
        return "jacfwd" if n_in < n_out else "jacrev"

    return [reversed_rule, always_reverse, by_name, jacrev, None]


@exercise(
    "05.jac_mode",
    prompt="write pick_jacobian(n_in, n_out) that returns torch.func.jacfwd or torch.func.jacrev, "
           "whichever computes the Jacobian of a function from n_in inputs to n_out outputs with "
           "fewer passes.",
    solution=_jac_solution,
    wrong_answers=_jac_wrong,
)
def check_jac_mode(answer: Any) -> str:
    """Accept a function choosing jacfwd for tall Jacobians and jacrev for wide ones."""
    if answer is jacfwd or answer is jacrev:
        raise Wrong("you passed a transform itself; pass a function pick_jacobian(n_in, n_out) "
                    "that returns jacfwd or jacrev depending on the sizes.")
    expect_function(answer, "pick_jacobian(n_in, n_out)")
    for (n_in, n_out), expected in JAC_CASES:
        got = answer(n_in, n_out)
        if isinstance(got, str):
            raise Wrong(f"pick_jacobian({n_in}, {n_out}) returned the string {got!r}; return the "
                        "transform itself (torch.func.jacfwd or torch.func.jacrev), not its name.")
        if got is not jacfwd and got is not jacrev:
            raise Wrong(f"pick_jacobian({n_in}, {n_out}) returned {got!r}; return torch.func.jacfwd "
                        "or torch.func.jacrev.")
        if expected is not None and got is not expected:
            shape = "tall (more outputs than inputs)" if n_out > n_in else "wide (more inputs than outputs)"
            raise Wrong(f"for {n_in} inputs and {n_out} outputs the Jacobian is {shape}. jacfwd needs "
                        "one forward pass per INPUT (a column each), jacrev one backward pass per "
                        "OUTPUT (a row each): which count is smaller here?")
    return "jacfwd for tall Jacobians, jacrev for wide ones: one pass per column or per row."


# ---------------------------------------------------------------------------
# 05.ensemble: M models in one vmapped call.
# ---------------------------------------------------------------------------


def _ensemble_solution() -> Callable[[list[nn.Module], torch.Tensor], torch.Tensor]:
    def ensemble_logits(models: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
        params, buffers = stack_module_state(models)
        base = copy.deepcopy(models[0]).to("meta")  # the structure only; holds no weights

        def run_one(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], data: torch.Tensor) -> torch.Tensor:
            return functional_call(base, (p, b), (data,))

        return vmap(run_one, in_dims=(0, 0, None))(params, buffers, x)

    return ensemble_logits


def _ensemble_wrong() -> list[Any]:
    def looped(models: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
        return torch.stack([m(x) for m in models])  # right values, one call per model

    def averaged(models: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
        return _ensemble_solution()(models, x).mean(0)  # the mean, not each model's output

    def first_model_only(models: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
        out = models[0](x)
        return out.expand(len(models), *out.shape)

    def maps_over_data_too(models: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
        params, buffers = stack_module_state(models)

        def run_one(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], data: torch.Tensor) -> torch.Tensor:
            return functional_call(models[0], (p, b), (data,))

        return vmap(run_one)(params, buffers, x)  # in_dims=0 for x as well: fails or mismatches

    return [looped, averaged, first_model_only, maps_over_data_too, None]


@exercise(
    "05.ensemble",
    prompt="write ensemble_logits(models, x) that returns a tensor of shape (len(models), batch, "
           "classes): every model applied to the same batch x, in one vmapped call over the output "
           "of torch.func.stack_module_state (no Python loop over the models).",
    solution=_ensemble_solution,
    wrong_answers=_ensemble_wrong,
)
def check_ensemble(answer: Any) -> str:
    """Accept a vmap-over-stacked-state ensemble whose outputs equal a loop over the models."""
    expect_function(answer, "ensemble_logits(models, x)")
    models = [_small_mlp(seed) for seed in range(4)]
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 8, generator=gen)
    with torch.no_grad():
        expected = torch.stack([m(x) for m in models])
    counters = [_CallCounter(m) for m in models]
    try:
        got = answer(models, x)
    finally:
        for c in counters:
            c.close()
    if not isinstance(got, torch.Tensor):
        raise Wrong(f"your function returned {type(got).__name__}; return one tensor of shape "
                    f"{tuple(expected.shape)}.")
    if got.shape != expected.shape:
        hint = (" That is one model's output shape: keep the models' dimension in front, don't average it."
                if tuple(got.shape) == tuple(expected.shape[1:]) else "")
        raise Wrong(f"the output has shape {tuple(got.shape)}, expected {tuple(expected.shape)} "
                    f"(models, batch, classes).{hint}")
    if not torch.allclose(got.detach(), expected, rtol=1e-4, atol=1e-5):
        raise Wrong("the outputs differ from running each model on x. Map over the stacked "
                    "parameters and buffers (in_dims=0) but share x (in_dims=None).")
    models_run = sum(c.calls > 0 for c in counters)
    if models_run > 1:
        raise Wrong(f"the values are right, but {models_run} separate models ran their forward: that "
                    "is a loop over the models. Stack their state with stack_module_state and vmap "
                    "one functional_call over it.")
    return "your ensemble runs every model in one vmapped call and matches the loop."
