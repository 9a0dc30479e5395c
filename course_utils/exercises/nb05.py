"""Exercises of notebook 05: per-sample gradients, picking a Jacobian mode, ensembles with vmap."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, jacfwd, jacrev, stack_module_state, vmap

from .framework import Mistake, OpCounter, Wrong, case, function_exercise, run


def _small_mlp(seed: int, n_in: int = 8, hidden: int = 16, n_out: int = 3) -> nn.Module:
    with torch.random.fork_rng(devices=[]):  # leave the learner's random stream alone
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, n_out))


def _loops(answer: Any, small: tuple[Any, ...], big: tuple[Any, ...], call: str) -> tuple[int, int] | None:
    """Return the ATen operation counts of ``answer`` on ``small`` and ``big`` when they differ, else None.

    One vmapped call runs the same operations whatever the batch (or ensemble) size; a Python loop,
    however it calls the model (``model(x)``, ``model.forward(x)``, ``functional_call``), runs more.
    """
    counts = []
    for args in (small, big):
        with OpCounter() as counter:
            run(answer, *args, call=call)
        counts.append(counter.ops)
    return (counts[0], counts[1]) if counts[1] > counts[0] else None


# --- 05.per_sample_grads: vmap(grad(...)) instead of a loop over the batch.


def _psg_case() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return _small_mlp(0), torch.randn(6, 8, generator=gen), torch.randint(0, 3, (6,), generator=gen)


def grads_per_sample(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """Return {parameter name: per-sample gradients}, each of shape (batch, *parameter.shape)."""
    params = {name: p.detach() for name, p in model.named_parameters()}

    def loss_one(params: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, params, (xi,)), yi)

    return vmap(grad(loss_one), in_dims=(None, 0, 0))(params, x, y)


def _grads_by_loop(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """What the checker compares with: one backward pass per sample, with torch.autograd.grad."""
    names, params = [n for n, _ in model.named_parameters()], list(model.parameters())
    per_sample = [torch.autograd.grad(F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]), params) for i in range(len(x))]
    return {n: torch.stack(gs) for n, gs in zip(names, zip(*per_sample))}


def _psg_mistakes() -> list[Mistake]:
    def looping(step: Callable[[nn.Module, torch.Tensor], torch.Tensor]) -> Callable[..., Any]:
        def per_sample_loop(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
            names, params = [n for n, _ in model.named_parameters()], list(model.parameters())
            grads = [torch.autograd.grad(F.cross_entropy(step(model, x[i]), y[i]), params) for i in range(len(x))]
            return {n: torch.stack(gs) for n, gs in zip(names, zip(*grads))}

        return per_sample_loop

    def per_sample(scale: Callable[[torch.Tensor], Any], in_dims: Any = (None, 0, 0)) -> Callable[..., Any]:
        def grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
            params = {name: p.detach() for name, p in model.named_parameters()}

            def loss_one(params: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
                return F.cross_entropy(functional_call(model, params, (xi,)), yi) * scale(x)

            return vmap(grad(loss_one), in_dims=in_dims)(params, x, y)

        return grads

    def batch_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        params = {name: p.detach() for name, p in model.named_parameters()}
        return grad(lambda p: F.cross_entropy(functional_call(model, p, (x,)), y))(params)

    return [(looping(lambda model, xi: model(xi)), "loops over the samples"),
            (looping(lambda model, xi: model.forward(xi)), "loops over the samples"),  # skips forward hooks
            (batch_gradient, "That is one gradient for the whole batch: per-sample gradients have a leading "
                             "batch dimension. vmap over the samples, grad inside."),
            (per_sample(lambda x: 1 / len(x)), "Off by a factor of the batch size: each sample's loss is its "
                                               "own cross-entropy, not divided by the batch size."),
            (lambda model, x, y: {}, "Still the stub? Build params = {name: p.detach() for name, p in "
                                     "model.named_parameters()}, a one-sample loss with functional_call, and "
                                     "vmap(grad(loss_one), in_dims=(None, 0, 0))."),
            (per_sample(lambda x: 1, in_dims=0), "in_dims=(None, 0, 0)")]


def _psg_no_loop(answer: Any) -> None:
    model, x, y = _psg_case()
    counts = _loops(answer, (model, x[:3], y[:3]), (model, x, y), call="grads_per_sample(model, x, y)")
    if counts:
        raise Wrong(f"the values are right, but your function runs {counts[0]} operations for 3 samples and "
                    f"{counts[1]} for 6: the work grows with the batch, so it loops over the samples. Use "
                    "vmap(grad(loss_one)) so the whole batch goes through the model in one call.")


function_exercise(
    "05.per_sample_grads",
    solution=grads_per_sample,
    reference=_grads_by_loop,
    cases=lambda: [_psg_case()],
    mistakes=_psg_mistakes,
    wrong=lambda: [({"0.weight": torch.zeros(3)}, "expected a function")],
    errors=[("same size in the mapped dimension", "By default vmap maps dimension 0 of every "
                                                  "argument: share the parameters with in_dims=(None, 0, 0).")],
    otherwise="Each sample's gradient is the gradient of its own F.cross_entropy(logits, label), as a loop "
              "over the batch would compute it.",
    after=_psg_no_loop,
    tol=(1e-4, 1e-6),
    success="your per-sample gradients match a loop over the batch, computed in one vmapped call.",
)

# --- 05.jac_mode: forward or reverse mode for a Jacobian of a given shape?


def pick_jacobian(n_in: int, n_out: int) -> Any:
    """Return jacfwd or jacrev, whichever needs fewer passes for an n_in -> n_out Jacobian."""
    # jacfwd builds the Jacobian one column (one input) per forward pass,
    # jacrev one row (one output) per backward pass: pick the smaller count.
    return jacfwd if n_in < n_out else jacrev


def _not_a_transform(answer: Any) -> Any:
    if answer is jacfwd or answer is jacrev:
        raise Wrong("you passed a transform itself; pass a function pick_jacobian(n_in, n_out) that returns "
                    "jacfwd or jacrev depending on the sizes.")
    return answer


_PASSES = ("Forward mode (jacfwd) needs one pass per INPUT (a column each), reverse mode (jacrev) one pass per "
           "OUTPUT (a row each): pick the one with fewer passes.")

function_exercise(
    "05.jac_mode",
    solution=pick_jacobian,
    cases=lambda: [case(3, 2000, gives=jacfwd),     # tall: 3 forward passes against 2000 backward
                   case(10_000, 1, gives=jacrev),   # a loss: one backward pass
                   case(784, 10, gives=jacrev),     # wide: 10 backward passes against 784 forward
                   case(2, 64, gives=jacfwd)],
    mistakes=lambda: [(lambda n_in, n_out: jacrev if n_in < n_out else jacfwd, _PASSES),
                      (lambda n_in, n_out: jacrev, _PASSES),
                      (lambda n_in, n_out: "jacfwd" if n_in < n_out else "jacrev",
                       "Return the transform itself (torch.func.jacfwd or torch.func.jacrev), not its name.")],
    wrong=lambda: [(jacrev, "you passed a transform itself")],
    prepare=_not_a_transform,
    otherwise="Return torch.func.jacfwd or torch.func.jacrev. " + _PASSES,
    success="jacfwd for tall Jacobians, jacrev for wide ones: one pass per column or per row.",
)

# --- 05.ensemble: M models in one vmapped call.


def _ensemble_case() -> tuple[list[nn.Module], torch.Tensor]:
    return [_small_mlp(seed) for seed in range(4)], torch.randn(5, 8, generator=torch.Generator().manual_seed(2))


def _ensemble_reference(models: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.stack([m(x) for m in models])


def ensemble_logits(models: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """Return the logits of every model on x, shape (len(models), batch, classes)."""
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")  # the structure only; holds no weights

    def run_one(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], data: torch.Tensor) -> torch.Tensor:
        return functional_call(base, (p, b), (data,))

    return vmap(run_one, in_dims=(0, 0, None))(params, buffers, x)


def _ensemble_mistakes() -> list[Mistake]:
    def maps_over_data_too(models: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
        params, buffers = stack_module_state(models)
        return vmap(lambda p, b, data: functional_call(models[0], (p, b), (data,)))(params, buffers, x)

    def first_model_only(models: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
        out = models[0](x)
        return out.expand(len(models), *out.shape)

    return [(lambda models, x: None, "Still the stub? Stack the models' state with stack_module_state, make a "
                                     "meta-device copy of one model for functional_call, and vmap it with "
                                     "in_dims=(0, 0, None)."),
            (lambda models, x: torch.stack([m(x) for m in models]), "a loop over the models"),
            (lambda models, x: torch.stack([m.forward(x) for m in models]), "a loop over the models"),
            (lambda models, x: ensemble_logits(models, x).mean(0),
             "Keep the models' dimension in front; don't average over it."),
            (first_model_only, "Every model must run with its own parameters: vmap over the stacked "
                               "parameters and buffers (in_dims=0) and share x (in_dims=None)."),
            (maps_over_data_too, "in_dims=(0, 0, None)")]


def _ensemble_no_loop(answer: Any) -> None:
    models, x = _ensemble_case()
    counts = _loops(answer, (models[:2], x), (models, x), call="ensemble_logits(models, x)")
    if counts:
        raise Wrong(f"the values are right, but your function runs {counts[0]} operations for 2 models and "
                    f"{counts[1]} for 4: the work grows with the number of models, so it is a loop over the "
                    "models. Stack their state with stack_module_state and vmap one functional_call over it.")


function_exercise(
    "05.ensemble",
    solution=ensemble_logits,
    reference=_ensemble_reference,
    cases=lambda: [_ensemble_case()],
    mistakes=_ensemble_mistakes,
    errors=[("same size in the mapped dimension", "By default vmap maps dimension 0 of every "
                                                  "argument: map the stacked parameters and buffers but "
                                                  "share x, in_dims=(0, 0, None).")],
    otherwise="Map over the stacked parameters and buffers (in_dims=0) but share x (in_dims=None).",
    after=_ensemble_no_loop,
    tol=(1e-4, 1e-5),
    success="your ensemble runs every model in one vmapped call and matches the loop.",
)
