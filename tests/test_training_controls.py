"""Training controls against PyTorch (docs/training.md, "Frozen parameters" and "Clipping
gradients"): ``train.clip_grad_norm`` inside the compiled step, parameters made with
``trainable=False`` or left out of ``train.grad_update(loss, params=...)``, ``nn.mlp(out=)`` used
alone and ``nn.summary``.

PyTorch runs the same float32 model from the same start (``clip_grad_norm_`` then
``torch.optim.SGD``; ``torch.optim.Adam`` with a parameter whose ``requires_grad`` is off), and
after every step the parameters agree normwise: ``max|ours - torch| <= 1e-5 * max|torch|``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backend_params import backend_param, context
import ocannl as oc
from ocannl import nn, train
from ocannl.errors import SessionError, ShapeError
from ocannl.lowlevel.assignments import nodes_written

BACKENDS = [backend_param("interp"), backend_param("c"), backend_param("metal"), backend_param("triton", slow=True)]
STEPS = 3
RTOL = 1e-5

RNG = np.random.default_rng(23)
X = RNG.normal(size=(4, 3)).astype(np.float32)
T = RNG.normal(size=(4, 2)).astype(np.float32)
W1 = RNG.normal(size=(5, 3)).astype(np.float32)
B1 = RNG.normal(size=(5,)).astype(np.float32) * 0.1
W2 = RNG.normal(size=(2, 5)).astype(np.float32)


def assert_close(ours: np.ndarray, ref: torch.Tensor, what: str) -> None:
    ref = ref.detach().numpy()
    err = float(np.max(np.abs(ours.astype(np.float64) - ref)))
    scale = float(np.max(np.abs(ref)))
    assert err <= RTOL * scale, f"{what}: max error {err:.3g} vs max |value| {scale:.3g}"


def two_layer(frozen: tuple[str, ...] = ()):
    """``loss = sum((w2 @ relu(w1 @ x + b1) - t)^2)`` with the parameters named in ``frozen``
    made with ``trainable=False``; returns the loss and the parameters by name."""
    params = {name: oc.param(name, output=v.shape[0], input=v.shape[1:] or (), init=v, trainable=name not in frozen)
              for name, v in (("w1", W1), ("b1", B1), ("w2", W2))}
    x = oc.tensor(X, batch=1, label="x")
    t = oc.tensor(T, batch=1, label="t")
    diff = params["w2"] @ oc.relu(params["w1"] @ x + params["b1"]) - t
    return (diff * diff).sum(label="loss"), params


def torch_two_layer(frozen: tuple[str, ...] = ()):
    params = {name: torch.tensor(v, requires_grad=name not in frozen) for name, v in (("w1", W1), ("b1", B1), ("w2", W2))}

    def loss():
        h = torch.relu(torch.from_numpy(X) @ params["w1"].T + params["b1"])
        return ((h @ params["w2"].T - torch.from_numpy(T)) ** 2).sum()

    return loss, params


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("max_norm", [0.5, 1e4])
def test_clip_grad_norm_then_sgd_matches_torch(backend, max_norm):
    ctx = context(backend)
    loss, params = two_layer()
    clipped = train.clip_grad_norm(train.grad_update(loss), max_norm)
    step = ctx.compile(clipped, train.sgd_update(clipped, lr=0.05))
    torch_loss, torch_params = torch_two_layer()
    sgd = torch.optim.SGD(list(torch_params.values()), lr=0.05)
    for k in range(STEPS):
        step.run()
        sgd.zero_grad()
        torch_loss().backward()
        norm = torch.nn.utils.clip_grad_norm_(list(torch_params.values()), max_norm)
        sgd.step()
        assert_close(ctx.get(clipped.grad_norm), norm, f"step {k} gradient norm")
        for name, p in params.items():
            assert_close(ctx.get(p), torch_params[name], f"step {k} {name}")
    if max_norm < 1:
        assert float(norm) > max_norm  # the clipping was in effect


def test_clip_grad_norm_keeps_the_update_a_gradient_update():
    loss, params = two_layer()
    update = train.grad_update(loss)
    clipped = train.clip_grad_norm(update, 1.0)
    assert isinstance(clipped, train.GradUpdate) and clipped.params == update.params
    assert update.grad_norm is None and clipped.grad_norm is not None
    with pytest.raises(ValueError, match="positive"):
        train.clip_grad_norm(update, 0.0)
    with pytest.raises(TypeError, match="grad_update"):
        train.clip_grad_norm(loss, 1.0)


def train_beside_torch(ctx, step, params, torch_loss, torch_adam, torch_params, fixed, trained) -> None:
    """``STEPS`` runs of ``step`` beside torch's Adam steps: each ``fixed`` parameter keeps its
    initial value, each ``trained`` one matches torch's after every step."""
    for k in range(STEPS):
        step.run()
        torch_adam.zero_grad()
        torch_loss().backward()
        torch_adam.step()
        for name, initial in fixed.items():
            np.testing.assert_array_equal(ctx.get(params[name]), initial)
        for name in trained:
            assert_close(ctx.get(params[name]), torch_params[name], f"step {k} {name}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_frozen_parameter_is_unchanged_by_adam_and_the_others_match_torch(backend):
    ctx = context(backend)
    loss, params = two_layer(frozen=("w1",))
    update = train.grad_update(loss)
    assert [p.label for p in update.params] == ["b1", "w2"]
    adam = train.adam_update(update, lr=0.01)
    assert train.optimizer_state(params["w1"]) == {}
    step = ctx.compile(update, adam)
    torch_loss, torch_params = torch_two_layer(frozen=("w1",))
    torch_adam = torch.optim.Adam([torch_params["b1"], torch_params["w2"]], lr=0.01)
    train_beside_torch(ctx, step, params, torch_loss, torch_adam, torch_params, fixed={"w1": W1}, trained=("b1", "w2"))


def test_a_frozen_parameter_has_no_gradient_and_says_so():
    loss, params = two_layer(frozen=("w1", "b1", "w2"))
    assert not params["w1"].trainable and not params["w1"].requires_grad
    with pytest.raises(SessionError, match="'w1'.*frozen parameter"):
        params["w1"].grad
    with pytest.raises(ShapeError, match=r"any parameter but frozen ones \(trainable=False\): w1, b1, w2"):
        train.grad_update(loss)
    with pytest.raises(TypeError, match="trainable= is True or False"):
        oc.param("w", output=2, trainable="no")


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_update_of_chosen_params_updates_only_them_and_matches_torch(backend):
    ctx = context(backend)
    loss, params = two_layer()
    update = train.grad_update(loss, params=[params["w2"]])
    assert [p.label for p in update.params] == ["w2"]
    written = nodes_written(update.computation.body)
    assert params["w2"].grad in written
    assert not {params["w1"].grad, params["b1"].grad} & set(written), "no gradient code for the layer left out"
    assert params["w1"].requires_grad, "the restriction holds for that one update only"
    adam = train.adam_update(update, lr=0.01)
    step = ctx.compile(update, adam)
    torch_loss, torch_params = torch_two_layer(frozen=("w1", "b1"))
    torch_adam = torch.optim.Adam([torch_params["w2"]], lr=0.01)
    train_beside_torch(ctx, step, params, torch_loss, torch_adam, torch_params, fixed={"w1": W1, "b1": B1},
                       trained=("w2",))
    assert [p.label for p in train.grad_update(loss).params] == ["w1", "b1", "w2"]


def test_grad_update_refuses_params_it_cannot_differentiate_naming_them():
    loss, params = two_layer(frozen=("b1",))
    elsewhere = oc.param("elsewhere", output=2)
    with pytest.raises(SessionError, match="'elsewhere' of params= is not in the graph of 'loss'"):
        train.grad_update(loss, params=[params["w1"], elsewhere])
    with pytest.raises(SessionError, match=r"'b1' of params= is frozen \(trainable=False\)"):
        train.grad_update(loss, params=[params["b1"]])
    with pytest.raises(TypeError, match="takes parameters"):
        train.grad_update(loss, params=[loss])
    with pytest.raises(ValueError, match="params= is empty"):
        train.grad_update(loss, params=[])


def test_a_training_checkpoint_saves_frozen_parameters(tmp_path):
    loss, params = two_layer(frozen=("w1",))
    update = train.grad_update(loss)
    sgd = train.sgd_update(update, lr=0.1)
    assert {"w1", "b1", "w2"} <= {e.name for e in train.checkpoint_entries(sgd)}
    ctx = oc.Context("interp")
    ctx.compile(update, sgd).run()
    train.save_checkpoint(tmp_path / "run.safetensors", sgd, context=ctx)
    ctx.set(params["w1"].value, np.zeros_like(W1))
    train.load_checkpoint(tmp_path / "run.safetensors", sgd, context=ctx)
    np.testing.assert_array_equal(ctx.get(params["w1"]), W1)


def test_mlp_with_out_is_usable_alone_and_summarized():
    m = nn.mlp(hid_dims=(4, 3), out=2, label="m")
    y = m(oc.tensor(X, batch=1))
    assert y.dims == (4, 2)
    frozen = oc.param("table", output=(3, 2), input=(), init=0.0, trainable=False)
    text = nn.summary([m, frozen, m.w_out])  # a parameter listed twice counts once
    assert text.splitlines() == [
        "parameter  dims    precision  count",
        "m_w1       (4, 3)  float32       12",
        "m_b1       (4,)    float32        4",
        "m_w2       (3, 4)  float32       12",
        "m_b2       (3,)    float32        3",
        "m_w_out    (2, 3)  float32        6",
        "table      (3, 2)  float32        6  frozen",
        "total                            43",
        "trainable                        37",
    ]
    assert nn.summary(m).splitlines()[-1].split() == ["total", "37"]


def test_summary_of_a_model_not_called_yet_names_the_parameter():
    with pytest.raises(ShapeError, match="'late_w'"):
        nn.summary(nn.linear(3, label="late"))
    with pytest.raises(TypeError, match="not a parameter"):
        nn.summary([oc.tensor(X)])
