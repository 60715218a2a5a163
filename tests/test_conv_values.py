"""Convolution terms of einsum specs (docs/shapes.md, "Convolution terms") computed by the
interpreter, against direct numpy loops.

An operand axis ``stride*o<+dilation*k`` (valid) or ``stride*o=+dilation*k`` (padded) is read at
``stride*o + dilation*k - left_pad``; a padded convolution has ``in = stride*out`` and left padding
``(dilation*(k-1))//2`` (``ocannl.shape.projections.padding_left``), and a read in the margin sees
the operation's neutral element (0 for a sum of products, -inf for max-pooling). A valid
convolution has ``out = (in - span)//stride + 1`` with ``span = dilation*(k-1) + 1``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ocannl as oc
import ocannl.session
from ocannl import nn
from ocannl.shape.projections import padding_left


def compute(t: oc.Tensor) -> np.ndarray:
    ctx = oc.Context("interp")
    ctx.compile(t).run()
    return ctx.get(t.value)


def ints(rng: np.random.Generator, shape) -> np.ndarray:
    """Small integers: every sum is exact in float32, so results compare exactly."""
    return rng.integers(-3, 4, shape).astype(np.float32)


def conv_term(stride: int, dilation: int, over: str, kernel: str, padded: bool) -> str:
    sign = "=" if padded else "<"
    return f"{stride}*{over}{sign}+{dilation}*{kernel}"


def out_size(n: int, k: int, stride: int, dilation: int, padded: bool) -> int:
    if padded:
        assert n % stride == 0
        return n // stride
    span = dilation * (k - 1) + 1
    assert (n - span) % stride == 0
    return (n - span) // stride + 1


def reference_conv(x: np.ndarray, w: np.ndarray, stride: int, dilation: int, padded: bool,
                   reduce=np.sum, combine=np.multiply, neutral: float = 0.0) -> np.ndarray:
    """``x``: ``[B, *spatial, IC]``; ``w``: ``[OC, *kernel, IC]``; the result ``[B, *out, OC]``
    is ``reduce`` over kernel positions and input channels of ``combine(x[...], w[...])``, with
    reads outside ``x`` giving ``neutral``."""
    B, *spatial, IC = x.shape
    OC, *ks, _ = w.shape
    pads = [padding_left(k, dilation) if padded else 0 for k in ks]
    outs = [out_size(n, k, stride, dilation, padded) for n, k in zip(spatial, ks)]
    y = np.zeros([B, *outs, OC])
    for b, oc_ in itertools.product(range(B), range(OC)):
        for o in itertools.product(*(range(n) for n in outs)):
            terms = []
            for kpos in itertools.product(*(range(k) for k in ks)):
                pos = [stride * oi + dilation * ki - p for oi, ki, p in zip(o, kpos, pads)]
                inside = all(0 <= q < n for q, n in zip(pos, spatial))
                for c in range(IC):
                    v = x[(b, *pos, c)] if inside else neutral
                    terms.append(combine(np.float64(v), np.float64(w[(oc_, *kpos, c)])))
            y[(b, *o, oc_)] = reduce(terms)
    return y


# -- 1-D ------------------------------------------------------------------------------------------

CONV1D = [
    # (n, k, stride, dilation, padded)
    (7, 3, 1, 1, False),
    (9, 3, 2, 1, False),
    (9, 2, 1, 3, False),
    (11, 3, 2, 2, False),
    (6, 3, 1, 1, True),
    (8, 3, 2, 1, True),
    (8, 2, 2, 1, True),
    (9, 3, 1, 2, True),
    (8, 3, 2, 3, True),
    (6, 4, 1, 1, True),
]


@pytest.mark.parametrize("n,k,stride,dilation,padded", CONV1D,
                         ids=[f"n{n}k{k}s{s}d{d}{'pad' if p else 'valid'}" for n, k, s, d, p in CONV1D])
def test_conv1d(n, k, stride, dilation, padded):
    rng = np.random.default_rng(n * 100 + k * 10 + stride + dilation)
    X, W = ints(rng, (2, n, 3)), ints(rng, (4, k, 3))  # batch 2, 3 in channels, 4 out channels
    x = oc.tensor(X, batch=1)
    w = oc.tensor(W, input=2)  # output [oc], input [k, ic]
    term = conv_term(stride, dilation, "o", "k", padded)
    y = oc.einsum(f"... | {term}, ..ic..; k, ..ic.. -> ..oc.. => ... | o, ..oc..", x, w)
    expected = reference_conv(X, W, stride, dilation, padded)
    assert y.dims == expected.shape
    np.testing.assert_array_equal(compute(y), expected)


def test_conv1d_single_channel_without_row_variables():
    X, W = np.arange(1.0, 10.0, dtype=np.float32), np.array([1.0, 10.0, 100.0], np.float32)
    y = oc.einsum("2*o<+k; k => o", oc.tensor(X), oc.tensor(W))
    np.testing.assert_array_equal(compute(y), [X[2 * o] + 10 * X[2 * o + 1] + 100 * X[2 * o + 2] for o in range(4)])


def test_padded_conv_reads_zero_in_both_margins():
    """All-ones input and a kernel of powers of 10: each output digit says which kernel taps
    read inside the input (left pad 1 for k=3: the first output misses tap 0, the last tap 2)."""
    y = oc.einsum("1*o=+k; k => o", oc.tensor(np.ones(4, np.float32)),
                  oc.tensor(np.array([1.0, 10.0, 100.0], np.float32)))
    assert padding_left(3, 1) == 1
    np.testing.assert_array_equal(compute(y), [110, 111, 111, 11])


def test_padded_conv_left_padding_with_dilation():
    """k=3, dilation 2: left pad ``(2*2)//2 = 2``; output o reads x[o-2], x[o], x[o+2]."""
    X = np.arange(1.0, 7.0, dtype=np.float32)
    y = oc.einsum("1*o=+2*k; k => o", oc.tensor(X), oc.tensor(np.array([1.0, 10.0, 100.0], np.float32)))
    assert padding_left(3, 2) == 2
    padded = np.concatenate([[0, 0], X, [0, 0]])
    np.testing.assert_array_equal(compute(y), [padded[o] + 10 * padded[o + 2] + 100 * padded[o + 4] for o in range(6)])


