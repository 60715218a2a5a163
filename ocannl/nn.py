"""Building blocks (README, "Building blocks").

Blocks with parameters are factories whose instance keeps its params
(``m = nn.mlp(hid_dims=(16, 16), label="mlp"); y = m(x)``, ``m.params``); parameter-free blocks
are plain functions of their input. Dims are inferred from use wherever the original infers them.
Blocks that behave differently in training and evaluation (dropout, batch norm) take
``train=`` when called, as PyTorch modules switch with ``.train()`` / ``.eval()``.

A block that updates values when it runs, other than by training, lists them in ``.state``
(batch norm's running statistics; PyTorch's buffers): data tensors its own code writes, which
``oc.save`` saves with ``.params`` so that a loaded block computes what the saved one computed
(docs/training.md, "Checkpoints"). Dropout, a function, keeps its run counter in the graph
(``ocannl/random.py``), where ``train.save_checkpoint`` finds it.
"""

from __future__ import annotations

import math
import numbers
from typing import Sequence

import numpy as np

from ocannl import init, interop, ops, random
from ocannl.errors import ShapeError
from ocannl.lowlevel.assignments import Accum, Apply, Arg, Assignment, Block
from ocannl.lowlevel.scalar_ops import Binop, Unop
from ocannl.shape import einsum as es
from ocannl.shape.logic import Pointwise
from ocannl.shape.projections import identity_projections
from ocannl.tensor import Tensor, as_tensor, param, tensor


class mlp:  # noqa: N801 - a factory named as the catalog names it
    """A multi-layer perceptron: ``relu(w_i @ h + b_i)`` per hidden layer, then ``w_out @ h``
    (no output bias, as the original ``mlp``). Input dims of every weight are inferred from use;
    so are the output dims of ``w_out`` unless ``out`` (an int or a tuple) fixes them, as a block
    used alone, whose result nothing else constrains, needs."""

    def __init__(self, hid_dims: Sequence[int], out: int | Sequence[int] | None = None, label: str = "mlp"):
        self.label = label
        self.layers = [
            (param(f"{label}_w{i + 1}", output=d), param(f"{label}_b{i + 1}", output=d, init=0.0))
            for i, d in enumerate(hid_dims)
        ]
        self.w_out = param(f"{label}_w_out", output=out)

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
    m = ops.stop_gradient(ops.einmax(reduce, xs))  # a constant shift: no gradient to compute
    e = ops.exp(xs - m)
    return e / ops.einsum(reduce, e)


def log_softmax(x: Tensor, spec: str = "... | ..., t") -> Tensor:
    """``log(softmax(x))`` over the axes :func:`softmax` reduces, computed stably in one
    expression: ``s - log(sum(exp(s)))`` with ``s = x - max``, so a large logit neither
    overflows nor rounds its neighbours' logarithms to ``-inf``, as PyTorch's ``log_softmax``."""
    reduce = _zeroed_result(spec)
    shifted = x - ops.stop_gradient(ops.einmax(reduce, x))
    return shifted - ops.log(ops.einsum(reduce, ops.exp(shifted)))


def silu(x) -> Tensor:
    """``x * sigmoid(x)`` (swish), as PyTorch's ``F.silu``."""
    x = as_tensor(x)
    return x * ops.sigmoid(x)


GELU_FORMS = ("none", "tanh")
"""The forms of :func:`gelu`, by PyTorch's names: the exact one and the tanh approximation."""


def gelu(x, approximate: str = "none") -> Tensor:
    """The Gaussian error linear unit, as PyTorch's ``F.gelu``: ``x * Phi(x)`` with ``Phi`` the
    standard normal distribution function, ``0.5 x (1 + erf(x / sqrt 2))``
    (``approximate="none"``), or its approximation
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (``"tanh"``, GPT-2's). Its gradient is
    the one of that expression, through ``oc.erf`` or ``oc.tanh``."""
    if approximate not in GELU_FORMS:
        raise ValueError(f"nn.gelu: approximate is one of {GELU_FORMS} (as in PyTorch), got {approximate!r}")
    x = as_tensor(x)
    if approximate == "tanh":
        phi = 1.0 + ops.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x)))
    else:
        phi = 1.0 + ops.erf(x * math.sqrt(0.5))
    return 0.5 * x * phi


