"""Activations and log-domain reductions against PyTorch: ``oc.erf``, ``nn.gelu`` (both forms),
``nn.silu``, ``nn.softplus``, ``nn.log_softmax`` and ``oc.logsumexp``, forward values and
gradients on every backend, from inputs whose logits span large magnitudes (where a naive formula
overflows or loses its small terms). Normwise comparisons as in test_nn_blocks.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from backend_params import backend_param
from test_nn_blocks import assert_matches_torch, leaf, run_grad
import ocannl as oc
from ocannl import nn

BACKENDS = [backend_param("interp"), backend_param("c"), backend_param("metal"), backend_param("triton", slow=True)]

RNG = np.random.default_rng(23)
X = np.concatenate([RNG.standard_normal((4, 7)) * 3, [[-40.0, -20.5, -1e-3, 0.0, 1e-3, 20.5, 40.0]]]).astype(np.float32)
WEIGHTS = RNG.standard_normal(X.shape).astype(np.float32)

POINTWISE = {
    "erf": (oc.erf, torch.erf),
    "gelu": (nn.gelu, F.gelu),
    "gelu_tanh": (lambda x: nn.gelu(x, approximate="tanh"), lambda t: F.gelu(t, approximate="tanh")),
    "silu": (nn.silu, F.silu),
    "softplus": (nn.softplus, F.softplus),
}


def input_param():
    """``X`` as a parameter of batch 5, output 7, so that its gradient can be read."""
    p = oc.param("x", output=X.shape, init=X)
    return p, oc.einsum("b, o => b | o", p, label="x_batched")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", POINTWISE)
def test_pointwise_activation_matches_torch(backend, name):
    ours_fn, torch_fn = POINTWISE[name]
    p, x = input_param()
    y, (grad,), _ = run_grad(backend, ours_fn(x), WEIGHTS, [p], batch=1)
    t = leaf(X)
    ref = torch_fn(t)
    assert_matches_torch(y, grad, ref, t, WEIGHTS, f"{name} on {backend}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_log_softmax_matches_torch(backend):
    p, x = input_param()
    y, (grad,), _ = run_grad(backend, nn.log_softmax(x), WEIGHTS, [p], batch=1)
    t = leaf(X)
    ref = F.log_softmax(t, dim=-1)
    assert_matches_torch(y, grad, ref, t, WEIGHTS, f"log_softmax on {backend}")
    assert np.all(np.isfinite(y)), "a logit 80 below the row's maximum still has a finite logarithm"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("axis", ["output", None])
def test_logsumexp_matches_torch(backend, axis):
    p, x = input_param()
    weights = WEIGHTS[:, 0] if axis == "output" else np.float32(1.5)
    y, (grad,), _ = run_grad(backend, oc.logsumexp(x, axis), weights, [p], batch=1 if axis else 0)
    t = leaf(X)
    ref = torch.logsumexp(t, dim=-1) if axis == "output" else torch.logsumexp(t, dim=(0, 1))
    assert_matches_torch(y, grad, ref, t, weights, f"logsumexp over {axis} on {backend}")


def test_softplus_of_large_inputs_does_not_overflow():
    x = oc.tensor(np.array([-100.0, 100.0, 1000.0], np.float32))
    np.testing.assert_allclose(nn.softplus(x).numpy(), [0.0, 100.0, 1000.0], atol=1e-30)


def test_gelu_refuses_a_form_pytorch_does_not_name():
    with pytest.raises(ValueError, match=r"nn.gelu: approximate is one of \('none', 'tanh'\).*'exact'"):
        nn.gelu(oc.tensor(X), approximate="exact")


@pytest.mark.parametrize("backend", BACKENDS)
def test_stop_gradient_passes_the_value_and_no_gradient(backend):
    """``d/dx sum(w * stop_gradient(x) * x) = w * x``, as torch's ``detach``; and a softmax,
    whose shift by the maximum is such a constant, still has torch's gradient."""
    p, x = input_param()
    y, (grad,), _ = run_grad(backend, oc.stop_gradient(x) * x, WEIGHTS, [p], batch=1)
    t = leaf(X)
    assert_matches_torch(y, grad, t.detach() * t, t, WEIGHTS, f"stop_gradient on {backend}")
    assert not oc.stop_gradient(x).requires_grad
    p, x = input_param()
    y, (grad,), _ = run_grad(backend, nn.softmax(x), WEIGHTS, [p], batch=1)
    t = leaf(X)
    assert_matches_torch(y, grad, F.softmax(t, dim=-1), t, WEIGHTS, f"softmax on {backend}")
