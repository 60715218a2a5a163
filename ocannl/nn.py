"""Building blocks (spec/frontend.md §5).

Blocks with parameters are factories whose instance keeps its params
(``m = nn.mlp(hid_dims=(16, 16), label="mlp"); y = m(x)``); parameter-free blocks are plain
functions of their input. Dims are inferred from use wherever the original infers them.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ocannl import ops
from ocannl.shape import einsum as es
from ocannl.tensor import Tensor, param, tensor


class mlp:  # noqa: N801 - a factory named as the catalog names it
    """A multi-layer perceptron: ``relu(w_i @ h + b_i)`` per hidden layer, then ``w_out @ h``
    (no output bias, as the original ``mlp``). Input dims of every weight and the output dims of
    ``w_out`` are inferred from use."""

    def __init__(self, hid_dims: Sequence[int], label: str = "mlp"):
        self.label = label
        self.layers = [
            (param(f"{label}_w{i + 1}", output=d), param(f"{label}_b{i + 1}", output=d, init=0.0))
            for i, d in enumerate(hid_dims)
        ]
        self.w_out = param(f"{label}_w_out")

    @property
    def params(self) -> list[Tensor]:
        return [p for layer in self.layers for p in layer] + [self.w_out]

    def __call__(self, x: Tensor) -> Tensor:
        h = x
        for w, b in self.layers:
            h = ops.relu(w @ h + b)
        return self.w_out @ h


def _zeroed_result(spec: str) -> str:
    """``spec => spec`` with every label of the result replaced by the fixed index 0: the reduced
    axes keep size 1 and broadcast back (the original's softmax)."""
    ss = es.parse_shape_spec(spec)

    def zero_row(row: es.RowSpec) -> es.RowSpec:
        def zero(ax):
            return es.FixedIndex(0) if isinstance(ax, es.Label) else ax

        return es.RowSpec(tuple(map(zero, row.before)), row.row_var, tuple(map(zero, row.after)))

    zeroed = es.ShapeSpec(zero_row(ss.batch), zero_row(ss.input), zero_row(ss.output))
    return f"{spec} => {es.format_shape_spec(zeroed, multichar=es.is_multichar(spec))}"


def softmax(x: Tensor, spec: str = "... | ..., t", temperature: float = 1.0) -> Tensor:
    """Softmax over the labelled axes of ``spec`` (e.g. the last output axis for the default
    ``"... | ..., t"``): ``e = exp(x - max); e / sum(e)``, the max and sum keeping size-1 axes
    that broadcast back."""
    reduce = _zeroed_result(spec)
    xs = x if temperature == 1.0 else x / temperature
    m = ops.einmax(reduce, xs)
    e = ops.exp(xs - m)
    return e / ops.einsum(reduce, e)


def max_pool2d(x: Tensor, stride: int = 2, window_size: int = 2) -> Tensor:
    """The maximum over ``window_size``-square windows of the two output axes before the
    channels (``... | h, w, ..c..``), moving by ``stride``: a tropical einsum with a zero kernel
    carrying the window's shape. At a tie, the gradient goes to the window's first maximum in
    row-major order, as PyTorch's (docs/semantics.md, "Gradients at ties")."""
    window = tensor(np.zeros((window_size, window_size), np.float32), label="pool_window")
    spec = (f"... | {stride}*oh<+wh, {stride}*ow<+ww, ..c..; wh, ww => ... | oh, ow, ..c..")
    return ops.tropical(spec, x, window, label="max_pool2d")


def avg_pool2d(x: Tensor, stride: int = 2, window_size: int = 2) -> Tensor:
    """The mean over windows, as :func:`max_pool2d` with a sum."""
    window = tensor(np.zeros((window_size, window_size), np.float32), label="pool_window")
    spec = (f"... | {stride}*oh<+wh, {stride}*ow<+ww, ..c..; wh, ww => ... | oh, ow, ..c..")
    return ops.outer_sum(spec, x, window, label="avg_pool2d") / float(window_size * window_size)


class conv2d:  # noqa: N801
    """2-D convolution over the two output axes before the channels: ``x`` is
    ``... | h, w, ..ic..``, the kernel ``kh, kw, ..ic.. -> ..oc..`` (memory layout
    ``[oc, kh, kw, ic]``), plus a bias. Input channels are inferred; padded convolutions keep
    ``h/stride`` positions."""

    def __init__(self, out_channels: int, kernel_size: int = 3, stride: int = 1, use_padding: bool = True,
                 label: str = "conv2d"):
        self.kernel = param(f"{label}_kernel", output=out_channels)
        self.bias = param(f"{label}_bias", output=out_channels, init=0.0)
        self.kernel_size, self.stride, self.use_padding = kernel_size, stride, use_padding

    def __call__(self, x: Tensor) -> Tensor:
        pad = "=" if self.use_padding else "<"
        s = self.stride
        spec = f"... | {s}*oh{pad}+kh, {s}*ow{pad}+kw, ..ic..; kh, kw, ..ic.. -> ..oc.. => ... | oh, ow, ..oc.."
        y = ops.einsum(spec, x, self.kernel, capture=["kh", "kw"], label="conv2d")
        y.captured["kh"].set(self.kernel_size)
        y.captured["kw"].set(self.kernel_size)
        return y + self.bias


class layer_norm:  # noqa: N801
    """Layer normalization over the output axes: ``gamma * (x - mean) / sqrt(var + eps) + beta``
    with the mean and the (biased) variance over the output axes. The original sums where it
    means to average (spec §5, marked suspect); this is the standard definition."""

    def __init__(self, label: str = "layer_norm", eps: float = 1e-5):
        self.gamma = param(f"{label}_gamma", init=1.0)
        self.beta = param(f"{label}_beta", init=0.0)
        self.eps = eps

    def __call__(self, x: Tensor) -> Tensor:
        centered = x - x.mean(axes="output")
        var = (centered * centered).mean(axes="output")
        return self.gamma * (centered / ops.sqrt(var + self.eps)) + self.beta


def rope_frequencies(half_d: int, base: float = 1e4) -> Tensor:
    """``theta_k = base ** (-2k / (2 half_d))`` for ``k < half_d`` (output ``[half_d]``)."""
    k = np.arange(half_d, dtype=np.float64)
    return tensor((base ** (-2.0 * k / (2 * half_d))).astype(np.float32), label="rope_freqs")


def position_indices(seq_len: int) -> Tensor:
    """Batch ``[seq_len]`` holding each position."""
    return tensor(np.arange(seq_len, dtype=np.float32), batch=1, label="positions")


def sinusoidal_position_encoding(d_model: int, max_len: int) -> Tensor:
    """Batch ``[max_len]``, output ``[d_model]``: ``sin(pos / 10000**(2*(i//2)/d))`` at even
    ``i``, ``cos`` at odd ``i``."""
    pos = np.arange(max_len, dtype=np.float64)[:, None]
    i = np.arange(d_model)[None, :]
    angle = pos / 10000.0 ** (2 * (i // 2) / d_model)
    enc = np.where(i % 2 == 0, np.sin(angle), np.cos(angle))
    return tensor(enc.astype(np.float32), batch=1, label="position_encoding")


def rope(x: Tensor, freqs: Tensor, positions: Tensor) -> Tensor:
    """Rotary position embedding: the last output axis of ``x`` as pairs ``(even, odd)`` rotated
    by ``positions * freqs``."""
    angles = positions * freqs
    cos, sin = ops.cos(angles), ops.sin(angles)
    even, odd = ops.deinterleave_even(x), ops.deinterleave_odd(x)
    return ops.interleave(even * cos - odd * sin, even * sin + odd * cos)


class multi_head_attention:  # noqa: N801
    """Scaled dot-product attention with ``num_heads`` heads over the leftmost... rightmost batch
    axis as the sequence: ``x`` is ``... s | d_model``; ``w_q, w_k`` map to ``[h, d_k]``,
    ``w_v`` to ``[h, d_v]``, ``w_o`` back (its output inferred from later use, or given)."""

    def __init__(self, num_heads: int, d_k: int, d_v: int | None = None, d_model: int | None = None,
                 label: str = "mha"):
        d_v = d_v or d_k
        self.w_q = param(f"{label}_w_q", output=(num_heads, d_k))
        self.w_k = param(f"{label}_w_k", output=(num_heads, d_k))
        self.w_v = param(f"{label}_w_v", output=(num_heads, d_v))
        self.w_o = param(f"{label}_w_o", output=d_model)
        self.scale = 1.0 / math.sqrt(d_k)

    def __call__(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        q, k, v = self.w_q @ x, self.w_k @ x, self.w_v @ x
        scores = ops.einsum("... s | h d; ... t | h d => ... s | t -> h", q, k) * self.scale
        if mask is not None:
            scores = ops.where(mask, scores, -1e9)
        attn = softmax(scores, spec="... | t -> ...")
        out = ops.einsum("... s | t -> h; ... t | h e => ... s | h e", attn, v)
        return self.w_o @ out