def softplus(x) -> Tensor:
    """``log(1 + exp(x))`` as PyTorch's ``F.softplus``, written ``m + log(exp(-m) + exp(x - m))``
    with ``m = relu(x)`` so that no ``exp`` overflows: a large ``x`` gives ``x``, a very negative
    one about ``exp(x)`` (below float32's resolution near 1, it rounds to 0). The form is exact
    for any ``m``, so the gradient through ``m`` cancels and what remains is ``sigmoid(x)``, at
    ``x = 0`` too, where ``relu``'s own gradient is 0."""
    x = as_tensor(x)
    m = ops.relu(x)
    return m + ops.log(ops.exp(-m) + ops.exp(x - m))


def max_pool2d(x: Tensor, stride: int = 2, window_size: int = 2) -> Tensor:
    """The maximum over ``window_size``-square windows of the two output axes before the
    channels (``... | h, w, ..c..``), moving by ``stride``: a one-operand max einsum whose window
    axes get their size from the captured labels, giving ``floor((h - window_size) / stride) + 1``
    rows as PyTorch's ``MaxPool2d`` (the cells past the last window are not read;
    docs/semantics.md, "Convolution sizes"). Each result is one of the window's values, a
    negative zero included, as PyTorch's; no kernel operand is added to each term. At a tie, the
    gradient goes to the window's first maximum in row-major order, as PyTorch's
    (docs/semantics.md, "Gradients at ties")."""
    spec = f"... | {stride}*oh<+wh, {stride}*ow<+ww, ..c.. => ... | oh, ow, ..c.."
    y = ops.einmax(spec, x, capture=["wh", "ww"], label="max_pool2d")
    y.captured["wh"].set(window_size)
    y.captured["ww"].set(window_size)
    return y


def avg_pool2d(x: Tensor, stride: int = 2, window_size: int = 2) -> Tensor:
    """The mean over windows, as :func:`max_pool2d` with a sum."""
    window = tensor(np.zeros((window_size, window_size), np.float32), label="pool_window")
    spec = (f"... | {stride}*oh<+wh, {stride}*ow<+ww, ..c..; wh, ww => ... | oh, ow, ..c..")
    return ops.outer_sum(spec, x, window, label="avg_pool2d") / float(window_size * window_size)


