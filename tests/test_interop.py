"""Exchanging arrays with other libraries (ocannl/interop.py): DLPack out of tensors, sharing the
context's buffer where the backend allows; foreign arrays into ``oc.tensor`` keeping their
precision; numpy arrays as operands."""

from __future__ import annotations

import numpy as np
import pytest

from backend_params import default_context
import ocannl as oc
from ocannl.lowlevel import dtypes

BACKENDS = ("interp", "c", "metal", "triton")


@pytest.mark.parametrize("backend", ["interp", "c", "metal"])
def test_from_dlpack_shares_the_contexts_buffer_on_the_cpu_backends(backend):
    ctx = default_context(backend)
    w = oc.param("w", output=3, input=(), init=[1.0, 2.0, 3.0])
    y = (w * 2).materialize()
    step = ctx.compile(y)
    step.run()
    view = np.from_dlpack(y)
    np.testing.assert_array_equal(view, [2.0, 4.0, 6.0])
    assert np.shares_memory(view, ctx.buffer(y))
    assert y.__dlpack_device__() == (1, 0)  # kDLCPU
    w.set(np.array([5.0, 6.0, 7.0], np.float32))
    step.run()
    np.testing.assert_array_equal(view, [10.0, 12.0, 14.0])  # a view: the run wrote into it
    copied = np.from_dlpack(y, copy=True)
    assert not np.shares_memory(copied, ctx.buffer(y))


def test_on_triton_torch_gets_the_buffer_itself():
    torch = pytest.importorskip("torch")
    ctx = default_context("triton")
    w = oc.param("w", output=3, input=(), init=[1.0, 2.0, 3.0])
    y = (w + 1).materialize()
    ctx.compile(y).run()
    shared = torch.from_dlpack(y)
    buffer = ctx.buffer(y)
    assert shared.data_ptr() == buffer.data_ptr() and shared.device == buffer.device
    assert y.__dlpack_device__() == buffer.__dlpack_device__()
    np.testing.assert_array_equal(shared.cpu().numpy(), [2.0, 3.0, 4.0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_dlpack_reads_what_numpy_reads(backend):
    default_context(backend)
    x = oc.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), batch=1)
    y = (x * x).sum()  # never compiled: computed on first read, as t.numpy() does
    np.testing.assert_array_equal(np.from_dlpack(y), y.numpy())
    assert float(np.from_dlpack(y)) == 55.0
    np.testing.assert_array_equal(np.from_dlpack(oc.number(2.5)), 2.5)


def test_torch_reads_a_tensor_through_dlpack():
    torch = pytest.importorskip("torch")
    ctx = default_context("c")
    w = oc.param("w", output=2, input=(), init=[1.5, -2.0], dtype="float64")
    ctx.compile(w * 1).run()
    t = torch.from_dlpack(w)
    assert t.dtype == torch.float64
    np.testing.assert_array_equal(t.numpy(), [1.5, -2.0])


def test_bfloat16_does_not_go_out_as_integers():
    b = oc.param("b", output=2, input=(), init=[1.0, 2.0], dtype="bfloat16")
    with pytest.raises(dtypes.DTypeError, match=r"'b' is bfloat16.*b\.numpy\(\)"):
        np.from_dlpack(b)


def test_a_float64_torch_tensor_stays_float64():
    torch = pytest.importorskip("torch")
    src = torch.tensor([[1.0 + 2**-40, 2.0]], dtype=torch.float64)
    x = oc.tensor(src, batch=1)
    assert x.dtype is dtypes.float64
    np.testing.assert_array_equal((x * 1).numpy(), src.numpy())  # no rounding through float32
    assert oc.tensor(torch.zeros(2, dtype=torch.float16)).dtype is dtypes.float16
    assert oc.tensor(torch.zeros(2, dtype=torch.int64)).dtype is dtypes.int64
    src[0, 0] = 7.0
    assert (x * 1).numpy()[0, 0] == 1.0 + 2**-40  # oc.tensor copied the values


def test_array_interface_objects_keep_their_dtype_numpy_data_keeps_its_convention():
    class Exposed:
        """Another library's array, seen only through the array interface."""

        def __init__(self, a):
            self.__array_interface__ = a.__array_interface__
            self._keep = a

    assert oc.tensor(Exposed(np.array([1.0, 2.0]))).dtype is dtypes.float64
    assert oc.tensor(np.array([1.0, 2.0])).dtype is dtypes.float32  # numpy's float64 default: float32


def test_a_gpu_or_unreadable_array_is_an_error_saying_what_to_do():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"cannot read a Tensor as a host array.*bfloat16"):
        oc.tensor(torch.zeros(2, dtype=torch.bfloat16))


@pytest.mark.parametrize("backend", BACKENDS)
def test_tensor_plus_ndarray_and_ndarray_plus_tensor(backend):
    default_context(backend)
    w = oc.param("w", output=2, input=(), init=[1.0, 2.0])
    a = np.array([10.0, 20.0])
    left, right = w + a, a + w
    assert isinstance(left, oc.Tensor) and isinstance(right, oc.Tensor)
    np.testing.assert_array_equal(left.numpy(), [11.0, 22.0])
    np.testing.assert_array_equal(right.numpy(), [11.0, 22.0])
    np.testing.assert_array_equal((np.array([2.0, 4.0]) * w - w).numpy(), [1.0, 6.0])
    with pytest.raises(TypeError, match="an array"):
        w + "x"
