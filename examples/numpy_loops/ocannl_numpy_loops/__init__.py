"""``numpy_loops``: an ocannl backend that lives outside the ocannl package.

It is a small compiler: each routine's loop IR becomes the source text of one Python function
(``for`` loops over the IR's loops, numpy scalars for the arithmetic, subscripts of the numpy
buffers for loads and stores), which Python compiles once and the executable calls on every run.
It is slow, and written to be read: a template for a backend author's first backend. Installed,
it registers itself through the ``ocannl.backends`` entry point (see ``pyproject.toml``) and
``python -m ocannl.testing --backend numpy_loops`` checks it against the interpreter.

The semantics it keeps are the loop IR's (``docs/backends.md`` of ocannl): arithmetic in each
expression's type (one rounding per operation, ``fma`` rounded once), integers wrapping, stores
rounding to the node's precision, out-of-bounds accesses an error unless the load names a value
for the margin or the store skips them, and the PRNG operators' exact bits.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Callable, Mapping

import numpy as np

from ocannl.errors import CompileError, OutOfBoundsError
from ocannl.lowlevel import dtypes, prng_reference
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.indexing import Affine, AxisIndex, Fixed, IndexSymbol, Iter, Symbol
from ocannl.lowlevel.ir import (Binary, Cast, Comment, Const, DeclareLocal, EmbedIndex, Expr, Fill, For,
                                GetLocal, Load, LoadDynamic, Local, LocalScope, RoutineIR, Seq, SetLocal,
                                Stmt, Store, StoreDynamic, Ternary, Unary)
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop
from ocannl.lowlevel.tnode import TNode


class NumpyLoopsBackend:
    """The backend object ocannl's registry makes (the entry point names this class)."""

    name = "numpy_loops"
    preference = -1  # never chosen by Context.auto(): it is an example
    options = ()

    def available(self) -> tuple[bool, str]:
        return True, "needs only numpy"

    def compile(self, routine: RoutineIR) -> "NumpyLoopsExecutable":
        return NumpyLoopsExecutable(routine)


class NumpyLoopsExecutable:
    """One routine compiled to a Python function ``run(B, S)``: ``B`` the buffers in the order
    of :attr:`nodes`, ``S`` the values of the routine's static index symbols."""

    def __init__(self, routine: RoutineIR):
        self.routine = routine
        self.nodes: tuple[TNode, ...] = tuple(dict.fromkeys(routine.reads + routine.writes))
        emitter = _Emitter(routine, self.nodes)
        self.source = emitter.function()  # kept for reading: K[n] are the operator and constant table
        namespace = {"np": np, "dtypes": dtypes, "_oob": _oob, "K": emitter.constants}
        exec(compile(self.source, f"<numpy_loops {routine.name}>", "exec"), namespace)
        self._run = namespace["routine"]

    def run(self, buffers: Mapping[TNode, Any], bindings: Mapping[IndexSymbol, int]) -> None:
        missing = [s.name for s in self.routine.static_symbols if s not in bindings]
        if missing:
            raise CompileError(f"routine {self.routine.name}: no value bound for {', '.join(missing)}")
        # Subscripts follow the node's dims; a context may hand a scalar node's value over as a
        # one-cell vector, so view each buffer with the node's shape (a view: writes go through).
        views = [np.reshape(buffers[n], n.dims + ((4,) if n.dtype is dtypes.uint4x32 else ())) for n in self.nodes]
        self._run(views, [int(bindings[s]) for s in self.routine.static_symbols])


# ---------------------------------------------------------------------------------------------
# Code generation.