class conv2d:  # noqa: N801
    """2-D convolution over the two output axes before the channels: ``x`` is
    ``... | h, w, ..ic..``, the kernel ``kh, kw, ..ic.. -> ..oc..`` (memory layout
    ``[oc, kh, kw, ic]``), plus a bias. Input channels are inferred. Padded convolutions have
    ``ceil(h / stride)`` positions (PyTorch's ``padding=kernel_size // 2`` for an odd kernel), valid
    ones ``floor((h - kernel_size) / stride) + 1``: the stride need not divide the input."""

    def __init__(self, out_channels: int, kernel_size: int = 3, stride: int = 1, use_padding: bool = True,
                 label: str = "conv2d"):
        self.kernel = param(f"{label}_kernel", output=out_channels)
        self.bias = param(f"{label}_bias", output=out_channels, init=0.0)
        self.kernel_size, self.stride, self.use_padding = kernel_size, stride, use_padding

    @property
    def params(self) -> list[Tensor]:
        return [self.kernel, self.bias]

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
    means to average; this is the standard definition, as PyTorch's ``LayerNorm``."""

    def __init__(self, label: str = "layer_norm", eps: float = 1e-5):
        self.gamma = param(f"{label}_gamma", init=1.0)
        self.beta = param(f"{label}_beta", init=0.0)
        self.eps = eps

    @property
    def params(self) -> list[Tensor]:
        return [self.gamma, self.beta]

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

    @property
    def params(self) -> list[Tensor]:
        return [self.w_q, self.w_k, self.w_v, self.w_o]

    def __call__(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        q, k, v = self.w_q @ x, self.w_k @ x, self.w_v @ x
        scores = ops.einsum("... s | h d; ... t | h d => ... s | t -> h", q, k) * self.scale
        if mask is not None:
            scores = ops.where(mask, scores, -1e9)
        attn = softmax(scores, spec="... | t -> ...")
        out = ops.einsum("... s | t -> h; ... t | h e => ... s | h e", attn, v)
        return self.w_o @ out


class linear:  # noqa: N801
    """A dense layer ``w @ x + b``: ``w`` has output dims ``out`` (an int, a tuple, or None to
    infer them from use) and input dims inferred from ``x``'s output dims; ``b`` (left out with
    ``bias=False``) has output dims ``out``. ``w`` starts Glorot uniform and ``b`` at 0 (PyTorch's
    ``nn.Linear`` draws both from a Kaiming uniform)."""

    def __init__(self, out: int | Sequence[int] | None, label: str = "linear", bias: bool = True):
        self.label = label
        self.w = param(f"{label}_w", output=out)
        self.b = param(f"{label}_b", output=out, init=0.0) if bias else None

    @property
    def params(self) -> list[Tensor]:
        return [self.w] if self.b is None else [self.w, self.b]

    def __call__(self, x: Tensor) -> Tensor:
        y = self.w @ x
        return y if self.b is None else y + self.b


class embedding:  # noqa: N801
    """A lookup table of ``vocab`` rows of ``dim`` values: ``emb(ids)`` gathers the rows the
    integer values of ``ids`` pick (``oc.take``), so ids of batch ``[b, s]`` give batch ``[b, s]``,
    output ``[dim]``. The table (``.params[0]``, output dims ``(vocab, dim)``) starts standard
    normal, as PyTorch's ``nn.Embedding``; its gradient adds up the rows' gradients."""

    def __init__(self, vocab: int, dim: int, label: str = "embedding"):
        self.label = label
        self.table = param(f"{label}_table", output=(vocab, dim), input=(), init=init.normal())

    @property
    def params(self) -> list[Tensor]:
        return [self.table]

    def __call__(self, ids) -> Tensor:
        return ops.take(self.table, ids, label=self.label)


def dropout(x, rate: float, *, train: bool = True, label: str | None = None) -> Tensor:
    """Zero each cell of ``x`` with probability ``rate`` and scale the others by
    ``1 / (1 - rate)``, so the expectation is unchanged; the identity with ``train=False`` or
    ``rate=0``.

    The mask is drawn anew on every run of the routine computing it (``ocannl/random.py``): two
    ``step.run()`` calls drop different cells, with nothing to bind. It depends only on the session
    seed when the routine is compiled (``oc.seed``), the program, and the number of runs so far on
    that context, so it is the same, bit for bit, on every backend; ``train.save_checkpoint``
    saves that number (the draw's run counter), so a resumed run draws the masks an uninterrupted
    one draws. The mask is stored, and the gradient reads it: ``x.grad = g * mask``."""
    if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0.0 <= rate <= 1.0:
        raise ValueError(f"nn.dropout: rate is a probability in [0, 1], got {rate!r}")
    x = as_tensor(x)
    if not train or rate == 0:
        return x
    name = label or f"{x.label}_dropout"
    draw = random.uniform_like(x, label=f"{name}_draw")
    keep = 1.0 / (1.0 - float(rate)) if rate < 1 else 0.0
    mask = ops.where(draw < float(rate), 0.0, keep, label=f"{name}_mask").materialize()
    return ops.mul(x, mask, label=name)


def _channel_mean(x: Tensor, label: str) -> Tensor:
    """The mean over the batch axes and every output axis but the last (the channel): output
    ``[c]``. The batch mean first, then the mean of the other output axes moved to the batch row
    (an einsum allows one row variable per row)."""
    per_position = x.mean(axes="batch", label=f"{label}_batch_mean")
    return ops.einsum("..s.., c => ..s.. | c", per_position).mean(axes="batch", label=label)


def _running_statistics_forward(t: Tensor) -> Assignment:
    """Fold the batch statistics into the block's running statistics, then write ``eps``."""
    mean, var, running_mean, running_var = t.operands
    block: batch_norm = t.attrs["block"]
    x: Tensor = t.attrs["input"]
    dims = t.dims
    n = math.prod(x.dims) // max(1, math.prod(dims))
    if n < 2:
        raise ShapeError(f"batch_norm {block.label!r}: training needs more than one value per channel to "
                         f"estimate a variance; {x.label!r} has dims {x.dims} (channel last)")
    m = float(block.momentum)

    def fold(running: Tensor, batch: Tensor, scale: float) -> Accum:
        expr = Apply(Binop.ADD, (Apply(Binop.MUL, (1.0 - m, Arg(0))), Apply(Binop.MUL, (m * scale, Arg(1)))))
        return Accum(running.value, None, expr, (running.value, batch.value),
                     lambda: identity_projections(dims, [dims, dims]), spec=".")

    eps = Accum(t.value, None, Unop.ID, (float(block.eps),), lambda: identity_projections(dims, [()]), spec=".")
    return Block((fold(running_mean, mean, 1.0), fold(running_var, var, n / (n - 1)), eps),
                 comment=f"{block.label} running statistics")


RUNNING_STATISTICS = ops.define(ops.OpDef("running_statistics", shape=lambda operands: Pointwise(),
                                          forward=_running_statistics_forward, gradient=None))
"""Batch norm's ``eps`` as a tensor (output ``[c]``) whose forward code first folds the batch
mean and variance (its first two operands) into the running mean and variance (the other two:
data tensors, so that they are initialized wherever the step is compiled), as PyTorch's
``BatchNorm`` does in training mode: ``running = (1 - momentum) * running + momentum * batch`` with the variance
made unbiased (``* n / (n - 1)``, ``n`` the cells per channel). The normalization reads this
tensor, so the update runs, once, wherever the normalization is computed. It has no gradient: the
gradient flows through the batch statistics."""


class batch_norm:  # noqa: N801
    """Batch normalization over the last output axis as the channel (``... | h, w, c``, or
    ``... | c``): ``gamma * (x - mean) / sqrt(var + eps) + beta``, ``gamma`` and ``beta`` of
    output ``[c]`` (starting at 1 and 0).

    ``bn(x)`` (training) uses the mean and the biased variance over the batch axes and the other
    output axes, and updates the running mean and the running (unbiased) variance each time it is
    computed; ``bn(x, train=False)`` uses the running statistics, which start at 0 and 1 on each
    context. ``momentum`` and ``eps`` default to PyTorch's (0.1, 1e-5). The running statistics
    are data tensors, ``bn.running_mean`` and ``bn.running_var``, made at the first call, when
    the channel count must be known; ``bn.state`` lists them from then on (before, nothing), so
    that ``oc.save(path, bn)`` saves them with ``gamma`` and ``beta``."""

    def __init__(self, label: str = "batch_norm", momentum: float = 0.1, eps: float = 1e-5):
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"nn.batch_norm {label!r}: momentum is in [0, 1], got {momentum!r}")
        self.label, self.momentum, self.eps = label, momentum, eps
        self.gamma = param(f"{label}_gamma", init=1.0)
        self.beta = param(f"{label}_beta", init=0.0)
        self.running_mean: Tensor | None = None
        self.running_var: Tensor | None = None

    @property
    def params(self) -> list[Tensor]:
        return [self.gamma, self.beta]

    @property
    def state(self) -> list[Tensor]:
        """The running mean and variance, once the first call made them."""
        return [] if self.running_mean is None else [self.running_mean, self.running_var]

    def _channels(self, x: Tensor) -> int:
        """The channel count of ``x``; makes the running statistics on the first call."""
        output = x.shape.output
        channels = output[-1] if output and output[-1] is not Ellipsis else None
        if not isinstance(channels, int):
            raise ShapeError(f"batch_norm {self.label!r}: the channel count (the last output dim of {x.label!r}, "
                             f"shape {x.shape}) must be known when the block is called; give the layer before "
                             f"it its output size")
        if self.running_mean is None:
            self.running_mean = tensor(np.zeros(channels, np.float32), label=f"{self.label}_running_mean")
            self.running_var = tensor(np.ones(channels, np.float32), label=f"{self.label}_running_var")
        elif self.running_mean.shape.output != (channels,):
            raise ShapeError(f"batch_norm {self.label!r}: called on {channels} channels ({x.label!r}), but its "
                             f"running statistics have {self.running_mean.shape.output[0]}")
        return channels

    def __call__(self, x, train: bool = True) -> Tensor:
        x = as_tensor(x)
        self._channels(x)
        if train:
            mean = _channel_mean(x, f"{self.label}_mean")
            centered = x - mean
            var = _channel_mean(centered * centered, f"{self.label}_var")
            eps = RUNNING_STATISTICS(mean, var, self.running_mean, self.running_var, label=f"{self.label}_eps",
                                     attrs={"block": self, "input": x})
        else:
            centered = x - self.running_mean
            var, eps = self.running_var, self.eps
        normalized = centered / ops.sqrt(var + eps)
        spec = "... | ..s.., c; c => ... | ..s.., c"
        return ops.outer_sum(spec, ops.einsum(spec, normalized, self.gamma), self.beta, label=self.label)


