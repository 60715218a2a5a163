"""Optimizer state belongs to the parameter (ocannl/train.py): one model compiled into routines
for two batch sizes, each with its own ``adam_update`` (or SGD with momentum), continues one run
of the optimizer when the routines alternate on a context, instead of each starting from zero."""

from __future__ import annotations

import numpy as np
import pytest

import ocannl as oc
from ocannl import train
from ocannl.errors import BackendUnavailable

RNG = np.random.default_rng(8)
X = RNG.normal(size=(6, 3))
T = RNG.normal(size=(6, 2))
W0 = RNG.normal(size=(2, 3)) * 0.5
SMALL, LARGE = slice(0, 2), slice(2, 6)  # a batch of 2 rows and a batch of 4
ORDER = ["small", "large", "small", "small", "large"]


def grad(w: np.ndarray, rows: slice) -> np.ndarray:
    """The gradient of ½ Σ (x wᵀ − t)² over ``rows``."""
    x, t = X[rows], T[rows]
    return (x @ w.T - t).T @ x


def routines(backend: str, make_optimizer):
    try:
        ctx = oc.Context(backend)
    except BackendUnavailable as e:
        pytest.skip(str(e))
    w = oc.param("w", output=2, input=3, init=W0, dtype="float64")
    steps, optimizers = {}, {}
    for name, rows in (("small", SMALL), ("large", LARGE)):
        x = oc.tensor(X[rows], batch=1, dtype="float64", label=f"x_{name}")
        t = oc.tensor(T[rows], batch=1, dtype="float64", label=f"t_{name}")
        update = train.grad_update(0.5 * ((w @ x - t) ** 2).sum())
        optimizers[name] = make_optimizer(update)
        steps[name] = ctx.compile(update, optimizers[name])
    return ctx, w, steps, optimizers


@pytest.mark.parametrize("backend", ["interp", "c", "triton"])  # (Metal has no float64)
def test_two_adam_updates_of_one_parameter_share_moments_and_step_count(backend):
    b1, b2, eps, lr = 0.9, 0.999, 1e-8, 0.05
    ctx, w, steps, optimizers = routines(backend, lambda u: train.adam_update(u, lr=lr))
    assert {(what, id(node)) for _, what, node in optimizers["small"].states} == \
        {(what, id(node)) for _, what, node in optimizers["large"].states}

    p, m, v = W0.copy(), np.zeros_like(W0), np.zeros_like(W0)
    for k, name in enumerate(ORDER, start=1):  # one torch.optim.Adam over both batch sizes
        steps[name].run()
        g = grad(p, SMALL if name == "small" else LARGE)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - (lr / (1 - b1**k)) * m / (np.sqrt(v) / np.sqrt(1 - b2**k) + eps)
        np.testing.assert_allclose(ctx.get(w), p, rtol=1e-10, atol=1e-13, err_msg=f"step {k} ({name})")
    state = train.optimizer_state(w)
    assert ctx.get(state["adam_step"]) == len(ORDER)
    np.testing.assert_allclose(ctx.get(state["adam_m"]), m, rtol=1e-10, atol=1e-13)


def test_two_sgd_updates_of_one_parameter_share_the_momentum_buffer():
    mu, lr = 0.9, 0.02
    ctx, w, steps, _ = routines("interp", lambda u: train.sgd_update(u, lr=lr, momentum=mu))
    p, buf = W0.copy(), np.zeros_like(W0)
    for k, name in enumerate(ORDER, start=1):
        steps[name].run()
        buf = mu * buf + grad(p, SMALL if name == "small" else LARGE)
        p = p - lr * buf
        np.testing.assert_allclose(ctx.get(w), p, rtol=1e-10, atol=1e-13, err_msg=f"step {k} ({name})")
