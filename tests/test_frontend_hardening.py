"""Frontend cases that used to compute a wrong number silently or answer in the wrong words:
hyper-parameters given as data tensors, shapes read (or not) before ``oc.take``, ``oc.param``'s
arguments, gradients at ties of a maximum, and reading intermediate values
(docs/semantics.md)."""

import numpy as np
import pytest

from backend_params import backend_param
import ocannl as oc
from ocannl import nn, train
from ocannl.errors import IndexBindingError, SessionError, ShapeError
from ocannl.lowlevel.assignments import Accum, Computation
from ocannl.lowlevel.scalar_ops import Binop
from ocannl.lowlevel.tnode import TNode
from ocannl.shape.projections import identity_projections


CPU = [backend_param("interp"), backend_param("c")]
"""Every item runs on these."""
EVERY = CPU + [backend_param("metal"), backend_param("triton")]
"""The gradient at ties is backend code: one quick case runs everywhere."""
EVERY_SLOW = CPU + [backend_param("metal", slow=True), backend_param("triton", slow=True)]


def f32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# Item 4: a data tensor as the learning rate holds its value on the context.


def _one_step(backend: str, lr, optimizer=train.sgd_update):
    """One optimizer step on ``loss = w * 1`` from ``w = 1``; returns ``(w, context, routine)``."""
    w = oc.param("w", output=(), init=1.0)
    update = train.grad_update(w * oc.tensor(f32(1.0), label="one"))
    ctx = oc.Context(backend)
    step = ctx.compile(update, optimizer(update, lr=lr))
    step.run()
    return w, ctx, step


@pytest.mark.parametrize("backend", CPU)
def test_sgd_reads_a_data_tensor_learning_rate(backend):
    w, ctx, _ = _one_step(backend, oc.tensor(f32(0.1), label="lr"))
    np.testing.assert_allclose(ctx.get(w.value), 0.9, rtol=1e-6)


@pytest.mark.parametrize("backend", CPU)
def test_adam_reads_a_data_tensor_learning_rate(backend):
    # The first Adam step moves by lr * m_hat / (sqrt(v_hat) + eps) = lr * g / (|g| + eps).
    w, ctx, _ = _one_step(backend, oc.tensor(f32(0.1), label="lr"), train.adam_update)
    np.testing.assert_allclose(ctx.get(w.value), 1.0 - 0.1 / (1.0 + 1e-8), rtol=1e-6)


@pytest.mark.parametrize("backend", CPU)
def test_a_learning_rate_tensor_set_between_runs_is_used(backend):
    lr = oc.tensor(f32(0.1), label="lr")
    w, ctx, step = _one_step(backend, lr)
    lr.set(f32(0.25))
    step.run()
    np.testing.assert_allclose(ctx.get(w.value), 1.0 - 0.1 - 0.25, rtol=1e-6)


@pytest.mark.parametrize("lr", [np.float32(0.5), np.float64(0.5), "number"], ids=["float32", "float64", "oc.number"])
def test_numeric_learning_rates_are_constants(lr):
    w, ctx, _ = _one_step("interp", oc.number(0.5) if lr == "number" else lr)
    np.testing.assert_allclose(ctx.get(w.value), 0.5)


def test_a_bool_learning_rate_is_an_error():
    w = oc.param("w", output=(), init=1.0)
    with pytest.raises(TypeError, match="lr must be a number"):
        train.sgd_update(train.grad_update(w * 2.0), lr=True)


# ---------------------------------------------------------------------------------------------
# Item 10: reading a shape never changes what an operation is built from.


def _gather(read_shape_first: bool):
    table = f32(np.arange(15).reshape(5, 3))
    emb = oc.param("emb", output=5, input=3, init=table)
    rows = np.array([[0, 4], [2, 2], [3, 1]], dtype=np.int32)
    ids = oc.tensor(rows, batch=1, label="ids")
    i = oc.IndexSymbol("i", 3)
    picked = ids[i]
    if read_shape_first:
        assert picked.shape.output == (2,)
    return oc.take(emb, picked), table, rows


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("read_shape_first", [False, True], ids=["unread", "read"])
def test_take_of_a_batch_slice_needs_no_shape_read(backend, read_shape_first):
    y, table, rows = _gather(read_shape_first)
    assert (y.shape.batch, y.shape.output, y.shape.input) == ((), (2,), (3,))
    ctx = oc.Context(backend)
    routine = ctx.compile(y)
    for i in range(3):
        routine.run(i=i)
        np.testing.assert_array_equal(ctx.get(y.value), table[rows[i]])


