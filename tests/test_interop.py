"""Exchanging arrays with other libraries (ocannl/interop.py): DLPack out of tensors, sharing the
context's buffer where the backend allows; foreign arrays into ``oc.tensor`` keeping their
precision; numpy arrays as operands; PyTorch state dicts into models, layouts converted."""

from __future__ import annotations

import numpy as np
import pytest

from backend_params import default_context
import ocannl as oc
from ocannl import interop, nn
from ocannl.errors import CheckpointError, ShapeError
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


# -- Weights from PyTorch (docs/training.md, "Weights from PyTorch") ------------------------------

def assert_forward_matches(ours: oc.Tensor, ref, what: str) -> None:
    """``ours`` equals PyTorch's ``ref`` normwise within 1e-5."""
    ref = ref.detach().numpy()
    got = ours.numpy()
    assert got.shape == ref.shape, f"{what}: shape {got.shape} vs PyTorch's {ref.shape}"
    assert float(np.max(np.abs(got - ref))) <= 1e-5 * float(np.max(np.abs(ref))), what


def images(*shape: int) -> np.ndarray:
    return np.random.default_rng(8).normal(size=shape).astype(np.float32)


def test_load_a_linear_and_an_mlp_from_torch_modules():
    torch = pytest.importorskip("torch")

    torch.manual_seed(0)
    x = images(6, 5)
    linear, lin_ref = nn.linear(3, label="lin"), torch.nn.Linear(5, 3)
    y = linear(oc.tensor(x, batch=1))
    interop.load_torch_state_dict(linear, lin_ref.state_dict())
    assert_forward_matches(y, lin_ref(torch.from_numpy(x)), "linear")

    mlp = nn.mlp(hid_dims=(8, 4), out=2, label="mlp")
    mlp_ref = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4), torch.nn.ReLU(),
                                  torch.nn.Linear(4, 2, bias=False))
    y = mlp(oc.tensor(x, batch=1))
    interop.load_torch_state_dict(mlp, mlp_ref.state_dict())  # in order: weight, bias, ..., last weight
    assert_forward_matches(y, mlp_ref(torch.from_numpy(x)), "mlp")


@pytest.mark.parametrize("in_channels", [2, 3])  # 3: [oc, ic, kh, kw] and [oc, kh, kw, ic] have one shape
def test_load_a_conv2d_moves_the_channels_last(in_channels):
    torch = pytest.importorskip("torch")

    torch.manual_seed(1)
    x = images(2, 6, 5, in_channels)
    conv, ref = nn.conv2d(4, kernel_size=3, label="conv"), torch.nn.Conv2d(in_channels, 4, 3, padding=1)
    y = conv(oc.tensor(x, batch=1))
    interop.load_torch_state_dict(conv, ref.state_dict())
    assert conv.kernel.dims == (4, 3, 3, in_channels)
    assert_forward_matches(y, ref(torch.from_numpy(x).permute(0, 3, 1, 2)).permute(0, 2, 3, 1), "conv2d")


def test_load_a_classifier_after_torch_flatten_of_a_convolution():
    torch = pytest.importorskip("torch")

    torch.manual_seed(2)
    x = images(2, 4, 5, 3)
    ref = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(6 * 4 * 5, 7))
    conv, head = nn.conv2d(6, kernel_size=3, label="conv"), nn.linear(7, label="head")
    y = head(oc.relu(conv(oc.tensor(x, batch=1))))  # head_w: output (7,), input (4, 5, 6): h, w, c
    state = ref.state_dict()
    with pytest.raises(ShapeError, match=r"'3\.weight' of shape \(7, 120\) onto parameter 'head_w' of dims "
                                         r"\(7, 4, 5, 6\).*channels_first"):
        interop.load_torch_state_dict([conv, head], state)
    before = head.w.numpy()
    interop.load_torch_state_dict([conv, head], state, mapping={
        "conv_kernel": "0.weight", "conv_bias": "0.bias", "head_w": ("3.weight", "channels_first"), "head_b": "3.bias"})
    assert not np.array_equal(head.w.numpy(), before)
    assert_forward_matches(y, ref(torch.from_numpy(x).permute(0, 3, 1, 2)), "flattened classifier")


def test_a_shape_that_does_not_map_names_the_entry_and_the_parameter_and_changes_nothing():
    torch = pytest.importorskip("torch")

    linear = nn.linear(3, label="lin")
    linear(oc.tensor(images(2, 5), batch=1))
    before = linear.w.numpy()
    with pytest.raises(ShapeError, match=r"'weight' of shape \(3, 4\) onto parameter 'lin_w' of dims \(3, 5\)"):
        interop.load_torch_state_dict(linear, {"weight": torch.zeros(3, 4), "bias": torch.zeros(3)})
    with pytest.raises(ShapeError, match=r"'bias' of shape \(4,\) onto parameter 'lin_b' of dims \(3,\)"):
        interop.load_torch_state_dict(linear, {"weight": torch.zeros(3, 5), "bias": torch.zeros(4)})
    np.testing.assert_array_equal(linear.w.numpy(), before)  # checked before assigning: the weight kept its value
    state = {"weight": torch.zeros(3, 5), "bias": torch.zeros(3)}
    with pytest.raises(CheckpointError, match="2 parameters .* 1 state-dict entries"):
        interop.load_torch_state_dict(linear, {"weight": torch.zeros(3, 5)})
    with pytest.raises(CheckpointError, match="has no entry for 'lin_b'"):
        interop.load_torch_state_dict(linear, state, mapping={"lin_w": "weight"})
    with pytest.raises(CheckpointError, match="'lin_b' the key 'b'"):
        interop.load_torch_state_dict(linear, state, mapping={"lin_w": "weight", "lin_b": "b"})
