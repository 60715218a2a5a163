"""The operator catalog: each operation's shape logic, forward code and gradient in one place.

Every public op is a function over tensors (numbers and index symbols are accepted where a tensor
is, and become scalar tensors). Names follow the catalog of spec/frontend.md §3.2 and the public API
of shared/DESIGN.md §4.
"""

from __future__ import annotations

import builtins
from typing import Sequence

import numpy as np

from ocannl.errors import EinsumSyntaxError, ShapeError
from ocannl.lowlevel.assignments import Accum, Assignment, Block, Constant, EmbedSymbol, Fetch, Slice
from ocannl.lowlevel.indexing import IndexSymbol
from ocannl.lowlevel.scalar_ops import Binop, ScalarOp, Ternop, Unop
from ocannl.shape import einsum as es
from ocannl.shape import solver as solver_mod
from ocannl.shape.logic import BatchSlice, Compose, Einsum, Pointwise, reduction_spec
from ocannl.shape.projections import identity_projections
from ocannl.shape.shape import KINDS, Row
from ocannl.shape.solver import DimEq, Origin
from ocannl.tensor import Tensor, as_tensor, new_op

UNARY_OPS = ("relu", "sat01", "exp", "log", "exp2", "log2", "sin", "cos", "sqrt", "recip",
             "recip_sqrt", "neg", "tanh", "sigmoid", "abs", "not")
"""Pointwise unary functions (``not`` is exposed as ``oc.not_``)."""

BINARY_OPS = ("add", "sub", "mul", "div", "pow", "lt", "gt", "eq", "ne", "max", "min")
"""Pointwise binary functions; ``<``, ``>``, ``==``, ``!=`` give 1.0 where true, 0.0 elsewhere."""


# ---------------------------------------------------------------------------------------------
# Forward code. Every op's forward is one accumulating assignment over its projections,
# ``v <accum>= fn(v1, ...)``, as the original's ``%cd`` definitions (spec/frontend.md §3.2).


def _operand(t: Tensor):
    """A number is inlined as a constant; every other operand is read from its buffer."""
    return float(t.data) if t.is_constant else t.value


def _assign(t: Tensor, fn: ScalarOp, accum: Binop | None = None, spec: str = ".") -> Accum:
    """``v =: fn(...)`` (``accum`` None), or ``v =:<accum> fn(...)``: reset to the accumulator's
    neutral element, then accumulate over the reduced axes (lowering drops the reset when every
    cell is written exactly once)."""
    return Accum(t.value, accum, fn, tuple(_operand(o) for o in t.operands), t.projections,
                 initialize_neutral=accum is not None, spec=spec)


def _spec_text(t: Tensor, default: str) -> str:
    logic = t.logic
    return logic.spec.text if isinstance(logic, Einsum) else default


_POINTWISE_FN: dict[str, ScalarOp] = {
    **{op: Unop(op) for op in UNARY_OPS}, **{op: Binop(op) for op in BINARY_OPS},
    "where": Ternop.WHERE, "fma": Ternop.FMA,
}

_EINSUM_FORWARD: dict[str, tuple[Binop, dict[int, ScalarOp]]] = {
    # op: (accumulator, the function of the operands by arity)
    "einsum": (Binop.ADD, {1: Unop.ID, 2: Binop.MUL, 3: Ternop.MUL3}),
    "outer_sum": (Binop.ADD, {2: Binop.ADD}),
    "einmax": (Binop.MAX, {1: Unop.ID}),
    "tropical": (Binop.MAX, {2: Binop.ADD}),
    "sum": (Binop.ADD, {1: Unop.ID}),
    "mean": (Binop.ADD, {1: Unop.ID}),
    "max_reduce": (Binop.MAX, {1: Unop.ID}),
}


def forward_code(t: Tensor) -> Assignment:
    """The forward assignment of ``t``'s op."""
    if t.op in _POINTWISE_FN:
        fn = _POINTWISE_FN[t.op]
        if isinstance(t.logic, Einsum):  # a pointwise op given an einsum spec may reduce
            return _assign(t, fn, Binop.ADD, t.logic.spec.text)
        return _assign(t, fn)
    if t.op == "compose":
        return _assign(t, Binop.MUL, Binop.ADD, "@")
    if t.op in _EINSUM_FORWARD:
        accum, fns = _EINSUM_FORWARD[t.op]
        fn = fns.get(len(t.operands))
        if fn is None:
            raise ShapeError(f"{t.op} of {len(t.operands)} operands is not supported")
        code = _assign(t, fn, accum, _spec_text(t, t.op))
        if t.op == "mean":
            (x,) = t.operands
            count = int(np.prod(x.dims)) // builtins.max(1, int(np.prod(t.dims)))
            scale = Accum(t.value, Binop.MUL, Unop.ID, (1.0 / count,),
                          lambda: identity_projections(t.dims, [()]), spec=".")
            return Block((code, scale))
        return code
    if t.op == "slice":
        (x,) = t.operands
        return Fetch(t.value, Slice(x.value, t.logic.symbol))  # type: ignore[union-attr]
    if t.op == "embed_index":
        return Fetch(t.value, EmbedSymbol(t.symbol))  # type: ignore[arg-type]
    raise ShapeError(f"no forward code for op {t.op!r}")