# ---------------------------------------------------------------------------------------------
# Item 11: oc.param's init= and sizes.


class _DLPackOnly:
    """An array that numpy can read only through the DLPack protocol."""

    def __init__(self, array: np.ndarray):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


@pytest.mark.parametrize("backend", CPU)
def test_param_init_from_a_torch_tensor(backend):
    torch = pytest.importorskip("torch")
    values = np.arange(6, dtype=np.float32).reshape(3, 2) - 2.5
    w = oc.param("w", output=3, input=2, init=torch.tensor(values))
    ctx = oc.Context(backend)
    ctx.compile(w @ oc.tensor(f32([1.0, 1.0]))).run()
    np.testing.assert_array_equal(ctx.get(w.value), values)


@pytest.mark.parametrize("backend", CPU)
def test_param_init_from_a_dlpack_only_array(backend):
    values = f32([[1.5, -2.0], [0.25, 4.0]])
    w = oc.param("w", output=2, input=2, init=_DLPackOnly(values))
    ctx = oc.Context(backend)
    ctx.compile(w @ oc.tensor(f32([1.0, 1.0]))).run()
    np.testing.assert_array_equal(ctx.get(w.value), values)


def test_param_init_values_are_copied_when_the_param_is_created():
    values = f32([1.0, 2.0])
    w = oc.param("w", output=2, input=(), init=values)
    values[:] = -7.0
    np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])


def test_param_init_numpy_scalar_fills_every_cell():
    np.testing.assert_array_equal(oc.param("b", output=3, input=(), init=np.float32(0.5)).numpy(), [0.5, 0.5, 0.5])


@pytest.mark.parametrize("bad, what", [
    (object(), "must be a number, an array-like"),
    ("0.5", "must be a number, an array-like"),
    (True, "is a bool"),
    ([["a", "b"]], "must hold numbers"),
    ([[1.0, 2.0], [3.0]], "cannot read init="),
])
def test_param_init_that_is_not_usable_is_an_error_naming_init(bad, what):
    with pytest.raises(TypeError, match=f"oc.param\\('w'\\): .*{what}") as info:
        oc.param("w", output=2, init=bad)
    assert "init" in str(info.value)


def test_param_init_from_a_torch_tensor_requiring_grad_says_why():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"oc.param\('w'\): cannot read init= \(Tensor\).*detach"):
        oc.param("w", output=2, init=torch.ones(2, requires_grad=True))


def test_param_init_cannot_be_an_ocannl_tensor():
    with pytest.raises(TypeError, match=r"init= cannot be a Tensor \('data'\).*numpy\(\)"):
        oc.param("w", output=2, init=oc.tensor(f32([1.0, 2.0]), label="data"))


def test_param_sizes_accept_integer_likes():
    w = oc.param("w", output=np.int64(3), input=(np.int32(2), 4))
    assert w.dims == (3, 2, 4)
    assert oc.param("v", output=np.array([2, 5]), input=()).dims == (2, 5)


@pytest.mark.parametrize("bad", [True, 2.0, (2, 0), ("2",), "2", np.array(2.0)])
def test_param_sizes_that_are_not_positive_integers_are_an_error(bad):
    with pytest.raises(ShapeError, match=r"oc.param\('w'\): output= must be a positive int"):
        oc.param("w", output=bad)


@pytest.mark.parametrize("kind", ["batch", "input"])
@pytest.mark.parametrize("bad", [1.5, -1, True, "1", None])
def test_tensor_axis_counts_that_are_not_non_negative_integers_are_an_error(kind, bad):
    with pytest.raises(ShapeError, match=rf"oc.tensor: {kind}= counts axes, so it must be a non-negative int"):
        oc.tensor(np.zeros((2, 3)), **{kind: bad})


def test_tensor_axis_counts_accept_integer_likes():
    assert oc.tensor(np.zeros((2, 3, 4)), batch=np.int64(1), input=np.int32(1)).dims == (2, 3, 4)


