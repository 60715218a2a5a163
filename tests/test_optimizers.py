"""SGD and Adam against numpy references, step by step (ocannl/train.py, docs/training.md).

Each optimizer trains the same float64 least-squares model, ``loss = ½ Σ (w @ x + b − t)²``, for
20 steps; a numpy reference with torch.optim's semantics
(torch.optim.SGD with dampening 0, torch.optim.Adam bias-corrected with eps after the sqrt, L2
weight decay, AdamW when decoupled) runs on the same data from the same start, with gradients from
numpy's own matrix products. After every step the gradients ocannl computed and the updated
parameters must agree to ~1e-10 relative: any difference in the update rule shows at once.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

import ocannl as oc
from ocannl import train
from ocannl.errors import ShapeError

STEPS = 20
RTOL, ATOL = 1e-10, 1e-13

RNG = np.random.default_rng(5)
X = RNG.normal(size=(4, 3))
T = RNG.normal(size=(4, 2))
W0 = RNG.normal(size=(2, 3)) * 0.5
B0 = RNG.normal(size=(2,)) * 0.5


def reference_grads(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Gradients of ½ Σ (x wᵀ + b − t)² in numpy."""
    err = X @ params["w"].T + params["b"] - T
    return {"w": err.T @ X, "b": err.sum(axis=0)}


class ReferenceSGD:
    """torch.optim.SGD with dampening 0: d = g + wd·p; buf = m·buf + d (buf = d at the first
    step); d = buf, or d + m·buf with Nesterov; p −= lr·d."""

    def __init__(self, momentum=0.0, weight_decay=0.0, nesterov=False):
        self.momentum, self.weight_decay, self.nesterov = momentum, weight_decay, nesterov
        self.buf: dict[str, np.ndarray] = {}

    def step(self, params, grads, lr):
        for name, p in params.items():
            d = grads[name] + self.weight_decay * p if self.weight_decay else grads[name]
            if self.momentum:
                buf = self.momentum * self.buf[name] + d if name in self.buf else d
                self.buf[name] = buf
                d = d + self.momentum * buf if self.nesterov else buf
            params[name] = p - lr * d


class ReferenceAdam:
    """torch.optim.Adam (AdamW with ``decoupled``): bias-corrected moments, eps after the sqrt."""

    def __init__(self, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False):
        self.b1, self.b2 = betas
        self.eps, self.weight_decay, self.decoupled = eps, weight_decay, decoupled
        self.m: dict[str, np.ndarray] = {}
        self.v: dict[str, np.ndarray] = {}
        self.t = 0

    def step(self, params, grads, lr):
        self.t += 1
        for name, p in params.items():
            g = grads[name]
            if self.weight_decay and self.decoupled:
                p = p * (1 - lr * self.weight_decay)
            elif self.weight_decay:
                g = g + self.weight_decay * p
            m = self.b1 * self.m.get(name, 0.0) + (1 - self.b1) * g
            v = self.b2 * self.v.get(name, 0.0) + (1 - self.b2) * g * g
            self.m[name], self.v[name] = m, v
            step_size = lr / (1 - self.b1 ** self.t)
            denom = np.sqrt(v) / np.sqrt(1 - self.b2 ** self.t) + self.eps
            params[name] = p - step_size * m / denom


def linear_schedule(k: int) -> float:
    """``0.1 * (2*STEPS − step_n) / STEPS`` as ocannl computes it: an index symbol is a float32
    scalar tensor, and the numbers adapt to it, so each operation rounds to float32."""
    f32 = np.float32
    return float(f32(f32(0.1) * f32(f32(2 * STEPS) - f32(k))) / f32(STEPS))


def constant(lr: float):
    return lambda k: lr


