"""The catalogue names added with issue 16: ``oc.cd.assign``, user-level assignments that
``ctx.compile`` accepts, checked against numpy on every backend."""

from __future__ import annotations

import numpy as np
import pytest

from backend_params import backend_param
import ocannl as oc
from ocannl import train
from ocannl.errors import SessionError, ShapeError


EVERY = [backend_param("interp"), backend_param("c"), backend_param("metal"), backend_param("triton")]

START = np.array([[1.0, -2.0, 3.0], [4.0, 5.0, -6.0]], dtype=np.float32)
VALUE = np.array([[0.5, 4.0, -1.5], [2.0, -0.25, 8.0]], dtype=np.float32)

# op -> numpy of (dst, value): what one run leaves in dst.
EXPECTED = {
    "=:": lambda d, v: v,
    "=+": lambda d, v: d + v,
    "=-": lambda d, v: d - v,
    "=*": lambda d, v: d * v,
    "=/": lambda d, v: d / v,
    "=@^": lambda d, v: np.maximum(d, v),
    "=@-": lambda d, v: np.minimum(d, v),
}


def test_every_operator_is_covered():
    assert set(EXPECTED) == set(oc.cd.OPERATORS)


@pytest.mark.parametrize("backend", EVERY)
@pytest.mark.parametrize("op", sorted(EXPECTED))
def test_assign_every_operator(backend, op):
    ctx = oc.Context(backend)
    dst = oc.tensor(START, label="dst")
    value = oc.tensor(VALUE, label="value")
    routine = ctx.compile(oc.cd.assign(dst, op, value))
    routine.run()
    once = EXPECTED[op](START, VALUE)
    np.testing.assert_array_equal(dst.numpy(), once)
    routine.run()  # the assignment reads what the previous run left
    np.testing.assert_array_equal(dst.numpy(), EXPECTED[op](once, VALUE))


@pytest.mark.parametrize("backend", EVERY)
def test_assign_a_number_and_a_computed_value(backend):
    ctx = oc.Context(backend)
    dst = oc.tensor(START, label="dst")
    x = oc.tensor(VALUE, label="x")
    ctx.compile(oc.cd.assign(dst, "=*", 2), oc.cd.assign(dst, "=+", oc.relu(x) * 3)).run()
    np.testing.assert_array_equal(dst.numpy(), START * 2 + np.maximum(VALUE, 0) * 3)


@pytest.mark.parametrize("backend", EVERY)
def test_assign_broadcasts_size_one_axes(backend):
    ctx = oc.Context(backend)
    dst = oc.tensor(START, label="dst")
    row = oc.tensor(np.array([[10.0, 20.0, 30.0]], dtype=np.float32), label="row")
    ctx.compile(oc.cd.assign(dst, "=-", row)).run()
    np.testing.assert_array_equal(dst.numpy(), START - np.array([[10.0, 20.0, 30.0]], dtype=np.float32))


@pytest.mark.parametrize("backend", EVERY)
def test_writes_through_a_slice_land_in_the_sliced_tensor(backend):
    ctx = oc.Context(backend)
    xs = oc.tensor(np.zeros((4, 3), dtype=np.float32), batch=1, label="xs")
    i = oc.IndexSymbol("i", 4)
    row = oc.tensor(np.array([1.0, 2.0, 3.0], dtype=np.float32), label="row")
    put = ctx.compile(oc.cd.assign(xs[i], "=:", row))
    put.run(i=2)
    add = ctx.compile(oc.cd.assign(xs[i], "=+", 0.5))
    add.run(i=0)
    add.run(i=2)
    expected = np.zeros((4, 3), dtype=np.float32)
    expected[2] = [1.5, 2.5, 3.5]
    expected[0] = 0.5
    np.testing.assert_array_equal(xs.numpy(), expected)


@pytest.mark.parametrize("backend", [backend_param("interp"), backend_param("c")])
def test_writes_through_a_slice_of_a_slice(backend):
    ctx = oc.Context(backend)
    xs = oc.tensor(np.zeros((3, 2, 2), dtype=np.float32), batch=2, label="xs")
    i, j = oc.IndexSymbol("i", 3), oc.IndexSymbol("j", 2)
    ctx.compile(oc.cd.assign(xs[i][j], "=:", oc.tensor(np.array([7.0, 8.0], dtype=np.float32)))).run(i=1, j=1)
    expected = np.zeros((3, 2, 2), dtype=np.float32)
    expected[1, 1] = [7.0, 8.0]
    np.testing.assert_array_equal(xs.numpy(), expected)


@pytest.mark.parametrize("backend", [backend_param("interp"), backend_param("c")])
def test_assign_runs_beside_a_training_step(backend):
    """A running sum of the loss, compiled into the same routine as the update."""
    ctx = oc.Context(backend)
    w = oc.param("w", output=1, input=2, init=np.array([[0.5, -1.0]], dtype=np.float32))
    x = oc.tensor(np.array([1.0, 2.0], dtype=np.float32), label="x")
    loss = (w @ x).sum()
    total = oc.tensor(np.zeros((), dtype=np.float32), label="total")
    update = train.grad_update(loss)
    step = ctx.compile(update, train.sgd_update(update, lr=0.1), oc.cd.assign(total, "=+", loss))
    losses = []
    for _ in range(3):
        step.run()
        losses.append(float(loss.numpy()))
    assert float(total.numpy()) == pytest.approx(sum(losses), rel=1e-6)


def test_shape_errors_name_the_op_the_shapes_and_the_axis():
    dst = oc.tensor(START, label="dst")
    mismatch = r"dst =\+ bad: axis 1 of 'bad' has size 4 where 'dst' has 3.*\(2, 4\) and \(2, 3\)"
    with pytest.raises(ShapeError, match=mismatch):
        oc.cd.assign(dst, "=+", oc.tensor(np.ones((2, 4), dtype=np.float32), label="bad"))
    with pytest.raises(ShapeError, match=r"dst =: flat: 'flat' has 1 axes .* 'dst' has 2"):
        oc.cd.assign(dst, "=:", oc.tensor(np.ones(6, dtype=np.float32), label="flat"))


def test_other_errors():
    dst = oc.tensor(START, label="dst")
    with pytest.raises(SessionError, match=r"unknown assignment operator '\+='"):
        oc.cd.assign(dst, "+=", 1.0)
    with pytest.raises(TypeError, match="the destination must be a tensor"):
        oc.cd.assign(np.zeros(3), "=:", 1.0)
    with pytest.raises(SessionError, match="is a number"):
        oc.cd.assign(oc.number(2.0), "=:", 1.0)
    computed = oc.relu(dst)
    with pytest.raises(SessionError, match=r"cannot write into '.*', computed by relu"):
        oc.cd.assign(computed, "=+", 1.0)