def param_init_code(t: Tensor):
    """A parameter's initializer: a number fills it, an array is its value."""
    init = t.init
    if isinstance(init, (int, float)) and not isinstance(init, bool):
        return Fetch(t.value, Constant(float(init)))
    if isinstance(init, np.ndarray) or isinstance(init, (list, tuple)):
        arr = np.asarray(init, dtype=t.dtype.storage)
        if arr.shape != t.dims:
            raise ShapeError(f"parameter {t.label!r}: init array of shape {arr.shape} does not match its dims {t.dims}")
        return arr
    if callable(init):
        return init(t)
    return default_init(t)


def default_init(t: Tensor):
    """Glorot uniform for a weight (a parameter with input axes), 0 for a bias."""
    if not t._shape.input.dims:
        return Fetch(t.value, Constant(0.0))
    from ocannl import init as init_mod

    return init_mod.glorot_uniform(t)

# ---------------------------------------------------------------------------------------------
# Pointwise operations.


def _pointwise(op: str, operands: Sequence, label: str | None, spec: str | None = None,
               use_padding: bool | None = None) -> Tensor:
    ts = [as_tensor(x) for x in operands]
    if spec is not None:
        parsed = es.parse_einsum(spec)
        return new_op(op, Einsum(parsed, use_padding), ts, label, spec=spec)
    return new_op(op, Pointwise(), ts, label)


def _unary(op: str):
    def fn(x, *, label: str | None = None, spec: str | None = None) -> Tensor:
        return _pointwise(op, (x,), label, spec)

    fn.__name__ = "not_" if op == "not" else op
    fn.__doc__ = f"Pointwise ``{op}``; with ``spec=`` the operand is permuted/reduced by that einsum."
    return fn


def _binary(op: str):
    def fn(a, b, *, label: str | None = None, spec: str | None = None) -> Tensor:
        return _pointwise(op, (a, b), label, spec)

    fn.__name__ = op
    fn.__doc__ = f"Pointwise ``{op}`` with numpy-style broadcasting (or the einsum ``spec=``)."
    return fn


relu, sat01, exp, log, exp2, log2, sin, cos, sqrt, recip, recip_sqrt, neg, tanh, sigmoid, abs, not_ = (
    _unary(op) for op in UNARY_OPS)
add, sub, mul, div, pow, lt, gt, eq, ne, maximum, minimum = (_binary(op) for op in BINARY_OPS)


def where(cond, a, b, *, spec: str | None = None, label: str | None = None) -> Tensor:
    """``a`` where ``cond`` is non-zero, else ``b``, broadcasting all three (numbers allowed)."""
    return _pointwise("where", (cond, a, b), label, spec)


def fma(a, b, c, *, label: str | None = None) -> Tensor:
    """``a * b + c`` pointwise, in one operation."""
    return _pointwise("fma", (a, b, c), label)


# ---------------------------------------------------------------------------------------------
# Compose, einsum and reductions.


def compose(a, b, *, label: str | None = None) -> Tensor:
    """``a @ b``: a's input axes contract with b's output axes; batch axes broadcast."""
    return new_op("compose", Compose(), [as_tensor(a), as_tensor(b)], label)


def _einsum(op: str, spec: str, operands: Sequence, arity: Sequence[int], use_padding: bool | None,
            capture: Sequence[str] | None, label: str | None) -> Tensor:
    if not isinstance(spec, str):
        raise TypeError(f"oc.{op}: the first argument is the spec string")
    parsed = es.parse_einsum(spec)
    if len(operands) not in arity or len(parsed.operands) != len(operands):
        raise EinsumSyntaxError(
            spec, len(spec),
            f"oc.{op} takes {' or '.join(map(str, arity))} operand(s); the spec has "
            f"{len(parsed.operands)} and {len(operands)} tensor(s) were given")
    logic = Einsum(parsed, use_padding)
    t = new_op(op, logic, [as_tensor(x) for x in operands], label, spec=spec)
    if capture:
        t.attrs["captured"] = {name: DimRef(logic, name, spec) for name in capture}
    return t


def einsum(spec: str, *operands, use_padding: bool | None = None, capture: Sequence[str] | None = None,
           label: str | None = None) -> Tensor:
    """Generalized einsum, sum of products over the axes absent from the result (one to three
    operands). See spec/frontend.md §2 for the grammar; ``capture`` names labels or row variables
    whose sizes the program reads (``t.captured["h"]``)."""
    return _einsum("einsum", spec, operands, (1, 2, 3), use_padding, capture, label)