def test_padded_window_over_a_size_1_axis_reads_zero_past_it():
    """Regression: with one output position and left padding 0 (k=2), the window index is the
    bare kernel loop ``k``; over an input axis of size 1 it must not broadcast (read x[0] for
    k=1) but read the neutral 0 past the axis."""
    y = oc.einsum("1*o=+k; k => o", oc.tensor(np.array([2.0], np.float32)),
                  oc.tensor(np.array([1.0, 10.0], np.float32)))
    np.testing.assert_array_equal(compute(y), [2.0])
    X, W = np.array([[[2.0]], [[3.0]]], np.float32), np.array([[[1.0], [10.0]]], np.float32)
    y = oc.einsum("... | 1*oh=+kh, ..ic..; kh, ..ic.. -> ..oc.. => ... | oh, ..oc..", oc.tensor(X, batch=1),
                  oc.tensor(W, input=2))
    np.testing.assert_array_equal(compute(y), reference_conv(X, W, 1, 1, True))


def test_constant_window_position_past_a_size_1_axis_reads_zero():
    """Regression: ``2*o<+1+k`` with one output and a kernel of 1 reads the constant position 1,
    past an input of size 1 (the offset never changes sizes): the neutral 0, not x[0]."""
    y = oc.einsum("2*o<+1+k; k => o", oc.tensor(np.array([5.0], np.float32)), oc.tensor(np.array([1.0], np.float32)))
    np.testing.assert_array_equal(compute(y), [0.0])


@pytest.mark.parametrize("spec,ref", [
    ("2*o => o", lambda X: X[0::2]),
    ("2*o+1 => o", lambda X: X[1::2]),
    ("3*o+2 => o", lambda X: X[2::3]),
])
def test_strided_axis_without_kernel(spec, ref):
    X = np.arange(12.0, dtype=np.float32)
    np.testing.assert_array_equal(compute(oc.einsum(spec, oc.tensor(X))), ref(X))


