"""The building blocks of ``ocannl.nn`` against PyTorch: forward values and gradients of linear,
embedding, batch norm (training, running statistics, evaluation), cross-entropy, the transformer
block and convolutions/pools whose stride does not divide the input; dropout's statistics, its
new mask per run and its bits on every backend (README, "Building blocks").

Every comparison is normwise: ``max|ours - torch| <= 1e-5 * max|torch|``, PyTorch computing in
float64 from the same float32 inputs and parameters.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from backend_params import backend_param, runs_here
import ocannl as oc
from ocannl import nn, train
from ocannl.lowlevel import prng_reference
from ocannl.random import RUN_UNIFORM, run_counter, uniform_like
from ocannl.tensor import subgraph

RTOL = 1e-5


EVERY = [backend_param("interp"), backend_param("c"), backend_param("metal"), backend_param("triton")]
"""Small programs run on every backend (Triton in its interpreter under TRITON_INTERPRET=1)."""
EVERY_TRITON_SLOW = [backend_param("interp"), backend_param("c"), backend_param("metal"), backend_param("triton", slow=True)]
"""Larger programs: the Triton interpreter takes several seconds over them."""

RNG = np.random.default_rng(16)


def f32(shape, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def assert_close(ours: np.ndarray, ref: torch.Tensor, what: str) -> None:
    ref = ref.detach().numpy()
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} vs PyTorch's {ref.shape}"
    err = float(np.max(np.abs(ours.astype(np.float64) - ref))) if ref.size else 0.0
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    assert err <= RTOL * max(scale, 1e-30), f"{what}: max error {err:.3g} vs max |value| {scale:.3g}"


def batched(values: np.ndarray, batch: int, label: str):
    """A parameter holding ``values`` with its first ``batch`` axes moved to the batch row, so
    the gradient of a block's input can be read (data tensors have none)."""
    p = oc.param(label, output=values.shape, init=values)
    axes = [f"a{i}" for i in range(values.ndim)]
    spec = f"{', '.join(axes)} => {', '.join(axes[:batch])} | {', '.join(axes[batch:])}"
    return p, oc.einsum(spec, p, label=f"{label}_batched")


def run_grad(backend: str, y: oc.Tensor, weights: np.ndarray, wrt: list, batch: int):
    """Compile ``loss = sum(y * weights)`` with its gradient on ``backend``, run once; return
    ``(y, [grad of each tensor in wrt], context)``."""
    y.materialize()
    loss = (y * oc.tensor(weights, batch=batch, label="loss_weights")).sum()
    update = train.grad_update(loss)
    ctx = oc.Context(backend)
    ctx.compile(update).run()
    return ctx.get(y.value), [ctx.get(t.grad) for t in wrt], ctx


def torch_grads(y: torch.Tensor, weights: np.ndarray, wrt: list[torch.Tensor]) -> list[torch.Tensor]:
    (y * torch.from_numpy(np.asarray(weights, np.float64))).sum().backward()
    return [t.grad for t in wrt]


def assert_matches_torch(value: np.ndarray, grad: np.ndarray, ref: torch.Tensor, wrt: torch.Tensor,
                         weights: np.ndarray, what: str) -> None:
    """``value`` and the gradient ``grad`` of ``sum(value * weights)`` equal PyTorch's ``ref`` and
    its gradient with respect to ``wrt`` (:func:`assert_close`)."""
    (ref_grad,) = torch_grads(ref, weights, [wrt])
    assert_close(value, ref, what)
    assert_close(grad, ref_grad, f"{what}: the gradient")


def leaf(values: np.ndarray) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


# ---------------------------------------------------------------------------------------------
# linear, embedding


@pytest.mark.parametrize("backend", EVERY)
def test_linear_matches_torch(backend):
    xv, wv, bv = f32((4, 3)), f32((5, 3)), f32(5)
    xp, x = batched(xv, 1, "x")
    lin = nn.linear(5, label="lin")
    out = lin(x)
    lin.w.set(wv)
    lin.b.set(bv)
    assert lin.params == [lin.w, lin.b] and lin.w.dims == (5, 3)
    weights = f32((4, 5))
    y, grads, _ = run_grad(backend, out, weights, [xp, lin.w, lin.b], batch=1)
    tx, tw, tb = leaf(xv), leaf(wv), leaf(bv)
    ty = F.linear(tx, tw, tb)
    assert_close(y, ty, "linear forward")
    for ours, ref, name in zip(grads, torch_grads(ty, weights, [tx, tw, tb]), "xwb"):
        assert_close(ours, ref, f"linear grad {name}")


