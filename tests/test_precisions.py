"""Precisions from the host to every backend and back: bfloat16 values (never their bit patterns),
64-bit integers kept whole, values a precision cannot hold refused with the tensor named; training
with 16-bit parameters (the ``param_precision`` setting) and float32 gradients and optimizer state.

Each test runs on every backend available here (the Triton one under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import numpy as np
import pytest

from backend_params import default_context
import ocannl as oc
from ocannl import data, train
from ocannl.errors import BackendUnavailable, OutOfBoundsError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.dtypes import DTypeError

BACKENDS = ("interp", "c", "metal", "triton")


@pytest.fixture(params=BACKENDS)
def ctx(request) -> oc.Context:
    """A context on the backend, made the default one (``t.numpy()`` runs there)."""
    return default_context(request.param)


def bf16(values) -> np.ndarray:
    """``values`` rounded to bfloat16, as float32 (the host's view of a bfloat16 buffer)."""
    return dtypes.bfloat16_bits_to_float32(dtypes.float32_to_bfloat16_bits(np.asarray(values, np.float32)))


# ---------------------------------------------------------------------------------------------
# bfloat16


def test_bfloat16_data_computes_with_its_values(ctx):
    x = oc.tensor(np.array([1.5, -2.25, 3.0, 1.1], np.float32), dtype="bfloat16")
    y = x * 1
    assert y.dtype is dtypes.bfloat16
    expected = bf16([1.5, -2.25, 3.0, 1.1])
    assert expected[3] == np.float32(1.1015625)  # 1.1 is not a bfloat16: it rounds
    np.testing.assert_array_equal(y.numpy(), expected)
    np.testing.assert_array_equal(x.numpy(), expected)


def test_float64_data_rounds_once_to_bfloat16():
    """Just above the midpoint of 1 and the next bfloat16 (1 + 2**-7): through float32 first,
    the value would become the midpoint itself and round to 1."""
    x = 1 + 2**-8 + 2**-40
    assert np.float32(x) == np.float32(1 + 2**-8)
    t = oc.tensor(np.array([x, -x, 1 + 2**-8]), dtype="bfloat16")
    np.testing.assert_array_equal(t.numpy(), [1 + 2**-7, -(1 + 2**-7), 1.0])  # the exact tie: to even


def test_bfloat16_param_init_array_is_its_value(ctx):
    w = oc.param("w", output=3, init=np.array([1.5, -2.25, 3.0]), dtype="bfloat16")
    y = (w * 2).materialize()
    ctx.compile(y).run()
    np.testing.assert_array_equal(ctx.get(w.value), [1.5, -2.25, 3.0])
    np.testing.assert_array_equal(ctx.get(y.value), [3.0, -4.5, 6.0])


def test_bfloat16_set_and_get_round_to_bfloat16(ctx):
    w = oc.param("w", output=3, init=0.0, dtype="bfloat16")
    y = (w * 2).materialize()
    routine = ctx.compile(y)
    ctx.set(w.value, np.array([0.1, 1000.0, -7.0]))
    routine.run()
    assert ctx.get(w.value).dtype == np.float32
    np.testing.assert_array_equal(ctx.get(w.value), bf16([0.1, 1000.0, -7.0]))
    np.testing.assert_array_equal(ctx.get(y.value), 2 * bf16([0.1, 1000.0, -7.0]))
    w.set(np.array([0.5, 0.25, -1.0]))  # through the tensor: every context holding it
    routine.run()
    np.testing.assert_array_equal(ctx.get(y.value), [1.0, 0.5, -2.0])


def test_bfloat16_tensor_set_before_compiling(ctx):
    w = oc.param("w", output=2, input=(), dtype="bfloat16")
    w.set(np.array([3.0, -0.75]))
    np.testing.assert_array_equal((w * 1).numpy(), [3.0, -0.75])


# ---------------------------------------------------------------------------------------------
# Training with 16-bit parameters (the param_precision setting)

HALF = ("bfloat16", "float16")


@pytest.fixture
def param_precision(monkeypatch):
    """Set ``OCANNL_PARAM_PRECISION`` for the test: ``param_precision("bfloat16")``."""
    return lambda name: monkeypatch.setenv("OCANNL_PARAM_PRECISION", name)


def _moons_model(n_points: int, epochs: int, hidden: int = 16, adam: bool = False):
    """A 2-``hidden``-``hidden``-1 relu MLP on the half moons (the demo's model and loss, sized
    down), its parameters created without ``dtype=`` so that the ``param_precision`` setting
    chooses; trained by the demo's SGD schedule, or by AdamW. Returns ``(train, params)``:
    ``train(ctx)`` runs every epoch on ``ctx`` and returns the summed loss of each epoch."""
    points, labels = data.moons(n_points, noise=0.1, seed=0)
    n_batches, steps = n_points // 10, epochs * (n_points // 10)
    xs = oc.tensor(data.batches(points, 10), batch=2, label="xs")
    ys = oc.tensor(data.batches(labels, 10), batch=2, label="ys")
    batch_n, step_n = oc.IndexSymbol("batch_n", n_batches), oc.IndexSymbol("step_n", steps)
    w1, b1 = oc.param("w1", output=hidden), oc.param("b1", output=hidden, init=0.0)
    w2, b2 = oc.param("w2", output=hidden), oc.param("b2", output=hidden, init=0.0)
    w3 = oc.param("w3")
    h = oc.relu(w2 @ oc.relu(w1 @ xs[batch_n] + b1) + b2)
    loss = oc.relu(1 - ys[batch_n] * (w3 @ h)).mean(label="loss")
    update = train.grad_update(loss)
    if adam:
        step = train.adam_update(update, lr=0.02, weight_decay=1e-2, decoupled=True)
    else:
        step = train.sgd_update(update, lr=0.1 * (2 * steps - step_n) / steps, weight_decay=1e-4)

    def run(ctx: oc.Context) -> list[float]:
        routine = ctx.compile(update, step)
        epoch_losses = []
        for e in range(epochs):
            total = 0.0
            for b in range(n_batches):
                routine.run(batch_n=b, **({} if adam else {"step_n": e * n_batches + b}))
                total += float(ctx.get(loss.value))
            epoch_losses.append(total)
        return epoch_losses

    return run, [w1, b1, w2, b2, w3]


def _rounded(dtype: str, values: np.ndarray) -> np.ndarray:
    """``values`` rounded to ``dtype`` (as float32)."""
    return bf16(values) if dtype == "bfloat16" else np.asarray(values, np.float32).astype(np.float16).astype(np.float32)


def test_param_precision_setting_chooses_the_parameters_precision(param_precision):
    assert oc.param("w", output=2).dtype is dtypes.float32  # the default
    param_precision("bfloat16")
    w = oc.param("w", output=2)
    assert w.dtype is dtypes.bfloat16
    assert w.grad.dtype is dtypes.float32  # a gradient is a sum: float32
    assert oc.param("v", output=2, dtype="float16").dtype is dtypes.float16  # dtype= wins
    assert oc.param("u", output=2, dtype="float32").dtype is dtypes.float32
    param_precision("int32")
    with pytest.raises(DTypeError, match=r"param_precision \(from OCANNL_PARAM_PRECISION\).*got 'int32'"):
        oc.param("w", output=2)
    param_precision("bfloat17")
    with pytest.raises(DTypeError, match=r"param_precision.*got 'bfloat17'"):
        oc.param("w", output=2)


@pytest.mark.parametrize("dtype", HALF)
def test_half_gradients_accumulate_in_float32(ctx, dtype, param_precision):
    """3001 is no bfloat16 (nor float16): a 16-bit gradient cell would hold 3008 (or 3000) after
    the sum, and a sum rounding into it term by term would stall at 256 (bfloat16) or 2048
    (float16). The gradient of a 16-bit bias over a batch of 3001 counts every term, as does a
    contraction of 16-bit weights with float32 data."""
    param_precision(dtype)
    b = oc.param("b", output=1, init=0.5)
    w = oc.param("w", output=1, input=3001, init=1.0)
    xs = oc.tensor(np.ones((3001, 1), np.float32), batch=1, label="xs")
    ones = oc.tensor(np.ones(3001, np.float32), label="ones")
    y = ((xs + b).sum() + (w @ ones).sum()).sum(label="y")
    assert b.dtype is getattr(dtypes, dtype) and (w @ ones).dtype is dtypes.float32
    update = train.grad_update(y)
    ctx.compile(update).run()
    assert float(ctx.get(y.value)) == 3001 * 1.5 + 3001
    assert b.grad.dtype is dtypes.float32
    np.testing.assert_array_equal(ctx.get(b.grad), [3001.0])
    np.testing.assert_array_equal(ctx.get(w.grad), np.ones((1, 3001), np.float32))


@pytest.mark.parametrize("dtype", HALF)
def test_half_params_keep_float32_optimizer_state(ctx, dtype, param_precision):
    """Adam's moments and step count are float32; the new weight is computed in float32 from
    them and rounded once to the parameter's precision."""
    param_precision(dtype)
    w = oc.param("w", output=3, input=(), init=np.array([1.0, -0.5, 0.25]))
    x = oc.tensor(np.array([0.3, 0.7, -1.1], np.float32), label="x")
    loss = (w * x).sum(label="loss")
    update = train.grad_update(loss)
    adam = train.adam_update(update, lr=0.01, weight_decay=0.1, decoupled=True)
    ctx.compile(update, adam).run()
    state = train.optimizer_state(w)
    assert {name: node.dtype for name, node in state.items()} == \
        {"adam_step": dtypes.float32, "adam_m": dtypes.float32, "adam_v": dtypes.float32}
    g = np.array([0.3, 0.7, -1.1], np.float32)
    np.testing.assert_array_equal(ctx.get(w.grad), g)
    m, v = ctx.get(state["adam_m"]), ctx.get(state["adam_v"])
    np.testing.assert_allclose(m, 0.1 * g, rtol=1e-6)
    np.testing.assert_allclose(v, 0.001 * g * g, rtol=1e-6)
    assert not np.array_equal(v, _rounded(dtype, v))  # not rounded to 16 bits
    p0 = np.array([1.0, -0.5, 0.25])
    expected = p0 * (1 - 0.01 * 0.1) - 0.01 * np.sign(g)  # the first Adam step is lr * sign(g)
    new = ctx.get(w.value)
    np.testing.assert_array_equal(new, _rounded(dtype, new))  # values of the parameter's precision
    np.testing.assert_array_equal(new, _rounded(dtype, expected))


@pytest.mark.parametrize("dtype", HALF)
def test_half_params_train(ctx, dtype, param_precision):
    param_precision(dtype)
    run, params = _moons_model(n_points=80, epochs=6, hidden=8)
    losses = run(ctx)
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.6 * losses[0], losses
    for p in params:
        assert p.dtype is getattr(dtypes, dtype) and p.grad.dtype is dtypes.float32
        value = ctx.get(p.value)
        np.testing.assert_array_equal(value, _rounded(dtype, value))  # 16-bit values, not bit patterns


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("adam", [False, True], ids=["sgd", "adamw"])
def test_half_params_same_training_on_every_backend(dtype, adam, param_precision):
    """A few epochs from the same initial weights: C gives the interpreter's bits; Metal and
    Triton, whose sums may run in another order, stay within a few 16-bit rounding steps."""
    param_precision(dtype)
    run, params = _moons_model(n_points=40, epochs=2, hidden=8, adam=adam)
    reference = oc.Context("interp")
    ref_losses = run(reference)
    for backend in ("c", "metal", "triton"):
        try:
            ctx = oc.Context(backend)
        except BackendUnavailable:
            continue
        losses = run(ctx)
        for p in params:
            if backend == "c":
                np.testing.assert_array_equal(ctx.get(p.value), reference.get(p.value), err_msg=p.label)
            else:
                # two 16-bit rounding steps (bfloat16 has 8 significant bits; these give equal bits today)
                np.testing.assert_allclose(ctx.get(p.value), reference.get(p.value), rtol=2**-7, atol=2**-12,
                                           err_msg=f"{backend} {p.label}")
        if backend == "c":
            assert losses == ref_losses
        else:
            np.testing.assert_allclose(losses, ref_losses, rtol=1e-3)


@pytest.mark.parametrize("dtype", HALF)
def test_half_moons_converges_on_c(dtype, param_precision):
    """The full demo schedule (800 points, 80 epochs) with 16-bit parameters: under a second
    each (the hinge loss reaches 0 from about 12)."""
    param_precision(dtype)
    try:
        ctx = oc.Context("c")
    except BackendUnavailable as e:
        pytest.skip(str(e))
    run, _ = _moons_model(n_points=800, epochs=80)
    losses = run(ctx)
    assert losses[-1] < 0.1, losses[::10]


# ---------------------------------------------------------------------------------------------
# 64-bit integers


def test_int64_data_keeps_its_width(ctx):
    x = oc.tensor(np.array([2**40, 3]), label="big")
    assert x.dtype is dtypes.int64
    np.testing.assert_array_equal(x.numpy(), [2**40, 3])
    assert x.numpy().dtype == np.int64
    assert (x * 1).numpy().tolist() == [2**40, 3]  # int64 arithmetic (tests/test_integer_arithmetic.py)


def test_int64_values_survive_a_gather(ctx):
    """``take`` keeps its table's precision: int64 cells past 2**32 come back whole."""
    table = oc.tensor(np.array([[2**40 + 1, -(2**50) - 3], [7, 2**62 + 5]]), label="table")
    picked = oc.take(table, oc.tensor(np.array([1, 0, 1], np.int32)))
    assert picked.dtype is dtypes.int64
    np.testing.assert_array_equal(picked.numpy(), [[7, 2**62 + 5], [2**40 + 1, -(2**50) - 3], [7, 2**62 + 5]])


def test_narrower_integer_data_keeps_int32_and_uint32():
    assert oc.tensor(np.array([1, 2], np.int32)).dtype is dtypes.int32
    assert oc.tensor(np.array([1, 2], np.int16)).dtype is dtypes.int32
    assert oc.tensor(np.array([1, 2], np.uint16)).dtype is dtypes.int32
    assert oc.tensor(np.array([2**32 - 1], np.uint32)).dtype is dtypes.uint32
    assert oc.tensor(np.array([1.5])).dtype is dtypes.float32


def test_values_that_do_not_fit_are_refused_naming_value_and_tensor():
    with pytest.raises(DTypeError, match=r"'ids'.*1099511627776 does not fit int32.*dtype='int64'"):
        oc.tensor(np.array([3, 2**40]), dtype="int32", label="ids")
    with pytest.raises(DTypeError, match=r"'counts'.*18446744073709551615 does not fit int64"):
        oc.tensor(np.array([2**64 - 1, 1], np.uint64), label="counts")
    with pytest.raises(DTypeError, match=r"'u'.*-1 does not fit uint32"):
        oc.tensor(np.array([-1, 1]), dtype="uint32", label="u")
    with pytest.raises(DTypeError, match=r"'n'.*nan has no int64 equivalent"):
        oc.tensor(np.array([np.nan]), dtype="int64", label="n")
    offsets = oc.param("offsets", output=2, input=(), init=np.array([1, 2**40]), dtype="int32")
    with pytest.raises(DTypeError, match=r"parameter 'offsets'.*1099511627776 does not fit int32"):
        oc.Context("interp").compile(offsets * 1)


def test_uint64_values_that_fit_become_int64(ctx):
    x = oc.tensor(np.array([2**63 - 1, 5], np.uint64), label="u")
    assert x.dtype is dtypes.int64
    np.testing.assert_array_equal(x.numpy(), [2**63 - 1, 5])


def test_set_refuses_what_the_node_cannot_hold(ctx):
    w = oc.param("w", output=2, init=0.0)
    ids = oc.tensor(np.array([0, 1], np.int32), label="ids")
    y = (oc.take(w, ids) * 1).materialize()
    ctx.compile(y).run()
    with pytest.raises(DTypeError, match=r"ids.*2147483648 does not fit int32"):
        ctx.set(ids.value, np.array([0, 2**31]))
    with pytest.raises(DTypeError, match=r"ids.*inf has no int32 equivalent"):
        ctx.set(ids.value, np.array([0.0, np.inf]))
    np.testing.assert_array_equal(ctx.get(ids.value), [0, 1])  # unchanged


def test_take_index_past_32_bits_is_out_of_bounds(ctx):
    """``2**32 + 2`` narrowed to 32 bits would be row 2: the bounds check sees it whole."""
    table = oc.tensor(np.arange(12, dtype=np.float32).reshape(4, 3), label="table")
    picked = oc.take(table, oc.tensor(np.array([2**32 + 2, 1]), label="ids"))
    with pytest.raises(OutOfBoundsError):
        picked.numpy()


def test_take_with_wide_indices_reads_the_right_rows(ctx):
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    for ids in (np.array([3, 0, 2]), np.array([3, 0, 2], np.uint32), np.array([3, 0, 2], np.uint64)):
        picked = oc.take(oc.tensor(table), oc.tensor(ids))
        np.testing.assert_array_equal(picked.numpy(), table[[3, 0, 2]])
    large_uint32 = oc.take(oc.tensor(table), oc.tensor(np.array([2**32 - 1], np.uint32)))
    with pytest.raises(OutOfBoundsError):  # not -1 wrapped to a row
        large_uint32.numpy()