class _Emitter:
    def __init__(self, routine: RoutineIR, nodes: tuple[TNode, ...]):
        self.routine = routine
        self.buffers = {node: f"b{k}" for k, node in enumerate(nodes)}
        self.symbols: dict[Symbol | IndexSymbol, str] = {s: f"s{k}" for k, s in enumerate(routine.static_symbols)}
        self.extents: dict[Symbol, int] = {}
        self.locals: dict[Local, str] = {}
        self.constants: list[Any] = []
        self.lines: list[str] = []
        self.depth = 1

    def function(self) -> str:
        head = ["def routine(B, S):"]
        head.append(f"    [{', '.join(self.buffers.values())}] = B")
        head.append(f"    [{', '.join(self.symbols.values())}] = S")
        self.block(self.routine.body)
        return "\n".join(head + self.lines) + "\n"

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def const(self, value: Any) -> str:
        self.constants.append(value)
        return f"K[{len(self.constants) - 1}]"

    # -- statements ---------------------------------------------------------------------------

    def stmt(self, s: Stmt) -> None:
        match s:
            case For(symbol=symbol, extent=extent, body=body):
                name = self.symbols[symbol] = f"i{len(self.symbols)}"
                self.extents[symbol] = extent
                self.emit(f"for {name} in range({extent}):")
                self.depth += 1
                self.block(body)
                self.depth -= 1
            case Seq(stmts=stmts):
                for x in stmts:
                    self.stmt(x)
            case Comment():
                pass
            case Store(tnode=node, indices=indices, value=value, skip_oob=skip):
                v = self.expr(value)
                if skip:
                    idx = [self.index(i) for i in indices]
                    self.emit(f"if {_within(idx, node.dims)}:")
                    self.emit(f"    {self.buffers[node]}{_subscript(idx)} = {_store(node.dtype, v)}")
                else:
                    self.emit(f"{self.access(node, indices)} = {_store(node.dtype, v)}")
            case StoreDynamic(tnode=node, axis=axis, position=position, indices=indices, value=value):
                v = self.expr(value)
                self.emit(f"{self.dynamic_access(node, axis, position, indices)} = {_store(node.dtype, v)}")
            case Fill(tnode=node, value=value):
                self.emit(f"{self.buffers[node]}[...] = {_store(node.dtype, self.expr(value))}")
            case DeclareLocal(local=local):
                self.emit(f"{self.local(local)} = {self.const(_zero(local.dtype))}")
            case SetLocal(local=local, value=value):
                self.emit(f"{self.local(local)} = {self.expr(value)}")
            case _:
                raise CompileError(f"numpy_loops: not a loop IR statement: {s!r}")

    def block(self, s: Stmt) -> None:
        """``s`` as an indented Python block (``pass`` when it emits nothing, as a comment)."""
        start = len(self.lines)
        self.stmt(s)
        if len(self.lines) == start:
            self.emit("pass")

    def local(self, local: Local) -> str:
        return self.locals.setdefault(local, f"v{len(self.locals)}")

    # -- indexing -----------------------------------------------------------------------------

    def index(self, idx: AxisIndex) -> str:
        match idx:
            case Fixed(index=i):
                return str(i)
            case Iter(symbol=s):
                return self.symbols[s]
            case Affine(terms=terms, offset=offset):
                return "(" + " + ".join([f"{c} * {self.symbols[s]}" for c, s in terms] + [str(offset)]) + ")"
        raise CompileError(f"numpy_loops: not an axis index: {idx!r}")

    def provably_inside(self, idx: AxisIndex, dim: int) -> bool:
        """Whether ``idx`` stays in ``[0, dim)`` for every value of its loops (no check needed)."""
        if isinstance(idx, Fixed):
            return 0 <= idx.index < dim
        terms = ((1, idx.symbol),) if isinstance(idx, Iter) else idx.terms
        offset = 0 if isinstance(idx, Iter) else idx.offset
        if any(s not in self.extents for _, s in terms):
            return False  # a static index symbol: known at run time only
        low = offset + sum(min(0, c * (self.extents[s] - 1)) for c, s in terms)
        high = offset + sum(max(0, c * (self.extents[s] - 1)) for c, s in terms)
        return 0 <= low and high < dim

    def access(self, node: TNode, indices: tuple[AxisIndex, ...]) -> str:
        idx = [self.index(i) for i in indices]
        unchecked = all(self.provably_inside(i, d) for i, d in zip(indices, node.dims))
        if not unchecked:  # Python would wrap a negative index around: check it ourselves
            self.emit(f"if not ({_within(idx, node.dims)}): _oob({node.name!r}, ({', '.join(idx)},), {node.dims})")
        return f"{self.buffers[node]}{_subscript(idx)}"

    def dynamic_access(self, node: TNode, axis: int, position: Expr, indices: tuple[AxisIndex, ...]) -> str:
        idx = [self.index(i) for i in indices]
        idx.insert(axis, f"int({self.expr(position)})")
        name = f"p{len(self.lines)}"
        self.emit(f"{name} = ({', '.join(idx)},)")
        self.emit(f"if not ({_within([f'{name}[{k}]' for k in range(len(idx))], node.dims)}): "
                  f"_oob({node.name!r}, {name}, {node.dims})")
        return f"{self.buffers[node]}[{name}]"

    # -- expressions --------------------------------------------------------------------------

    def expr(self, e: Expr) -> str:
        match e:
            case Const(value=value, dtype=dtype):
                return self.const(_constant(value, dtype))
            case Load(tnode=node, indices=indices, oob_value=None):
                return _load(node.dtype, self.access(node, indices))
            case Load(tnode=node, indices=indices, oob_value=margin):
                idx = [self.index(i) for i in indices]
                inside = _load(node.dtype, f"{self.buffers[node]}{_subscript(idx)}")
                return f"({inside} if {_within(idx, node.dims)} else {self.const(_constant(margin, e.dtype))})"
            case LoadDynamic(tnode=node, axis=axis, position=position, indices=indices):
                return _load(node.dtype, self.dynamic_access(node, axis, position, indices))
            case Unary(op=op, x=x):
                return f"{self.const(_UNARY[op](e.dtype))}({self.expr(x)})"
            case Binary(op=op, a=a, b=b):
                return f"{self.const(_BINARY[op](e.dtype))}({self.expr(a)}, {self.expr(b)})"
            case Ternary(op=Ternop.WHERE, a=a, b=b, c=c):
                return f"({self.expr(b)} if {self.expr(a)} != 0 else {self.expr(c)})"
            case Ternary(op=Ternop.FMA, a=a, b=b, c=c):
                return f"{self.const(_fma(e.dtype))}({self.expr(a)}, {self.expr(b)}, {self.expr(c)})"
            case Ternary(op=Ternop.MUL3, a=a, b=b, c=c):
                return f"({self.expr(a)} * {self.expr(b)} * {self.expr(c)})"
            case Cast(x=x, dtype=dtype):
                return f"{self.const(_cast(dtype))}({self.expr(x)})"
            case EmbedIndex(index=index, dtype=dtype):
                return f"{self.const(_cast(dtype))}({self.index(index)})"
            case GetLocal(local=local):
                return self.local(local)
            case LocalScope(local=local, body=body):
                # Expressions have no side effects, so the scope's statements run just before the
                # statement that uses its value, at the same loop depth.
                self.emit(f"{self.local(local)} = {self.const(_zero(local.dtype))}")
                self.stmt(body)
                return self.local(local)
        raise CompileError(f"numpy_loops: not a loop IR expression: {e!r}")