def test_linear_without_bias_infers_its_output_from_use():
    lin = nn.linear(None, bias=False, label="proj")
    y = lin(oc.tensor(f32((2, 3)), batch=1)) + oc.tensor(f32((2, 7)), batch=1)
    assert lin.params == [lin.w] and lin.w.dims == (7, 3) and y.dims == (2, 7)


@pytest.mark.parametrize("backend", EVERY)
def test_embedding_matches_torch(backend):
    table = f32((6, 4))
    ids = np.array([[0, 5, 2], [2, 2, 1]], np.int32)
    emb = nn.embedding(6, 4, label="emb")
    assert emb.params[0] is emb.table and emb.table.dims == (6, 4)
    emb.params[0].set(table)
    y = emb(oc.tensor(ids, batch=2, label="ids"))
    assert (y.shape.batch, y.shape.output) == ((2, 3), (4,))
    weights = f32((2, 3, 4))
    ours, (grad,), _ = run_grad(backend, y, weights, [emb.table], batch=2)
    tt = leaf(table)
    ty = F.embedding(torch.from_numpy(ids.astype(np.int64)), tt)
    assert_close(ours, ty, "embedding forward")
    assert_close(grad, torch_grads(ty, weights, [tt])[0], "embedding grad (rows picked twice add up)")


def test_embedding_table_starts_standard_normal():
    emb = nn.embedding(100, 50, label="emb")
    values = emb.table.numpy()
    assert abs(values.mean()) < 0.05 and abs(values.std() - 1.0) < 0.05


# ---------------------------------------------------------------------------------------------
# batch norm


def _torch_batch_norm(xv: np.ndarray, gamma, beta, running_mean, running_var, training: bool):
    """PyTorch's batch norm on channel-last ``xv`` (moved to channel-first and back)."""
    tx = leaf(xv)
    first = tx.movedim(-1, 1) if tx.ndim > 2 else tx
    ty = F.batch_norm(first, running_mean, running_var, gamma, beta, training=training, momentum=0.1, eps=1e-5)
    return tx, (ty.movedim(1, -1) if tx.ndim > 2 else ty)


@pytest.mark.parametrize("backend", EVERY)
@pytest.mark.parametrize("shape", [(6, 3), (2, 3, 4, 5)], ids=["features", "images"])
def test_batch_norm_training_matches_torch(backend, shape):
    xv = f32(shape, 2.0) + 1.5
    gv, bv = f32(shape[-1]), f32(shape[-1])
    xp, x = batched(xv, 1, "x")
    bn = nn.batch_norm(label="bn")
    out = bn(x)
    bn.gamma.set(gv)
    bn.beta.set(bv)
    weights = f32(shape)
    y, grads, ctx = run_grad(backend, out, weights, [xp, bn.gamma, bn.beta], batch=1)

    tg, tb = leaf(gv), leaf(bv)
    running_mean, running_var = torch.zeros(shape[-1], dtype=torch.float64), torch.ones(shape[-1], dtype=torch.float64)
    tx, ty = _torch_batch_norm(xv, tg, tb, running_mean, running_var, training=True)
    assert_close(y, ty, "batch_norm forward")
    for ours, ref, name in zip(grads, torch_grads(ty, weights, [tx, tg, tb]), ("x", "gamma", "beta")):
        assert_close(ours, ref, f"batch_norm grad {name}")
    assert_close(ctx.get(bn.running_mean.value), running_mean, "running mean after one step")
    assert_close(ctx.get(bn.running_var.value), running_var, "running variance (unbiased) after one step")