# ---------------------------------------------------------------------------------------------
# Item 13: at a tie, the first maximum of each window gets the gradient (docs/semantics.md).


def _grads(backend: str, loss: oc.Tensor, *params: oc.Tensor) -> list[np.ndarray]:
    ctx = oc.Context(backend)
    ctx.compile(train.grad_update(loss)).run()
    return [ctx.get(p.grad) for p in params]


POOL_INPUT = f32([[1, 3, 3, 0],
                  [2, 0, 1, 1],
                  [5, 5, 2, 2],
                  [5, 5, 2, 2]])
POOL_FIRST_MAXIMA = f32([[0, 1, 1, 0],
                         [0, 0, 0, 0],
                         [1, 0, 1, 0],
                         [0, 0, 0, 0]])
"""Windows 2x2: row-major in each window, the first cell equal to its maximum."""


@pytest.mark.parametrize("backend", EVERY)
def test_max_pool_tie_gradient_goes_to_the_first_maximum(backend):
    x = oc.param("x", output=(4, 4, 1), init=POOL_INPUT[..., None])
    (grad,) = _grads(backend, nn.max_pool2d(x).sum(), x)
    np.testing.assert_array_equal(grad[..., 0], POOL_FIRST_MAXIMA)
    assert grad.sum() == 4  # one unit of gradient per window, ties or not


@pytest.mark.parametrize("backend", EVERY_SLOW)
def test_reductions_by_maximum_give_ties_to_the_first(backend):
    z = oc.param("z", output=5, init=f32([1, 4, 4, 2, 4]))
    e = oc.param("e", output=(2, 3), init=f32([[1, 7, 7], [0, 0, -1]]))
    loss = 3.0 * z.max() + oc.einmax("i j => i", e).sum()
    grad_z, grad_e = _grads(backend, loss, z, e)
    np.testing.assert_array_equal(grad_z, [0, 3, 0, 0, 0])
    np.testing.assert_array_equal(grad_e, [[0, 1, 0], [1, 0, 0]])


@pytest.mark.parametrize("backend", EVERY_SLOW)
def test_padded_tropical_tie_gradients_reach_both_operands_once(backend):
    """Windows of 3 over a padding of 1: ``y[o] = max_w x[o + w - 1] + k[w]``."""
    x = oc.param("x", output=5, init=f32([2, 2, 1, 4, 4]))
    k = oc.param("k", output=3, init=np.zeros(3, np.float32))
    y = oc.tropical("oh=+wh; wh => oh", x, k)
    grad_x, grad_k = _grads(backend, y.sum(), x, k)
    # Windows (position: x cell): o0 (1:x0 2:x1) -> 1; o1 (0:x0 1:x1) -> 0; o2 -> 2 (x3);
    # o3 (1:x3 2:x4) -> 1; o4 (0:x3 1:x4) -> 0.
    np.testing.assert_array_equal(grad_x, [2, 0, 0, 3, 0])
    np.testing.assert_array_equal(grad_k, [2, 2, 1])


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("op", [oc.maximum, oc.minimum], ids=["maximum", "minimum"])
def test_pointwise_maximum_tie_goes_to_the_first_operand(backend, op):
    a = oc.param("a", output=3, init=f32([1, 2, 3]))
    b = oc.param("b", output=3, init=f32([1, 5, 0]))
    grad_a, grad_b = _grads(backend, op(a, b).sum(), a, b)
    winner_a = [1, 0, 1] if op is oc.maximum else [1, 1, 0]
    np.testing.assert_array_equal(grad_a, winner_a)
    np.testing.assert_array_equal(grad_b, 1 - np.asarray(winner_a))


def test_a_window_too_large_to_number_exactly_is_an_error():
    x = oc.param("huge", output=2**24 + 1, init=0.0)
    with pytest.raises(SessionError, match=r"max_reduce .* reduces 16777217 cells.*maximum of maxima"):
        train.grad_update(x.max())


# ---------------------------------------------------------------------------------------------
# Item 17: messages speak the tensor API.