def outer_sum(spec: str, a, b, *, use_padding: bool | None = None, label: str | None = None) -> Tensor:
    """Like einsum with ``+`` in place of ``*``: sums ``a + b`` over the axes absent from the result."""
    return _einsum("outer_sum", spec, (a, b), (2,), use_padding, None, label)


def einmax(spec: str, a, *, use_padding: bool | None = None, capture: Sequence[str] | None = None,
           label: str | None = None) -> Tensor:
    """One-operand einsum that takes the maximum over the axes absent from the result."""
    return _einsum("einmax", spec, (a,), (1,), use_padding, capture, label)


def tropical(spec: str, a, b, *, use_padding: bool | None = None, label: str | None = None) -> Tensor:
    """Max-plus einsum: the maximum of ``a + b`` over the axes absent from the result
    (max-pooling with a kernel-shaped ``b``)."""
    return _einsum("tropical", spec, (a, b), (2,), use_padding, None, label)


def _reduction_kinds(axes) -> tuple[str, ...]:
    if axes is None:
        return KINDS
    kinds = (axes,) if isinstance(axes, str) else tuple(axes)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"axes= takes kinds among {KINDS}, got {bad}")
    return kinds


def sum(x, axes=None, *, label: str | None = None) -> Tensor:  # noqa: A001 - the catalog's name
    """Sum over every axis (dims ``()``), or over the axes of the given kinds (``axes="batch"``)."""
    return new_op("sum", Einsum(reduction_spec(_reduction_kinds(axes))), [as_tensor(x)], label)


def mean(x, axes=None, *, label: str | None = None) -> Tensor:
    """Mean over every axis, or over the axes of the given kinds."""
    return new_op("mean", Einsum(reduction_spec(_reduction_kinds(axes))), [as_tensor(x)], label)


def max(x, axes=None, *, label: str | None = None) -> Tensor:  # noqa: A001 - the catalog's name
    """Maximum over every axis, or over the axes of the given kinds."""
    return new_op("max_reduce", Einsum(reduction_spec(_reduction_kinds(axes))), [as_tensor(x)], label)


def slice_batch(x: Tensor, sym: IndexSymbol, *, label: str | None = None) -> Tensor:
    """``x[sym]``: drop ``x``'s leftmost batch axis, reading it at ``sym``'s run-time value."""
    if not isinstance(sym, IndexSymbol):
        raise TypeError(f"tensors are indexed by an oc.IndexSymbol (a batch slice), got {type(sym).__name__}")
    return new_op("slice", BatchSlice(sym), [x], label or f"{x.label}@{sym.name}")


# ---------------------------------------------------------------------------------------------
# Dimension capture.


class DimRef:
    """A label or row variable of an einsum, captured by name: its size is readable by the
    program and can be constrained (the original's ``dim d`` / ``set_dim``, spec §2.6)."""

    def __init__(self, logic: Einsum, name: str, spec: str):
        if name not in logic.labels and name not in logic.row_vars:
            raise ShapeError(f"variable {name!r} not found in the spec {spec!r}")
        self.logic, self.name, self.spec = logic, name, spec

    @property
    def size(self) -> int | None:
        """The size (a row variable: the product of its dims), or None while unknown."""
        s = solver_mod.current()
        if self.name in self.logic.labels:
            d = s.dim(self.logic.labels[self.name])
            return d if isinstance(d, int) else None
        row = s.row(Row((), self.logic.row_vars[self.name], ()))
        if not row.is_concrete():
            return None
        n = 1
        for d in row.dims:
            n *= d  # type: ignore[operator]
        return n

    def set(self, size: int) -> None:
        """Constrain the captured dim to ``size``."""
        if self.name not in self.logic.labels:
            raise ShapeError(f"set: {self.name!r} is a row variable; only single dims can be set")
        solver_mod.current().add([DimEq(self.logic.labels[self.name], size,
                                        Origin("set_dim", self.name, solver_mod.caller_source(), (), self.spec))])

    def __repr__(self) -> str:
        return f"DimRef({self.name!r}, size={self.size})"


METHODS = {
    "relu": relu, "sat01": sat01, "exp": exp, "log": log, "exp2": exp2, "log2": log2, "sin": sin,
    "cos": cos, "sqrt": sqrt, "recip": recip, "recip_sqrt": recip_sqrt, "neg": neg, "tanh": tanh,
    "sigmoid": sigmoid, "abs": abs, "not_": not_, "sum": sum, "mean": mean, "max": max,
}
"""Functions also available as tensor methods (``t.relu()``, ``t.sum(axes="batch")``)."""