def _subscript(idx: list[str]) -> str:
    return f"[{', '.join(idx)}]" if idx else "[()]"  # a scalar node is a 0-d array


def _within(idx: list[str], dims: tuple[int, ...]) -> str:
    return " and ".join(f"0 <= {i} < {d}" for i, d in zip(idx, dims)) or "True"


def _load(dtype: DType, access: str) -> str:
    if dtype is dtypes.float16:
        return f"np.float32({access})"
    if dtype is dtypes.bfloat16:
        return f"(np.uint32({access}) << np.uint32(16)).view(np.float32)"
    return f"{access}.copy()" if dtype is dtypes.uint4x32 else access


def _store(dtype: DType, value: str) -> str:
    return f"dtypes.float32_to_bfloat16_bits({value})[()]" if dtype is dtypes.bfloat16 else value


# ---------------------------------------------------------------------------------------------
# The operators, for values of one compute type (numpy scalars; uint4x32 as arrays of 4 words).


def _constant(value: Any, dtype: DType) -> Any:
    if dtype is dtypes.uint4x32:
        return np.array(value, dtype=np.uint32)
    return dtype.scalar(value) if dtype.is_float else dtypes.wrap_int(dtype, int(value))


def _zero(dtype: DType) -> Any:
    return _constant((0, 0, 0, 0) if dtype is dtypes.uint4x32 else 0, dtype)


def _truth(dtype: DType, test: Callable[..., bool]) -> Callable[..., Any]:
    one, zero = dtype.scalar(1), dtype.scalar(0)
    return lambda *xs: one if test(*xs) else zero


def _int_quotient(a: int, b: int) -> int:
    q = abs(a) // abs(b)  # ZeroDivisionError for b == 0, as the interpreter
    return q if (a < 0) == (b < 0) else -q


def _cast(target: DType) -> Callable[[Any], Any]:
    if target.is_float:
        return target.scalar
    return lambda v: dtypes.round_to(target, v)  # truncates floats, wraps integers