def test_conv_with_offset():
    """``2*o<+1+k``: stride 2, offset 1, kernel k: reads ``x[2*o + 1 + k]``. The offset affects
    indexing only, never sizes, so the last window reaches one cell past the input
    and reads the neutral element 0 there."""
    X, W = np.arange(1.0, 9.0, dtype=np.float32), np.array([1.0, 10.0], np.float32)
    y = oc.einsum("2*o<+1+k; k => o", oc.tensor(X), oc.tensor(W))
    assert y.dims == (4,)
    padded = np.concatenate([X, [0.0]])
    np.testing.assert_array_equal(compute(y), [padded[2 * o + 1] + 10 * padded[2 * o + 2] for o in range(4)])


def test_bare_conv_term_takes_use_padding_argument():
    X, W = np.arange(6.0, dtype=np.float32), np.array([1.0, 1.0, 1.0], np.float32)
    valid = oc.einsum("1*o+k; k => o", oc.tensor(X), oc.tensor(W), use_padding=False)
    np.testing.assert_array_equal(compute(valid), [3, 6, 9, 12])
    padded = oc.einsum("1*o+k; k => o", oc.tensor(X), oc.tensor(W), use_padding=True)
    np.testing.assert_array_equal(compute(padded), [1, 3, 6, 9, 12, 9])


# -- 2-D ------------------------------------------------------------------------------------------

CONV2D = [
    # (h, w, k, stride, dilation, padded, ic, oc)
    (5, 5, 3, 1, 1, True, 1, 4),   # padded: [5,5,1] -> [5,5,4]
    (5, 5, 3, 1, 1, False, 1, 4),  # valid: [5,5,1] -> [3,3,4]
    (6, 6, 3, 2, 1, True, 1, 4),   # stride 2 padded on [6,6,1] -> [3,3,4]
    (7, 5, 3, 2, 1, False, 2, 3),
    (6, 4, 2, 2, 1, True, 2, 2),
    (7, 7, 3, 1, 2, False, 2, 2),
    (6, 6, 3, 1, 2, True, 1, 2),
]


@pytest.mark.parametrize("h,w_,k,stride,dilation,padded,ic,oc_", CONV2D,
                         ids=[f"{h}x{w}k{k}s{s}d{d}{'pad' if p else 'valid'}c{i}-{o}"
                              for h, w, k, s, d, p, i, o in CONV2D])
def test_conv2d(h, w_, k, stride, dilation, padded, ic, oc_):
    rng = np.random.default_rng(h * 1000 + w_ * 100 + k * 10 + stride)
    X, W = ints(rng, (2, h, w_, ic)), ints(rng, (oc_, k, k, ic))
    x = oc.tensor(X, batch=1)
    w = oc.tensor(W, input=3)  # kernel memory layout [oc, kh, kw, ic]
    th = conv_term(stride, dilation, "oh", "kh", padded)
    tw = conv_term(stride, dilation, "ow", "kw", padded)
    y = oc.einsum(f"... | {th}, {tw}, ..ic..; kh, kw, ..ic.. -> ..oc.. => ... | oh, ow, ..oc..", x, w)
    expected = reference_conv(X, W, stride, dilation, padded)
    assert y.dims == expected.shape
    np.testing.assert_array_equal(compute(y), expected)


def test_conv2d_with_kernel_param_and_bias():
    """The nn.conv2d layout with an explicit kernel init and a bias added after the einsum."""
    rng = np.random.default_rng(7)
    X, K, Bias = ints(rng, (3, 4, 4, 2)), ints(rng, (5, 3, 3, 2)), ints(rng, (5,))
    x = oc.tensor(X, batch=1)
    kernel = oc.param("kernel", output=5, input=(3, 3, 2), init=K)
    bias = oc.param("bias", output=5, init=Bias)
    y = oc.einsum("... | 1*oh=+kh, 1*ow=+kw, ..ic..; kh, kw, ..ic.. -> ..oc.. => ... | oh, ow, ..oc..",
                  x, kernel) + bias
    np.testing.assert_array_equal(compute(y), reference_conv(X, K, 1, 1, True) + Bias)


