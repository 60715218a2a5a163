"""Operations by position against PyTorch (docs/shapes.md, "Indexing, reshaping, reductions by
position"): static indexing ``t[0]``, ``t[:, ::2]``, ``oc.reshape``/``flatten``/``unflatten``,
``permute``/``transpose``, reductions along axes by position and ``argmax``/``argmin``. Forward
values and gradients on every backend (Triton in the slow set), normwise within 1e-5 as in
test_nn_blocks.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backend_params import backend_param
from test_nn_blocks import assert_matches_torch, leaf
import ocannl as oc
from ocannl import train
from ocannl.errors import ShapeError

BACKENDS = [backend_param("interp"), backend_param("c"), backend_param("metal"), backend_param("triton", slow=True)]

RNG = np.random.default_rng(23)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)


def input_param(kinds: str = "a|c->b"):
    """``X`` as a parameter, seen through an einsum as the tensor of dims ``(2, 3, 4)`` whose
    kinds ``kinds`` gives (by default batch 2, output 3, input 4), so its gradient can be read."""
    p = oc.param("x", output=X.shape, init=X)
    return p, oc.einsum(f"a,b,c => {kinds.replace('|', ',|').replace('->', ',->')},", p, label="x_kinds")


def run_grad(backend: str, y: oc.Tensor, p: oc.Tensor):
    """``loss = sum(y * w)`` for fixed weights ``w`` of ``y``'s dims, compiled with its gradient on
    ``backend`` and run once: ``(y, p's gradient, w)``."""
    y.materialize()
    shape = y.shape
    weights = RNG.standard_normal(y.dims).astype(np.float32)
    w = oc.tensor(weights, batch=len(shape.batch), input=len(shape.input), label="loss_weights")
    ctx = oc.Context(backend)
    ctx.compile(train.grad_update((y * w).sum())).run()
    return ctx.get(y.value), ctx.get(p.grad), weights


CASES = {
    "t[0]": (lambda x: x[0], lambda t: t[0]),
    "t[1:3]": (lambda x: x[:, 1:3], lambda t: t[:, 1:3]),
    "t[-1:]": (lambda x: x[-1:], lambda t: t[-1:]),
    "t[..., -1]": (lambda x: x[..., -1], lambda t: t[..., -1]),
    "t[:, ::2]": (lambda x: x[:, ::2], lambda t: t[:, ::2]),
    "t[1, 1:, ::3]": (lambda x: x[1, 1:, ::3], lambda t: t[1, 1:, ::3]),
    "t[:, ::-1]": (lambda x: x[:, ::-1], lambda t: t.flip(1)),
    "reshape (4, 6)": (lambda x: oc.reshape(x, (4, -1)), lambda t: t.reshape(4, -1)),
    "reshape (3, 8)": (lambda x: oc.reshape(x, (3, 8), batch=1), lambda t: t.reshape(3, 8)),
    "reshape (24,)": (lambda x: oc.reshape(x, -1), lambda t: t.reshape(-1)),
    "unflatten": (lambda x: oc.unflatten(x, -1, (2, -1)), lambda t: t.unflatten(-1, (2, -1))),
    "permute": (lambda x: oc.permute(x, (2, 0, 1)), lambda t: t.permute(2, 0, 1)),
    "transpose": (lambda x: x.transpose(), lambda t: t.transpose(-2, -1)),
    "sum axis=1": (lambda x: oc.sum(x, axis=1), lambda t: t.sum(1)),
    "mean axis=(0, 2)": (lambda x: x.mean(axis=(0, 2)), lambda t: t.mean((0, 2))),
    "max axis=-1": (lambda x: oc.max(x, axis=-1), lambda t: t.amax(-1)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", CASES)
def test_positional_op_matches_torch(backend, name):
    ours, theirs = CASES[name]
    p, x = input_param()
    y, grad, weights = run_grad(backend, ours(x), p)
    t = leaf(X)
    ref = theirs(t)
    assert_matches_torch(y, grad, ref, t, weights, f"{name} on {backend}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_flatten_merges_one_kind(backend):
    p, x = input_param("a|b,c")
    flat = oc.flatten(x, "output")
    assert (flat.shape.batch, flat.shape.output) == ((2,), (12,))
    y, grad, weights = run_grad(backend, flat, p)
    t = leaf(X)
    ref = t.flatten(1)
    assert_matches_torch(y, grad, ref, t, weights, f"flatten on {backend}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_argmax_argmin_take_the_first_at_ties(backend, axis):
    values = np.array([[[1, 3, 3, 0], [3, 2, 3, 3], [0, 0, 1, 1]],
                       [[3, 3, 0, 0], [1, 1, 1, 1], [2, 0, 2, 0]]], dtype=np.float32)
    x = oc.tensor(values, batch=1, input=1)
    ctx = oc.Context(backend)
    for ours, theirs in ((oc.argmax, torch.argmax), (oc.argmin, torch.argmin)):
        got = _computed(ctx, ours(x, axis=axis))
        expected = theirs(torch.from_numpy(values), dim=axis).numpy()
        assert got.dtype == np.int64 and np.array_equal(got, expected), f"{ours.__name__} axis={axis} on {backend}"


def _computed(ctx: oc.Context, t: oc.Tensor) -> np.ndarray:
    t.materialize()
    ctx.compile(t).run()
    return ctx.get(t.value)


def test_argmax_keeps_the_other_kinds_and_takes_no_gradient():
    p, x = input_param()
    index = oc.argmax(x, axis=1)
    assert (index.shape.batch, index.shape.output, index.shape.input) == ((2,), (), (4,))
    assert not index.requires_grad


def test_index_symbol_still_slices_the_batch():
    xs = oc.tensor(X, batch=1)
    n = oc.IndexSymbol("n", 2)
    assert xs[n].op == "slice" and xs[0].op == "static_index"


@pytest.mark.parametrize("make, message", [
    (lambda x: x[2], "out of range"),
    (lambda x: x[0, 0, 0, 0], "4 indices"),
    (lambda x: x[0.5], "ints, slices"),
    (lambda x: oc.reshape(x, (5, 5)), "do not hold"),
    (lambda x: oc.permute(x, (0, 0, 1)), "not an order"),
    (lambda x: oc.sum(x, axis=3), "not a position"),
])
def test_positional_mistakes_are_explained(make, message):
    x = oc.tensor(X, batch=1, input=1)
    with pytest.raises((ShapeError, TypeError), match=message):
        make(x)


def test_an_empty_slice_is_refused_naming_the_axis():
    x = oc.tensor(np.ones((2, 5, 4), np.float32), batch=1)
    with pytest.raises(ShapeError, match="axis 1 .size 5. selects no cell"):
        x[:, 3:1]