def cross_entropy(logits, targets, *, label: str | None = None) -> Tensor:
    """The mean over the batch of ``-sum(targets * log_softmax(logits))`` over the output axes:
    ``targets`` one-hot (or any probabilities) with ``logits``' shape, as PyTorch's
    ``F.cross_entropy`` with class indices (or probabilities). The log-sum-exp subtracts the
    maximum first, so large logits do not overflow."""
    logits, targets = as_tensor(logits), as_tensor(targets)
    shifted = logits - ops.stop_gradient(logits.max(axes="output"))
    log_probs = shifted - ops.log(ops.exp(shifted).sum(axes="output"))
    return (-(targets * log_probs).sum(axes="output")).mean(label=label or "cross_entropy")


def causal_mask(seq_len: int) -> Tensor:
    """1 where position ``s`` may attend to position ``t <= s``, else 0: batch ``[seq_len]``,
    input ``[seq_len]``, the shape :class:`multi_head_attention` reads masks in."""
    return tensor(np.tril(np.ones((seq_len, seq_len), np.float32)), batch=1, input=1, label="causal_mask")


class transformer_block:  # noqa: N801
    """A pre-norm transformer block over ``x`` of ``... s | d_model`` (the last batch axis is the
    sequence): ``h = x + attention(layer_norm(x))``, then ``h + ff2(relu(ff1(layer_norm(h))))``
    with ``ff1`` of width ``d_ff`` and ``ff2`` back to ``d_model`` (inferred from ``x``), as
    PyTorch's ``TransformerEncoderLayer(norm_first=True)`` without dropout, attention biases or
    input projections packed together. ``causal=True`` (or ``block(x, mask=nn.causal_mask(s))``)
    lets each position attend only to itself and earlier ones."""

    def __init__(self, num_heads: int, d_k: int, d_ff: int, label: str = "transformer", causal: bool = False,
                 eps: float = 1e-5):
        self.label, self.causal = label, causal
        self.norm1 = layer_norm(f"{label}_norm1", eps)
        self.attention = multi_head_attention(num_heads, d_k, label=f"{label}_attention")
        self.norm2 = layer_norm(f"{label}_norm2", eps)
        self.ff1 = linear(d_ff, label=f"{label}_ff1")
        self.ff2 = linear(None, label=f"{label}_ff2")

    @property
    def params(self) -> list[Tensor]:
        return [*self.norm1.params, *self.attention.params, *self.norm2.params, *self.ff1.params, *self.ff2.params]

    def __call__(self, x, mask: Tensor | None = None) -> Tensor:
        x = as_tensor(x)
        if mask is None and self.causal:
            batch = x.shape.batch
            seq_len = batch[-1] if batch and batch[-1] is not Ellipsis else None
            if not isinstance(seq_len, int):
                raise ShapeError(f"transformer_block {self.label!r}: a causal mask needs the sequence length (the "
                                 f"last batch dim of {x.label!r}, shape {x.shape}) when the block is called")
            mask = causal_mask(seq_len)
        h = x + self.attention(self.norm1(x), mask)
        return h + self.ff2(ops.relu(self.ff1(self.norm2(h))))