OPTIMIZERS = [
    pytest.param("sgd", dict(lr=0.1), partial(ReferenceSGD), constant(0.1), id="sgd"),
    pytest.param("sgd", dict(lr=0.05, momentum=0.9), partial(ReferenceSGD, momentum=0.9), constant(0.05),
                 id="sgd-momentum"),
    pytest.param("sgd", dict(lr=0.05, momentum=0.9, nesterov=True), partial(ReferenceSGD, momentum=0.9, nesterov=True),
                 constant(0.05), id="sgd-nesterov"),
    pytest.param("sgd", dict(lr=0.1, weight_decay=0.05), partial(ReferenceSGD, weight_decay=0.05), constant(0.1),
                 id="sgd-weight-decay"),
    pytest.param("sgd", dict(lr="schedule", momentum=0.5, weight_decay=1e-2, nesterov=True),
                 partial(ReferenceSGD, momentum=0.5, weight_decay=1e-2, nesterov=True), linear_schedule,
                 id="sgd-nesterov-decay-step_n-schedule"),
    pytest.param("sgd", dict(lr="schedule", weight_decay=1e-4), partial(ReferenceSGD, weight_decay=1e-4),
                 linear_schedule, id="sgd-moons-schedule"),
    pytest.param("adam", dict(lr=0.05), partial(ReferenceAdam), constant(0.05), id="adam"),
    pytest.param("adam", dict(lr=0.05, betas=(0.8, 0.99), eps=1e-6),
                 partial(ReferenceAdam, betas=(0.8, 0.99), eps=1e-6), constant(0.05), id="adam-betas-eps"),
    pytest.param("adam", dict(lr=0.05, weight_decay=0.1), partial(ReferenceAdam, weight_decay=0.1), constant(0.05),
                 id="adam-l2"),
    pytest.param("adam", dict(lr=0.05, weight_decay=0.1, decoupled=True),
                 partial(ReferenceAdam, weight_decay=0.1, decoupled=True), constant(0.05), id="adamw"),
    pytest.param("adam", dict(lr="schedule", weight_decay=0.1, decoupled=True),
                 partial(ReferenceAdam, weight_decay=0.1, decoupled=True), linear_schedule, id="adamw-step_n-schedule"),
]


@pytest.mark.parametrize("kind, options, make_reference, lr_at", OPTIMIZERS)
def test_optimizer_matches_reference_step_by_step(kind, options, make_reference, lr_at):
    reference = make_reference()
    w = oc.param("w", output=2, input=3, init=W0, dtype="float64")
    b = oc.param("b", output=2, init=B0, dtype="float64")
    x = oc.tensor(X, batch=1, dtype="float64")
    t = oc.tensor(T, batch=1, dtype="float64")
    loss = 0.5 * ((w @ x + b - t) ** 2).sum()
    update = train.grad_update(loss)

    options = dict(options)
    schedule = options["lr"] == "schedule"
    if schedule:
        step_n = oc.IndexSymbol("step_n", STEPS)
        options["lr"] = 0.1 * (2 * STEPS - step_n) / STEPS
    optimizer = train.sgd_update(update, **options) if kind == "sgd" else train.adam_update(update, **options)
    routine = oc.Context("interp").compile(update, optimizer)

    expected = {"w": W0.copy(), "b": B0.copy()}
    tensors = {"w": w, "b": b}
    for k in range(STEPS):
        grads = reference_grads(expected)
        routine.run(**({"step_n": k} if schedule else {}))
        for name, p in tensors.items():
            np.testing.assert_allclose(p.grad.numpy(), grads[name], rtol=RTOL, atol=ATOL,
                                       err_msg=f"step {k}: gradient of {name}")
        if schedule:
            np.testing.assert_allclose(options["lr"].numpy(), lr_at(k), rtol=0, atol=0, err_msg=f"lr at step {k}")
        reference.step(expected, grads, lr_at(k))
        for name, p in tensors.items():
            np.testing.assert_allclose(p.numpy(), expected[name], rtol=RTOL, atol=ATOL,
                                       err_msg=f"step {k}: {name} after the update")
    assert float(loss.numpy()) < 0.5 * ((X @ W0.T + B0 - T) ** 2).sum(), "training did not reduce the loss"


def test_nesterov_needs_momentum():
    w = oc.param("w", output=1, init=np.array([1.0]), dtype="float64")
    with pytest.raises(ValueError, match="momentum"):
        train.sgd_update(train.grad_update((w * w).sum()), lr=0.1, nesterov=True)


def test_learning_rate_must_be_a_scalar():
    w = oc.param("w", output=2, init=np.array([1.0, 2.0]), dtype="float64")
    lr = oc.tensor([0.1, 0.2], dtype="float64")
    with pytest.raises(ShapeError, match="lr must be a scalar"):
        train.sgd_update(train.grad_update((w * w).sum()), lr=lr)