@pytest.mark.parametrize("backend", EVERY)
def test_batch_norm_evaluation_uses_the_running_statistics(backend):
    batches = [f32((5, 2, 3), 3.0) + 4.0 for _ in range(3)]
    gv, bv = f32(3), f32(3)
    bn = nn.batch_norm(label="bn")
    data = oc.tensor(np.stack(batches), batch=2, label="batches")
    step_n = oc.IndexSymbol("step_n", 3)
    train_out = bn(data[step_n])
    bn.gamma.set(gv)
    bn.beta.set(bv)
    ctx = oc.Context(backend)
    step = ctx.compile(train.grad_update(train_out.sum()))
    for i in range(3):
        step.run(step_n=i)
    probe = f32((4, 2, 3), 2.0)
    eval_out = bn(oc.tensor(probe, batch=1, label="probe"), train=False)
    ctx.compile(eval_out.materialize()).run()

    running_mean, running_var = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    for xv in batches:
        _torch_batch_norm(xv, leaf(gv), leaf(bv), running_mean, running_var, training=True)
    assert_close(ctx.get(bn.running_mean.value), running_mean, "running mean after three steps")
    assert_close(ctx.get(bn.running_var.value), running_var, "running variance after three steps")
    _, ty = _torch_batch_norm(probe, leaf(gv), leaf(bv), running_mean, running_var, training=False)
    assert_close(ctx.get(eval_out.value), ty, "batch_norm evaluation forward")


def test_batch_norm_needs_more_than_one_value_per_channel():
    bn = nn.batch_norm(label="bn")
    y = bn(oc.tensor(f32((1, 4)), batch=1, label="single"))
    with pytest.raises(oc.errors.ShapeError, match="more than one value per channel"):
        oc.Context("interp").compile(y)


def test_batch_norm_rejects_another_channel_count():
    bn = nn.batch_norm(label="bn")
    bn(oc.tensor(f32((2, 4)), batch=1))
    with pytest.raises(oc.errors.ShapeError, match="called on 3 channels"):
        bn(oc.tensor(f32((2, 3)), batch=1, label="other"))


# ---------------------------------------------------------------------------------------------
# cross-entropy


@pytest.mark.parametrize("backend", EVERY)
@pytest.mark.parametrize("offset", [0.0, 1e4], ids=["plain", "large_logits"])
@pytest.mark.parametrize("batch", [(5,), (2, 3)], ids=["examples", "sequences"])
def test_cross_entropy_matches_torch(backend, offset, batch):
    """Mean over every batch cell (examples, or positions of sequences); logits around 1e4 would
    overflow ``exp`` without the shift by the maximum."""
    logits_v = f32((*batch, 7), 2.0) + np.float32(offset)
    classes = RNG.integers(0, 7, batch)
    targets = np.eye(7, dtype=np.float32)[classes]
    lp, logits = batched(logits_v, len(batch), "logits")
    loss = nn.cross_entropy(logits, oc.tensor(targets, batch=len(batch), label="targets"))
    assert loss.dims == ()
    ours, (grad,), _ = run_grad(backend, loss, np.float32(1.0), [lp], batch=0)
    assert np.isfinite(ours).all()
    tl = leaf(logits_v)
    ref = F.cross_entropy(tl.reshape(-1, 7), torch.from_numpy(classes.reshape(-1)))
    assert_close(ours, ref, "cross_entropy")
    assert_close(grad, torch_grads(ref, np.float32(1.0), [tl])[0], "cross_entropy grad")


# ---------------------------------------------------------------------------------------------
# transformer block


def _torch_transformer(x, blk, params, mask: np.ndarray | None):
    """The pre-norm block in PyTorch from the same parameters (ours' memory layouts)."""
    g1, b1, wq, wk, wv, wo, g2, b2, w1, c1, w2, c2 = params
    d_k = wq.shape[1]

    def norm(h, g, b):
        return F.layer_norm(h, h.shape[-1:], g, b, eps=1e-5)

    z = norm(x, g1, b1)
    q, k, v = (torch.einsum("hdm,bsm->bshd", w, z) for w in (wq, wk, wv))
    scores = torch.einsum("bshd,bthd->bsth", q, k) / d_k**0.5
    if mask is not None:
        scores = scores.masked_fill(torch.from_numpy(mask == 0)[None, :, :, None], float("-inf"))
    attn = scores.softmax(dim=2)
    h = x + torch.einsum("mhe,bshe->bsm", wo, torch.einsum("bsth,bthe->bshe", attn, v))
    f = F.linear(torch.relu(F.linear(norm(h, g2, b2), w1, c1)), w2, c2)
    return h + f