_UNARY: dict[Unop, Callable[[DType], Callable]] = {
    Unop.ID: lambda t: lambda x: x,
    Unop.RELU: lambda t: lambda x: x if x > 0 else t.scalar(0),
    Unop.SAT01: lambda t: lambda x: t.scalar(1) if x >= 1 else (x if x > 0 else t.scalar(0)),
    Unop.EXP: lambda t: np.exp, Unop.LOG: lambda t: np.log, Unop.EXP2: lambda t: np.exp2,
    Unop.LOG2: lambda t: np.log2, Unop.SIN: lambda t: np.sin, Unop.COS: lambda t: np.cos,
    Unop.SQRT: lambda t: np.sqrt, Unop.TANH: lambda t: np.tanh,
    Unop.RECIP: lambda t: lambda x: t.scalar(1) / x,
    Unop.RECIP_SQRT: lambda t: lambda x: t.scalar(1) / np.sqrt(x),
    Unop.NEG: lambda t: lambda x: -x,
    Unop.SIGMOID: lambda t: lambda x: t.scalar(1) / (t.scalar(1) + np.exp(-x)),
    Unop.ERF: lambda t: lambda x: t.scalar(math.erf(x)),  # numpy has none: the C library's, rounded
    Unop.ABS: lambda t: abs,
    Unop.NOT: lambda t: _truth(t, lambda x: x == 0),
    Unop.UNIFORM1: lambda t: (lambda b: prng_reference.uniform1_float32(b)[()]) if t is dtypes.float32
    else (lambda b: prng_reference.uniform1_float64(b)[()]),
    Unop.UINT4X32_OF: lambda t: lambda v: np.array(
        ((int(v) & 0xFFFFFFFF), (int(v) >> 32) & 0xFFFFFFFF, 0, 0), dtype=np.uint32),
}

_BINARY: dict[Binop, Callable[[DType], Callable]] = {
    Binop.ADD: lambda t: lambda a, b: a + b,
    Binop.SUB: lambda t: lambda a, b: a - b,
    Binop.MUL: lambda t: lambda a, b: a * b,
    Binop.DIV: lambda t: (lambda a, b: a / b) if t.is_float
    else (lambda a, b: dtypes.wrap_int(t, _int_quotient(int(a), int(b)))),
    Binop.POW: lambda t: lambda a, b: a ** b,  # the scalar power is C's pow (not np.power's sqrt)
    # fmax/fmin: the non-NaN operand; between equal values (+0.0 and -0.0), the second.
    Binop.MAX: lambda t: lambda a, b: a if a > b or b != b else b,
    Binop.MIN: lambda t: lambda a, b: a if a < b or b != b else b,
    Binop.LT: lambda t: _truth(t, lambda a, b: a < b),
    Binop.GT: lambda t: _truth(t, lambda a, b: a > b),
    Binop.EQ: lambda t: _truth(t, lambda a, b: a == b),
    Binop.NE: lambda t: _truth(t, lambda a, b: a != b),
    Binop.RELU_GATE: lambda t: lambda a, b: b if a > 0 else t.scalar(0),
    Binop.SAT01_GATE: lambda t: lambda a, b: b if 0 < a < 1 else t.scalar(0),
    Binop.MOD: lambda t: np.fmod if t.is_float
    else (lambda a, b: dtypes.wrap_int(t, int(a) - int(b) * _int_quotient(int(a), int(b)))),
    Binop.AND: lambda t: _truth(t, lambda a, b: a != 0 and b != 0),
    Binop.OR: lambda t: _truth(t, lambda a, b: a != 0 or b != 0),
    Binop.THREEFRY4X32: lambda t: lambda key, counter: prng_reference.threefry4x32(key, counter),
}


def _fma(dtype: DType) -> Callable[[Any, Any, Any], Any]:
    """``a * b + c`` with one rounding: the exact rational result, then the nearest value of
    ``dtype`` (ties to even), found among the neighbours of the double-rounded guess."""
    if not dtype.is_float:
        return lambda a, b, c: dtypes.wrap_int(dtype, int(a) * int(b) + int(c))
    t = dtype.scalar

    def fma(a: Any, b: Any, c: Any) -> Any:
        if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)):
            return t(float(a) * float(b) + float(c))
        exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
        guess = t(float(exact))
        if not math.isfinite(guess):
            return guess
        candidates = (np.nextafter(guess, t(-np.inf)), guess, np.nextafter(guess, t(np.inf)))
        finite = [x for x in candidates if math.isfinite(x)]
        return min(finite, key=lambda x: (abs(Fraction(float(x)) - exact), int(np.asarray(x).view(
            np.uint32 if dtype is dtypes.float32 else np.uint64)) & 1))

    return fma


def _oob(node: str, index: tuple[int, ...], dims: tuple[int, ...]) -> None:
    raise OutOfBoundsError(f"numpy_loops: index {list(index)} is outside {node} of dims {list(dims)}")