def summary(model_or_params) -> str:
    """A table of the parameters of a block or a list of them (``interop.parameters``): a line per
    parameter with its label, dims (memory order: output then input axes), precision and count
    of values, ``frozen`` after a parameter made with ``trainable=False``; then the total count,
    and the trainable count when some are frozen. Dims are inferred from use: call the model
    once first (an error names a parameter whose dims are not known yet)."""
    params = interop.parameters(model_or_params)
    rows = [(p.label, str(p.dims), p.dtype.name, f"{math.prod(p.dims):,}", "" if p.trainable else "frozen")
            for p in params]
    total = sum(math.prod(p.dims) for p in params)
    trainable = sum(math.prod(p.dims) for p in params if p.trainable)
    footer = [("total", "", "", f"{total:,}", "")]
    if trainable != total:
        footer.append(("trainable", "", "", f"{trainable:,}", ""))
    table = [("parameter", "dims", "precision", "count", "")] + rows + footer
    widths = [max(len(row[k]) for row in table) for k in range(4)]

    def line(row) -> str:
        label, dims, precision, count, note = row
        text = (f"{label:<{widths[0]}}  {dims:<{widths[1]}}  {precision:<{widths[2]}}  "
                f"{count:>{widths[3]}}  {note}")
        return text.rstrip()

    return "\n".join(map(line, table))