@pytest.mark.parametrize("backend", EVERY_TRITON_SLOW)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_transformer_block_matches_torch(backend, causal):
    B, S, D, H, DK, DFF = 2, 4, 6, 2, 3, 8
    xv = f32((B, S, D))
    xp, x = batched(xv, 2, "x")
    blk = nn.transformer_block(num_heads=H, d_k=DK, d_ff=DFF, label="blk", causal=causal)
    y = blk(x)
    assert y.dims == (B, S, D)
    values = []
    for p in blk.params:
        v = f32(p.dims, 0.5) + (1.0 if p.label.endswith("gamma") else 0.0)
        p.set(v)
        values.append(v)
    weights = f32((B, S, D))
    ours, grads, _ = run_grad(backend, y, weights, [xp, *blk.params], batch=2)
    tx, tparams = leaf(xv), [leaf(v) for v in values]
    mask = np.tril(np.ones((S, S), np.float32)) if causal else None
    ty = _torch_transformer(tx, blk, tparams, mask)
    assert_close(ours, ty, "transformer_block forward")
    refs = torch_grads(ty, weights, [tx, *tparams])
    for ours_g, ref, p in zip(grads, refs, [xp, *blk.params]):
        assert_close(ours_g, ref, f"transformer_block grad {p.label}")


def test_transformer_block_params_are_all_its_weights():
    blk = nn.transformer_block(num_heads=2, d_k=4, d_ff=16, label="blk")
    blk(oc.tensor(f32((1, 3, 8)), batch=2))
    assert [p.dims for p in blk.params] == [(8,), (8,), (2, 4, 8), (2, 4, 8), (2, 4, 8), (8, 2, 4), (8,), (8,),
                                            (16, 8), (16,), (8, 16), (8,)]


# ---------------------------------------------------------------------------------------------
# convolutions and pools whose stride does not divide the input (PyTorch's sizes)


def _channels_first(a: torch.Tensor) -> torch.Tensor:
    return a.permute(0, 3, 1, 2)


@pytest.mark.parametrize("backend", EVERY)
@pytest.mark.parametrize("size, kernel, stride, padded", [(7, 2, 2, False), (5, 3, 2, True), (6, 3, 4, False)],
                         ids=["valid_7_k2_s2", "padded_5_k3_s2", "valid_6_k3_s4"])