# -- pooling ---------------------------------------------------------------------------------------

POOL_SPEC = "... | {s}*oh<+wh, {s}*ow<+ww, ..c..; wh, ww => ... | oh, ow, ..c.."


def test_max_pool2d_worked_example():
    """``max_pool2d`` on ``range_of_shape [4;4;1]`` gives ``[[5,7],[13,15]]``."""
    x = oc.tensor(np.arange(16.0, dtype=np.float32).reshape(4, 4, 1))
    y = oc.tropical(POOL_SPEC.format(s=2), x, oc.tensor(np.zeros((2, 2), np.float32)))
    assert y.dims == (2, 2, 1)
    np.testing.assert_array_equal(compute(y)[..., 0], [[5, 7], [13, 15]])


def test_max_pool2d_zero_kernel_from_numbers():
    """The original's kernel is the constant ``0.0 + 0.0``; here a zero kernel of shape
    ``[2, 2]`` built from a number by broadcasting."""
    x = oc.tensor(np.arange(16.0, dtype=np.float32).reshape(4, 4, 1))
    zero_kernel = oc.tensor(np.ones((2, 2), np.float32)) * 0.0
    y = oc.tropical(POOL_SPEC.format(s=2), x, zero_kernel)
    np.testing.assert_array_equal(compute(y)[..., 0], [[5, 7], [13, 15]])


def reference_max_pool(X: np.ndarray, stride: int, window: int) -> np.ndarray:
    B, H, W, C = X.shape
    oh, ow = (H - window) // stride + 1, (W - window) // stride + 1
    y = np.empty((B, oh, ow, C))
    for b, i, j, c in itertools.product(range(B), range(oh), range(ow), range(C)):
        y[b, i, j, c] = X[b, stride * i:stride * i + window, stride * j:stride * j + window, c].max()
    return y


@pytest.mark.parametrize("hw,stride,window", [(7, 2, 3), (6, 2, 2), (5, 1, 2)])
def test_max_pool2d_stride_and_window(hw, stride, window):
    """Stride 2, window 3 on ``[7;7;2]`` gives ``[3;3;2]``."""
    rng = np.random.default_rng(hw + stride + window)
    X = rng.standard_normal((2, hw, hw, 2)).astype(np.float32)
    y = oc.tropical(POOL_SPEC.format(s=stride), oc.tensor(X, batch=1),
                    oc.tensor(np.zeros((window, window), np.float32)))
    np.testing.assert_array_equal(compute(y), reference_max_pool(X, stride, window))


def test_padded_max_pool_margin_is_minus_infinity():
    """A padded max-pool over negative values: the margin reads max's neutral -inf, not 0."""
    X = -np.arange(1.0, 7.0, dtype=np.float32)
    y = oc.tropical("1*o=+w; w => o", oc.tensor(X), oc.tensor(np.zeros(3, np.float32)))
    np.testing.assert_array_equal(compute(y), [-1, -1, -2, -3, -4, -5])


def test_tropical_conv_with_a_kernel():
    """A max-plus convolution with a non-zero kernel (morphological dilation)."""
    rng = np.random.default_rng(11)
    X, W = ints(rng, (1, 6, 6, 1)), ints(rng, (1, 3, 3, 1))
    y = oc.tropical("... | 1*oh<+kh, 1*ow<+kw, ..c..; kh, kw, ..c.. => ... | oh, ow, ..c..",
                    oc.tensor(X, batch=1), oc.tensor(W[0]))
    expected = reference_conv(X, W, 1, 1, False, reduce=np.max, combine=np.add, neutral=-np.inf)
    np.testing.assert_array_equal(compute(y), expected)


# -- the nn blocks built on these terms ------------------------------------------------------------