def _training_on_batches(backend: str, materialize: bool):
    data = f32(np.arange(12).reshape(3, 4) / 10.0)
    xs = oc.tensor(data, batch=1, label="xs")
    w = oc.param("w", output=2, input=4, init=f32([[1, -1, 0.5, 0], [0.25, 0, -1, 2]]))
    hidden = oc.relu(w @ xs[oc.IndexSymbol("batch_n", 3)], label="hidden")
    if materialize:
        hidden.materialize()
    total = hidden.sum()
    update = train.grad_update(total * total)
    ctx = oc.Context(backend)
    step = ctx.compile(update, train.sgd_update(update, lr=0.01))
    weights_before = ctx.get(w.value)
    step.run(batch_n=1)
    return hidden, w, ctx, data, weights_before


@pytest.mark.parametrize("backend", CPU)
def test_reading_an_inlined_intermediate_points_to_materialize(backend):
    hidden, _, ctx, _, _ = _training_on_batches(backend, materialize=False)
    keep = r"virtualized.*t\.materialize\(\) on its tensor t \(labelled 'hidden'\)"
    with pytest.raises(SessionError, match=keep) as info:
        ctx.get(hidden.value)
    assert "mark_materialized" not in str(info.value) and "lowlevel" not in str(info.value)


@pytest.mark.parametrize("backend", CPU)
def test_numpy_of_an_intermediate_takes_the_bindings_it_reads(backend):
    hidden, w, _, data, _ = _training_on_batches(backend, materialize=False)
    with pytest.raises(IndexBindingError, match=r"batch_n: pass them, t\.numpy\(batch_n=0\).*t\.materialize\(\)"):
        hidden.numpy()
    with pytest.raises(IndexBindingError, match=r"reads no index symbol named step_n \(it reads: batch_n\)"):
        hidden.numpy(batch_n=0, step_n=1)
    weights = w.numpy()  # after the step: recomputing uses the current parameters
    for b in (2, 0):
        np.testing.assert_allclose(hidden.numpy(batch_n=b), np.maximum(weights @ data[b], 0), rtol=1e-6)


@pytest.mark.parametrize("backend", CPU)
def test_a_materialized_intermediate_reads_what_the_step_computed(backend):
    hidden, w, _, data, weights_before = _training_on_batches(backend, materialize=True)
    np.testing.assert_allclose(hidden.numpy(), np.maximum(weights_before @ data[1], 0), rtol=1e-6)
    np.testing.assert_allclose(hidden.numpy(batch_n=2), np.maximum(w.numpy() @ data[2], 0), rtol=1e-6)


@pytest.mark.parametrize("backend", CPU)
def test_a_routine_reading_what_another_inlined_points_to_materialize(backend):
    a = oc.tensor(f32([1.0, -2.0, 3.0]), label="a")
    inner = oc.relu(a * 2.0, label="inner")
    outer = inner + 1.0
    doubled = TNode("doubled", dims=(3,))
    reads_inner = Computation("reads_inner", Accum(doubled, None, Binop.MUL, (inner.value, 2.0),
                                                   lambda: identity_projections((3,), [(3,), ()])))
    ctx = oc.Context(backend)
    first = ctx.compile(outer)  # compiled before anything reads ``inner``: it inlines it
    second = ctx.compile(reads_inner)
    first.run()
    with pytest.raises(SessionError, match=r"reads inner.*t\.materialize\(\) on its tensor t \(labelled 'inner'\) "
                                           r"before compiling add_fwd") as info:
        second.run()
    assert "mark_materialized" not in str(info.value)

    inner.materialize()
    ctx.compile(outer).run()
    second.run()
    np.testing.assert_array_equal(ctx.get(doubled), [4.0, 0.0, 12.0])


@pytest.mark.parametrize("backend", ["interp", "c"])
def test_a_learning_rate_set_before_the_first_compile_is_used(backend):
    """``lr.set`` between building the step and compiling it must count (no stale snapshot)."""
    w = oc.param("w_lr_before_compile", output=1, init=1.0)
    x = oc.tensor(np.ones((1, 1), np.float32), batch=1)
    loss = (w * x).sum()
    lr = oc.tensor(np.array(0.1, np.float32))
    update = train.grad_update(loss)
    sgd = train.sgd_update(update, lr=lr)
    lr.set(0.25)
    ctx = oc.Context(backend)
    ctx.compile(update, sgd).run()
    np.testing.assert_allclose(ctx.get(w), [0.75])