def test_conv2d_with_a_stride_not_dividing_the_input(backend, size, kernel, stride, padded):
    xv, kv, bv = f32((2, size, size, 3)), f32((4, kernel, kernel, 3)), f32(4)
    xp, x = batched(xv, 1, "x")
    conv = nn.conv2d(4, kernel_size=kernel, stride=stride, use_padding=padded, label="conv")
    y = conv(x)
    conv.kernel.set(kv)
    conv.bias.set(bv)
    tx, tk, tb = leaf(xv), leaf(kv), leaf(bv)
    ty = F.conv2d(_channels_first(tx), _channels_first(tk), tb, stride=stride,
                  padding=kernel // 2 if padded else 0).permute(0, 2, 3, 1)
    assert y.dims == tuple(ty.shape)
    weights = f32(y.dims)
    ours, grads, _ = run_grad(backend, y, weights, [xp, conv.kernel, conv.bias], batch=1)
    assert_close(ours, ty, "conv2d forward")
    for g, ref, name in zip(grads, torch_grads(ty, weights, [tx, tk, tb]), ("x", "kernel", "bias")):
        assert_close(g, ref, f"conv2d grad {name}")


@pytest.mark.parametrize("backend", EVERY)
@pytest.mark.parametrize("size, padded", [(10, False), (9, True), (8, True)], ids=["valid_10", "padded_9", "padded_8"])
def test_dilated_strided_einsum_convolution_has_torch_sizes(backend, size, padded):
    """``2*o<+2*k`` / ``2*o=+2*k`` (stride 2, dilation 2, kernel 3: span 5) over sizes the stride
    does not always divide, against ``F.conv1d`` (padding 2 on both sides when padded)."""
    xv, kv = f32((2, size, 3)), f32((4, 3, 3))
    xp, x = batched(xv, 1, "x")
    kp = oc.param("k", output=4, input=(3, 3), init=kv)
    sign = "=" if padded else "<"
    y = oc.einsum(f"... | 2*o{sign}+2*k, ic; k, ic -> oc => ... | o, oc", x, kp)
    tx, tk = leaf(xv), leaf(kv)
    ty = F.conv1d(tx.permute(0, 2, 1), tk.permute(0, 2, 1), stride=2, dilation=2,
                  padding=2 if padded else 0).permute(0, 2, 1)
    assert y.dims == tuple(ty.shape)
    weights = f32(y.dims)
    ours, grads, _ = run_grad(backend, y, weights, [xp, kp], batch=1)
    assert_close(ours, ty, "dilated convolution forward")
    for g, ref, name in zip(grads, torch_grads(ty, weights, [tx, tk]), ("x", "kernel")):
        assert_close(g, ref, f"dilated convolution grad {name}")


@pytest.mark.parametrize("backend", EVERY)
@pytest.mark.parametrize("pool", ["max", "avg"])
def test_pools_with_a_stride_not_dividing_the_input(backend, pool):
    xv = f32((2, 5, 7, 3))
    xp, x = batched(xv, 1, "x")
    y = (nn.max_pool2d if pool == "max" else nn.avg_pool2d)(x, stride=2, window_size=2)
    tx = leaf(xv)
    torch_pool = F.max_pool2d if pool == "max" else F.avg_pool2d
    ty = torch_pool(_channels_first(tx), kernel_size=2, stride=2).permute(0, 2, 3, 1)
    assert y.dims == tuple(ty.shape) == (2, 2, 3, 3)
    weights = f32(y.dims)
    ours, (grad,), _ = run_grad(backend, y, weights, [xp], batch=1)
    assert_close(ours, ty, f"{pool}_pool2d forward")
    assert_close(grad, torch_grads(ty, weights, [tx])[0], f"{pool}_pool2d grad")


@pytest.mark.parametrize("backend", EVERY)
def test_max_pool_returns_the_window_values_and_grads_the_first_maximum(backend):
    """Each result is one of its window's values, bit for bit (a negative zero stays negative,
    as PyTorch's: no zero kernel is added to the terms), and the one operand is the pooled input;
    at a tie (a window of equal values) the gradient goes to the first maximum in row-major
    order, as PyTorch's."""
    xv = f32((2, 4, 6, 3))
    xv[0, :2, :2, 0] = -0.0
    xv[1, 2:, 2:4, 1] = 1.5
    xp, x = batched(xv, 1, "x")
    y = nn.max_pool2d(x)
    assert len(y.operands) == 1
    tx = torch.tensor(xv, requires_grad=True)
    ty = F.max_pool2d(_channels_first(tx), kernel_size=2, stride=2).permute(0, 2, 3, 1)
    weights = f32(y.dims)
    ours, (grad,), _ = run_grad(backend, y, weights, [xp], batch=1)
    assert ours.tobytes() == ty.detach().numpy().tobytes()
    assert np.signbit(ours[0, 0, 0, 0])
    (ty * torch.from_numpy(weights)).sum().backward()
    assert np.array_equal(grad != 0, tx.grad.numpy() != 0)
    assert_close(grad, tx.grad.double(), "max_pool2d grad")


# ---------------------------------------------------------------------------------------------
# dropout


def _draw_of(y: oc.Tensor) -> oc.Tensor:
    (draw,) = [u for u in subgraph(y) if u.definition is RUN_UNIFORM]
    return draw


def _reference_mask(seed: int, stream: int, run: int, n: int, rate: float) -> np.ndarray:
    """The bits the module docstring of ``ocannl/random.py`` promises, from the numpy oracle."""
    key = np.array([seed, stream, 0, 0], np.uint32)
    run_key = prng_reference.threefry4x32(key, np.array([run, 0, 0, 0], np.uint32))
    counters = np.zeros((n, 4), np.uint32)
    counters[:, 0] = np.arange(n, dtype=np.uint32)
    u = prng_reference.uniform1_float32(prng_reference.threefry4x32(np.broadcast_to(run_key, (n, 4)), counters))
    return np.where(u < np.float32(rate), np.float32(0.0), np.float32(1.0 / (1.0 - rate)))


def _dropout_runs(backend: str, shape, rate: float, runs: int, seed: int | None = None):
    """The masks of ``runs`` consecutive runs of ``nn.dropout(ones, rate)``, and the draw."""
    if seed is not None:
        oc.seed(seed)
    y = nn.dropout(oc.tensor(np.ones(shape, np.float32), batch=1, label="ones"), rate).materialize()
    ctx = oc.Context(backend)
    routine = ctx.compile(y)
    masks = []
    for _ in range(runs):
        routine.run()
        masks.append(ctx.get(y.value))
    return masks, _draw_of(y), ctx


def test_dropout_rate_over_20000_draws():
    """Each run's 20,000 cells drop a fraction within 0.02 of the rate (the standard error is
    0.0032); pooled over ten runs, within 2% of it."""
    rate = 0.3
    masks, _, _ = _dropout_runs("c" if runs_here("c") else "interp", (20, 1000), rate, runs=10)
    for mask in masks:
        dropped = float(np.mean(mask == 0))
        assert abs(dropped - rate) <= 0.02, f"dropped fraction {dropped} for rate {rate}"
        np.testing.assert_array_equal(np.unique(mask), np.float32([0.0, 1.0 / (1.0 - rate)]))
    pooled = float(np.mean([np.mean(m == 0) for m in masks]))
    assert abs(pooled - rate) <= 0.02 * rate, f"dropped fraction {pooled} over 200,000 draws for rate {rate}"
    assert abs(float(np.mean(masks)) - 1.0) < 0.01  # the expectation is kept


@pytest.mark.parametrize("backend", EVERY)
def test_dropout_bits_on_every_backend_equal_the_reference(backend):
    rate, shape = 0.25, (4, 6)
    masks, draw, ctx = _dropout_runs(backend, shape, rate, runs=3, seed=7)
    for run, mask in enumerate(masks, 1):
        expected = _reference_mask(7, draw.id, run, int(np.prod(shape)), rate).reshape(shape)
        np.testing.assert_array_equal(mask, expected, err_msg=f"run {run}")
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])
    assert ctx.get(run_counter(draw).value).item() == 3