@pytest.mark.parametrize("hw,stride,window", [(4, 2, 2), (7, 2, 3)])
def test_nn_max_pool2d(hw, stride, window):
    rng = np.random.default_rng(hw)
    X = rng.standard_normal((2, hw, hw, 3)).astype(np.float32)
    y = nn.max_pool2d(oc.tensor(X, batch=1), stride=stride, window_size=window)
    np.testing.assert_array_equal(compute(y), reference_max_pool(X, stride, window))


def test_nn_max_pool2d_worked_example():
    y = nn.max_pool2d(oc.tensor(np.arange(16.0, dtype=np.float32).reshape(4, 4, 1)))
    np.testing.assert_array_equal(compute(y)[..., 0], [[5, 7], [13, 15]])


def test_nn_avg_pool2d():
    X = np.arange(36.0, dtype=np.float32).reshape(1, 6, 6, 1)
    y = nn.avg_pool2d(oc.tensor(X, batch=1), stride=2, window_size=2)
    expected = X.reshape(1, 3, 2, 3, 2, 1).mean(axis=(2, 4))
    np.testing.assert_allclose(compute(y), expected, rtol=1e-6)


@pytest.mark.parametrize("hw,k,stride,padded", [(5, 3, 1, True), (5, 3, 1, False), (6, 3, 2, True)])
def test_nn_conv2d_with_set_kernel(hw, k, stride, padded):
    """The original's test shapes ([5;5;1] -> [5;5;4] padded, [3;3;4] valid; stride 2 on [6;6;1] ->
    [3;3;4]), with the kernel and bias given values by ``t.set`` before compiling."""
    rng = np.random.default_rng(hw * 10 + k + stride)
    X, K, Bias = ints(rng, (2, hw, hw, 1)), ints(rng, (4, k, k, 1)), ints(rng, (4,))
    layer = nn.conv2d(out_channels=4, kernel_size=k, stride=stride, use_padding=padded)
    y = layer(oc.tensor(X, batch=1))
    layer.kernel.set(K)
    layer.bias.set(Bias)
    expected = reference_conv(X, K, stride, 1, padded) + Bias
    assert y.dims == expected.shape
    np.testing.assert_array_equal(compute(y), expected)


@settings(max_examples=60, deadline=None)
@given(n_out=st.integers(1, 4), k=st.integers(1, 4), stride=st.integers(1, 3), dilation=st.integers(1, 3),
       padded=st.booleans(), ic=st.integers(1, 2), seed=st.integers(0, 1000))
def test_random_conv1d(n_out, k, stride, dilation, padded, ic, seed):
    ocannl.session.reset()
    n = stride * n_out if padded else stride * (n_out - 1) + dilation * (k - 1) + 1
    rng = np.random.default_rng(seed)
    X, W = ints(rng, (1, n, ic)), ints(rng, (2, k, ic))
    term = conv_term(stride, dilation, "o", "k", padded)
    y = oc.einsum(f"... | {term}, ..ic..; k, ..ic.. -> ..oc.. => ... | o, ..oc..", oc.tensor(X, batch=1),
                  oc.tensor(W, input=2))
    expected = reference_conv(X, W, stride, dilation, padded)
    assert expected.shape == (1, n_out, 2)
    np.testing.assert_array_equal(compute(y), expected)


def test_padded_conv_of_a_batch_slice():
    """Images ``[2·4, 3, 3, 1]`` rebatched ``[2, 4]``, sliced by ``batch_n``, then a
    padded 3x3 convolution; each binding convolves its own slice."""
    rng = np.random.default_rng(12)
    X, K = ints(rng, (2, 4, 3, 3, 1)), ints(rng, (2, 3, 3, 1))
    batch_n = oc.IndexSymbol("batch_n", 2)
    images = oc.tensor(X, batch=2)[batch_n]
    y = oc.einsum("... | 1*oh=+kh, 1*ow=+kw, ..ic..; kh, kw, ..ic.. -> ..oc.. => ... | oh, ow, ..oc..",
                  images, oc.tensor(K, input=3))
    ctx = oc.Context("interp")
    routine = ctx.compile(y)
    for b in (1, 0):
        routine.run(batch_n=b)
        np.testing.assert_array_equal(ctx.get(y.value), reference_conv(X[b], K, 1, 1, True))