def test_dropout_is_reproducible_from_the_seed():
    first, _, _ = _dropout_runs("interp", (3, 50), 0.5, runs=2, seed=11)
    oc.session.reset()
    again, _, _ = _dropout_runs("interp", (3, 50), 0.5, runs=2, seed=11)
    oc.session.reset()
    other, _, _ = _dropout_runs("interp", (3, 50), 0.5, runs=2, seed=12)
    for a, b, c in zip(first, again, other):
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)


@pytest.mark.parametrize("backend", EVERY)
def test_dropout_gradient_uses_the_forward_mask(backend):
    rate, xv = 0.5, f32((3, 8))
    xp, x = batched(xv, 1, "x")
    y = nn.dropout(x, rate)
    mask = next(u for u in subgraph(y) if u.label.endswith("_mask"))
    weights = f32((3, 8))
    update = train.grad_update((y.materialize() * oc.tensor(weights, batch=1)).sum())
    ctx = oc.Context(backend)
    step = ctx.compile(update)
    for _ in range(2):  # a new mask each run; the gradient follows it
        step.run()
        m = ctx.get(mask.value)
        assert 0 < np.count_nonzero(m) < m.size
        np.testing.assert_array_equal(ctx.get(y.value), xv * m)
        np.testing.assert_array_equal(ctx.get(xp.grad), weights * m)


def test_dropout_is_the_identity_when_not_training_or_at_rate_zero():
    x = oc.tensor(f32((2, 3)), batch=1)
    assert nn.dropout(x, 0.4, train=False) is x
    assert nn.dropout(x, 0.0) is x
    assert not np.any(nn.dropout(x, 1.0).numpy())


@pytest.mark.parametrize("rate", [-0.1, 1.5, True, "0.5"])
def test_dropout_rate_must_be_a_probability(rate):
    with pytest.raises(ValueError, match="rate is a probability"):
        nn.dropout(oc.tensor(f32((2, 3)), batch=1), rate)


def test_a_run_time_draw_is_not_differentiable():
    w = oc.param("w", output=3, init=1.0)
    assert not uniform_like(w).requires_grad


def _dropout_program():
    y = nn.dropout(oc.tensor(np.ones((4, 6), np.float32), batch=1, label="ones"), 0.5).materialize()
    return y, run_counter(_draw_of(y))


@pytest.mark.parametrize("backend", EVERY)
def test_a_saved_run_counter_resumes_the_mask_sequence(backend, tmp_path):
    """``oc.save`` keeps the run counter (a dims-``()`` uint32 tensor, read back as dims ``()``);
    loaded into a fresh session, the next run draws what an uninterrupted third run draws."""
    y, counter = _dropout_program()
    ctx = oc.Context(backend)
    routine = ctx.compile(y)
    routine.run()
    routine.run()
    assert ctx.get(counter.value).shape == () and counter.numpy() == 2
    oc.save(tmp_path / "counter.safetensors", [counter])
    routine.run()
    third = ctx.get(y.value)

    oc.session.reset()
    y, counter = _dropout_program()
    oc.load(tmp_path / "counter.safetensors", [counter])
    ctx = oc.Context(backend)
    ctx.compile(y).run()
    np.testing.assert_array_equal(ctx.get(y.value), third)
