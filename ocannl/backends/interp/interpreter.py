"""The interpreter: the executable semantics of the loop IR, and the oracle of every backend.

It walks a :class:`~ocannl.lowlevel.ir.RoutineIR` over numpy buffers. Each statement and
expression is compiled once into a Python closure; a run binds the buffers and index symbols and
calls the routine's closure. Semantics:

* Arithmetic runs in the expression's dtype with numpy scalars (``np.float32 * np.float32`` is one
  float32 rounding), so a C compiler without contraction computes the same bits; ``fma`` rounds
  once. Each operator is computed by its scalar form in ``ocannl/lowlevel/op_semantics.py``,
  the one executable statement of the catalogue (``ocannl/lowlevel/scalar_ops.py``).
* A store converts to the node's storage: float16 and bfloat16 round to nearest even.
* Every access is bounds-checked, at compile time when the loop extents prove it in bounds, else
  at run time: an index outside the buffer raises :class:`~ocannl.errors.OutOfBoundsError`
  naming the buffer, the index, the dims, the statement and the loop indices, unless the load
  has an ``oob_value`` (then it reads that value).
* Integer division by zero raises :class:`~ocannl.errors.IntegerDivisionError` naming the
  statement; other integer results wrap around.

Index arithmetic uses Python ints; numpy scalars carry values only.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from ocannl import config
from ocannl.errors import IndexBindingError, IntegerDivisionError, OcannlError, OutOfBoundsError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.analysis import affine_form, cell_provably_within, row_major_offset
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.indexing import Affine, AxisIndex, Fixed, IndexSymbol, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Cast, Comment, Const, DeclareLocal, EmbedIndex, Expr, Fill, For, GetLocal, Load, LoadDynamic, Local,
    LocalScope, Namer, RoutineIR, Seq, SetLocal, Stmt, Store, StoreDynamic, Ternary, Unary, format_stmt,
    number_names,
)
from ocannl.lowlevel.prng_reference import DEFAULT_ROUNDS, KEY_SCHEDULE_PARITY, ROTATIONS
from ocannl.lowlevel.op_semantics import (scalar_binary, scalar_fma, scalar_uint4x32_pack, scalar_uint4x32_word,
                                         scalar_unary)
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop
from ocannl.lowlevel.tnode import TNode
from ocannl.backends.interp import scalars

Thunk = Callable[[], Any]


def in_order(thunks: tuple[Thunk, ...]) -> Thunk:
    """The closure of a sequence: runs ``thunks`` one after another."""

    def run_seq() -> None:
        for thunk in thunks:
            thunk()

    return run_seq


def counted_loop(registers: list[Any], slot: int, extent: int, body: Thunk) -> Thunk:
    """The closure of a loop walked in order: runs ``body`` with register ``slot`` (the loop's
    iterator) set to ``0, 1, ..., extent - 1``."""

    def run_for() -> None:
        for value in range(extent):
            registers[slot] = value
            body()

    return run_for


INTERP_MODES = ("vectorized", "scalar")


class InterpBackend:
    """The ``interp`` backend (registered in ``ocannl.backends.registry``). ``interp_mode`` (else
    the ``interp_mode`` setting, ``OCANNL_INTERP_MODE``) picks ``vectorized`` (the default: whole
    loop nests as numpy operations, bit for bit the scalar results; ``vectorized.py``) or
    ``scalar`` (this module's literal walk, one cell at a time: the executable semantics)."""

    name = "interp"

    def __init__(self, interp_mode: str | None = None):
        mode = config.get("interp_mode", interp_mode, "vectorized").strip().lower()
        if mode not in INTERP_MODES:
            source = "the interp_mode option" if interp_mode is not None else f"setting interp_mode ({config.origin('interp_mode')})"
            raise OcannlError(f"{source} must be one of {', '.join(INTERP_MODES)}, got {mode!r}")
        self.mode = mode

    def available(self) -> tuple[bool, str]:
        return True, f"pure Python and numpy: always available ({self.mode} mode)"

    def compile(self, routine: RoutineIR) -> InterpExecutable:
        if self.mode == "scalar":
            return InterpExecutable(routine)
        from ocannl.backends.interp.vectorized import VectorizedExecutable

        return VectorizedExecutable(routine)


class InterpExecutable:
    """A routine compiled to closures. ``run`` takes the context's arrays (C-contiguous, the
    node's storage dtype, uint4x32 with a trailing axis of 4) and the index symbol values."""

    stops_at_failure = True
    """A failed check raises at once (``ocannl.backends.protocols.Executable``)."""

    def __init__(self, routine: RoutineIR):
        self.routine = routine
        self._compiler = ScalarCompiler(routine)
        self._body = self._compiler.stmt(routine.body)

    def run(self, buffers: Mapping[TNode, np.ndarray], bindings: Mapping[IndexSymbol, int]) -> None:
        c = self._compiler
        for node, slot in c.buffer_slots.items():
            self._bind_buffer(node, slot, buffers[node])
        for key, slot in c.register_slots.items():
            if isinstance(key, IndexSymbol):
                value = int(bindings[key])
                if value < 0 or (key.size is not None and value >= key.size):
                    raise IndexBindingError(f"index symbol {key.name} = {value} is outside [0, {key.size})")
                c.registers[slot] = value
        with np.errstate(all="ignore"):
            self._body()

    def _bind_buffer(self, node: TNode, slot: int, array: np.ndarray) -> None:
        """Point buffer ``slot`` at ``array``, as the flat view the closures index."""
        if not array.flags.c_contiguous:
            raise ValueError(f"the buffer of {node.debug_name} must be C-contiguous")
        self._compiler.buffers[slot] = array.reshape(-1, 4) if node.dtype is dtypes.uint4x32 else array.reshape(-1)


class ScalarCompiler:
    """Turns IR trees into closures over two lists: ``registers`` (loop and index symbol values,
    locals) and ``buffers`` (flat views of the node arrays, bound per run)."""

    def __init__(self, routine: RoutineIR):
        self.routine = routine
        self.registers: list[Any] = []
        self.register_slots: dict[Symbol | IndexSymbol | Local, int] = {}
        self.buffers: list[np.ndarray | None] = []
        self.buffer_slots: dict[TNode, int] = {}
        self._loops: list[Symbol] = []
        self._extents: dict[Symbol, int] = {}
        self._statement: Stmt | None = None

    def register(self, key: Symbol | IndexSymbol | Local) -> int:
        if key not in self.register_slots:
            self.register_slots[key] = len(self.registers)
            self.registers.append(0)
        return self.register_slots[key]

    def buffer(self, node: TNode) -> int:
        if node not in self.buffer_slots:
            self.buffer_slots[node] = len(self.buffers)
            self.buffers.append(None)
        return self.buffer_slots[node]

    @contextmanager
    def inside_loop(self, symbol: Symbol, extent: int) -> Iterator[None]:
        """Compile statements as the body of ``for symbol in range(extent)``: bounds proofs use
        the extent, out-of-bounds messages name the loop's value (the vectorized interpreter
        walks loops itself and compiles their bodies here)."""
        self._loops.append(symbol)
        self._extents[symbol] = extent
        try:
            yield
        finally:
            self._loops.pop()
            del self._extents[symbol]

    # -- statements -----------------------------------------------------------------------------

    def stmt(self, s: Stmt) -> Thunk:
        regs, bufs = self.registers, self.buffers
        match s:
            case For(symbol=symbol, extent=extent, body=body):
                r = self.register(symbol)
                with self.inside_loop(symbol, extent):
                    run_body = self.stmt(body)
                return counted_loop(regs, r, extent, run_body)
            case Seq(stmts=stmts):
                return in_order(tuple(self.stmt(x) for x in stmts if not isinstance(x, Comment)))
            case Comment():
                return lambda: None
            case Store(tnode=node, indices=indices, value=value, skip_oob=True):
                self._statement = s
                k, offset = self.buffer(node), self.offset(node, indices, "write", oob_value=0)
                compute, store = self.expr(value), _to_storage(node.dtype)

                def run_guarded_store() -> None:
                    o = offset()
                    if o is not None:
                        bufs[k][o] = store(compute())

                return run_guarded_store
            case Store(tnode=node, indices=indices, value=value):
                self._statement = s
                k, offset = self.buffer(node), self.offset(node, indices, "write")
                compute, store = self.expr(value), _to_storage(node.dtype)

                def run_store() -> None:
                    bufs[k][offset()] = store(compute())

                return run_store
            case StoreDynamic(tnode=node, axis=axis, position=position, indices=indices, value=value):
                self._statement = s
                k = self.buffer(node)
                offset = self.offset(node, indices, "write", dynamic=(axis, position))
                compute, store = self.expr(value), _to_storage(node.dtype)

                def run_store_dynamic() -> None:
                    bufs[k][offset()] = store(compute())

                return run_store_dynamic
            case Fill(tnode=node, value=value):
                k, stored = self.buffer(node), _to_storage(node.dtype)(self.expr(value)())

                def run_fill() -> None:
                    bufs[k][...] = stored

                return run_fill
            case DeclareLocal(local=local):
                r, zero = self.register(local), scalars.zero(local.dtype)

                def run_declare() -> None:
                    regs[r] = zero

                return run_declare
            case SetLocal(local=local, value=value):
                self._statement = s
                r, compute = self.register(local), self.expr(value)

                def run_set_local() -> None:
                    regs[r] = compute()

                return run_set_local
        raise TypeError(f"not a loop IR statement: {s!r}")

    # -- expressions ----------------------------------------------------------------------------

    def expr(self, e: Expr) -> Thunk:
        regs = self.registers
        match e:
            case Const(value=value, dtype=dtype):
                constant = scalars.constant(value, dtype)
                return lambda: constant
            case Load(tnode=node, indices=indices, oob_value=oob):
                return self.load(node, self.offset(node, indices, "read", oob), oob)
            case LoadDynamic(tnode=node, axis=axis, position=position, indices=indices):
                return self.load(node, self.offset(node, indices, "read", dynamic=(axis, position)), None)
            case Unary(op=Unop.UNIFORM1 | Unop.UINT4X32_OF as op, x=x):
                f, arg = _PRNG_CONVERSIONS[op, e.dtype], self.expr(x)
                return lambda: f(arg())
            case Unary(op=op, x=x):
                f, arg = scalar_unary(op, e.dtype), self.expr(x)
                return lambda: f(arg())
            case Binary(op=Binop.THREEFRY4X32, a=a, b=b):
                key, counter = self.expr(a), self.expr(b)
                return lambda: _threefry4x32(key(), counter())
            case Binary(op=Binop.UINT4X32_PACK, a=a, b=b):
                lo, hi = self.expr(a), self.expr(b)
                return lambda: scalar_uint4x32_pack(lo(), hi())
            case Binary(op=Binop.UINT4X32_WORD, a=a, b=Const(value=lane)):
                x = self.expr(a)
                return lambda: scalar_uint4x32_word(x(), lane)
            case Binary(op=Binop.DIV | Binop.MOD as op, a=a, b=b) if not e.dtype.is_float:
                f, left, right = scalar_binary(op, e.dtype), self.expr(a), self.expr(b)
                fail = self._division_by_zero(op)

                def integer_quotient() -> Any:
                    try:
                        return f(left(), right())
                    except ZeroDivisionError:
                        fail()

                return integer_quotient
            case Binary(op=op, a=a, b=b):
                f, left, right = scalar_binary(op, e.dtype), self.expr(a), self.expr(b)
                return lambda: f(left(), right())
            case Ternary(op=Ternop.WHERE, a=a, b=b, c=c):
                cond, then, other = self.expr(a), self.expr(b), self.expr(c)
                return lambda: then() if cond() != 0 else other()
            case Ternary(op=Ternop.FMA, a=a, b=b, c=c):
                f, x, y, z = scalar_fma(e.dtype), self.expr(a), self.expr(b), self.expr(c)
                return lambda: f(x(), y(), z())
            case Ternary(op=Ternop.MUL3, a=a, b=b, c=c):
                x, y, z = self.expr(a), self.expr(b), self.expr(c)
                return lambda: x() * y() * z()
            case Cast(x=x, dtype=dtype):
                f, arg = scalars.cast(x.dtype, dtype), self.expr(x)
                return lambda: f(arg())
            case EmbedIndex(index=index, dtype=dtype):
                to_scalar, value = dtype.scalar, self.index_value(index)
                low, high = dtypes.lowest(dtype), dtypes.highest(dtype)
                # Bindings reach 2**63: a value past ``dtype`` wraps, as C converts it.
                return lambda: to_scalar(v) if low <= (v := value()) <= high else dtypes.wrap_int(dtype, v)
            case GetLocal(local=local):
                r = self.register(local)
                return lambda: regs[r]
            case LocalScope(local=local, body=body):
                r, zero = self.register(local), scalars.zero(local.dtype)
                statement = self._statement
                run_body = self.stmt(body)
                self._statement = statement

                def scope() -> Any:
                    regs[r] = zero
                    run_body()
                    return regs[r]

                return scope
        raise TypeError(f"not a loop IR expression: {e!r}")

    def load(self, node: TNode, offset: Callable[[], int | None], oob: float | int | None) -> Thunk:
        bufs, k, value = self.buffers, self.buffer(node), _from_storage(node.dtype)
        if oob is None:
            if value is None:
                return lambda: bufs[k][offset()]
            return lambda: value(bufs[k][offset()])
        outside = scalars.constant(oob, node.dtype.compute)
        value = value or (lambda v: v)

        def load_or_oob() -> Any:
            o = offset()
            return outside if o is None else value(bufs[k][o])

        return load_or_oob

    # -- indices --------------------------------------------------------------------------------

    def offset(
        self,
        node: TNode,
        indices: tuple[AxisIndex, ...],
        access: str,
        oob_value: float | int | None = None,
        dynamic: tuple[int, Expr] | None = None,
    ) -> Callable[[], int | None]:
        """A closure computing the row-major offset of an access to ``node``; ``dynamic`` is a
        data-dependent axis and its position. Out of bounds, the closure returns ``None`` when the
        access has an ``oob_value`` and raises ``OutOfBoundsError`` otherwise. An access whose
        indices are provably inside the dims (every loop's extent is known, and a run checks
        index symbols against their size) is compiled to a linear form without checks."""
        dims = node.dims
        if dynamic is None and cell_provably_within(indices, dims, self._extents):
            return self._linear_offset(indices, dims)
        axes = [self.index_value(i) for i in indices]
        if dynamic is not None:
            position = self.expr(dynamic[1])
            axes.insert(dynamic[0], lambda: int(position()))
        fail = (lambda values: None) if oob_value is not None else self._out_of_bounds(node, access, dynamic)

        def checked_offset() -> int | None:
            values = tuple(a() for a in axes)
            o = 0
            for v, d in zip(values, dims):
                if not 0 <= v < d:
                    return fail(values)
                o = o * d + v
            return o

        return checked_offset

    def _linear_offset(self, indices: tuple[AxisIndex, ...], dims: tuple[int, ...]) -> Callable[[], int]:
        """``base + sum(coefficient * register)``: the row-major offset as one affine form."""
        regs = self.registers
        symbol_terms, base = affine_form(row_major_offset(indices, dims))
        terms = tuple((c, self.register(s)) for c, s in symbol_terms)
        if not terms:
            return lambda: base
        if len(terms) == 1:
            ((c0, r0),) = terms
            return lambda: c0 * regs[r0] + base
        if len(terms) == 2:
            (c0, r0), (c1, r1) = terms
            return lambda: c0 * regs[r0] + c1 * regs[r1] + base
        return lambda: base + sum(c * regs[r] for c, r in terms)

    def index_value(self, idx: AxisIndex) -> Callable[[], int]:
        regs = self.registers
        match idx:
            case Fixed(index=i):
                return lambda: i
            case Iter(symbol=s):
                r = self.register(s)
                return lambda: regs[r]
            case Affine(terms=terms, offset=off):
                pairs = tuple((c, self.register(s)) for c, s in terms)
                return lambda: off + sum(c * regs[r] for c, r in pairs)
        raise TypeError(f"not an axis index: {idx!r}")

    def _out_of_bounds(
        self, node: TNode, access: str, dynamic: tuple[int, Expr] | None = None
    ) -> Callable[[tuple[int, ...]], None]:
        statement, loops = self._statement, tuple(self._loops)
        # Lowering turns a float position without an integer value into -1 (lower._float_position).
        hint = "" if dynamic is None else (
            f"\n  axis {dynamic[0]} is indexed by data (an oc.take position); a NaN, infinite or "
            f"too large float position reads as -1")

        def fail(values: tuple[int, ...]) -> None:
            raise OutOfBoundsError(
                f"out-of-bounds {access} of {node.debug_name} at index {values}: its dims are {node.dims}\n"
                f"{self._location(statement, loops)}{hint}"
            )

        return fail

    def _division_by_zero(self, op: Binop) -> Callable[[], None]:
        """The failure of an integer ``div`` or ``mod`` of the statement being compiled, whose
        divisor is zero at run time."""
        statement, loops = self._statement, tuple(self._loops)

        def fail() -> None:
            raise IntegerDivisionError(f"integer {op.value} by zero\n{self._location(statement, loops)}") from None

        return fail

    def _location(self, statement: Stmt | None, loops: tuple[Symbol, ...]) -> str:
        """Where a run-time failure happens: the routine, the statement, and the values of the
        loop indices and index symbols at that moment."""
        namer, regs = Namer(), self.registers
        number_names(self.routine.body, namer)  # the names of the .ll file
        bound = [f"{namer.symbol(s)}={regs[self.register_slots[s]]}" for s in loops]
        bound += [f"{s.name}={regs[r]}" for s, r in self.register_slots.items() if isinstance(s, IndexSymbol)]
        where = format_stmt(statement, namer) if statement is not None else "?"
        return (f"  in routine {self.routine.name}, statement: {where}\n"
                f"  with {', '.join(bound) or 'no loop indices'}")


# ---------------------------------------------------------------------------------------------
# Values: numpy scalars of the compute type; uint4x32 values are arrays of 4 uint32.


def _bfloat16_to_float32(bits: np.uint16) -> np.float32:
    return np.uint32(int(bits) << 16).view(np.float32)


def _float32_to_bfloat16(value: np.float32) -> np.uint16:
    return dtypes.float32_to_bfloat16_bits(value)[()]


def _from_storage(dtype: DType) -> Callable[[Any], Any] | None:
    """Converts a stored cell to the node's compute type (``None``: it already is)."""
    if dtype is dtypes.float16:
        return np.float32
    if dtype is dtypes.bfloat16:
        return _bfloat16_to_float32
    if dtype is dtypes.uint4x32:
        return np.copy
    return None


def _to_storage(dtype: DType) -> Callable[[Any], Any]:
    """Converts a compute-type value to what the node's buffer stores (numpy rounds float32 to
    float16 on assignment)."""
    return _float32_to_bfloat16 if dtype is dtypes.bfloat16 else (lambda v: v)


# ---------------------------------------------------------------------------------------------
# The PRNG operators, on plain Python ints: the bit contract of ocannl/lowlevel/prng.py, written to
# be read. uint4x32 values arrive and leave as arrays of 4 uint32.

_MASK32 = 0xFFFFFFFF


def _threefry4x32(key: np.ndarray, counter: np.ndarray) -> np.ndarray:
    """Standard Threefry-4x32-20 (Random123's ``threefry4x32_R(20, counter, key)``): five groups
    of four rounds, each group followed by a key injection. Computed on local Python ints, since
    the interpreter runs it once per random cell."""
    m = _MASK32
    k0, k1, k2, k3 = key.tolist()
    ks = (k0, k1, k2, k3, k0 ^ k1 ^ k2 ^ k3 ^ KEY_SCHEDULE_PARITY)
    c0, c1, c2, c3 = counter.tolist()
    x0, x1, x2, x3 = (c0 + k0) & m, (c1 + k1) & m, (c2 + k2) & m, (c3 + k3) & m
    for s in range(1, DEFAULT_ROUNDS // 4 + 1):
        # Rounds 4(s-1) .. 4(s-1)+3 use ROTATIONS[0:4] when s is odd, ROTATIONS[4:8] when even.
        # Even rounds mix (x0, x1) and (x2, x3), odd rounds (x0, x3) and (x2, x1); mixing (a, b)
        # with rotation c is: a += b; b = rotl(b, c) ^ a. Exchanging x1 and x3 after each round
        # lets every round mix (x0, x1) and (x2, x3); after four rounds the lanes are back in
        # order for the key injection.
        for a, b in _ROTATION_GROUPS[s % 2]:
            x0 = (x0 + x1) & m
            x1 = (((x1 << a) | (x1 >> (32 - a))) & m) ^ x0
            x2 = (x2 + x3) & m
            x3 = (((x3 << b) | (x3 >> (32 - b))) & m) ^ x2
            x1, x3 = x3, x1
        # Key injection s.
        x0 = (x0 + ks[s % 5]) & m
        x1 = (x1 + ks[(s + 1) % 5]) & m
        x2 = (x2 + ks[(s + 2) % 5]) & m
        x3 = (x3 + ks[(s + 3) % 5] + s) & m
    return np.array((x0, x1, x2, x3), dtype=np.uint32)


_ROTATION_GROUPS = {1: ROTATIONS[0:4], 0: ROTATIONS[4:8]}
"""The rotations of the four rounds before injection ``s``, by ``s % 2``."""


def _uniform1_float32(bits: np.ndarray) -> np.float32:
    return np.float32(int(bits[0]) >> 8) * np.float32(2.0**-24)


def _uniform1_float64(bits: np.ndarray) -> np.float64:
    return np.float64(((int(bits[1]) << 32) | int(bits[0])) >> 11) * np.float64(2.0**-53)


def _uint4x32_of(value: Any) -> np.ndarray:
    v = int(value) & 0xFFFFFFFFFFFFFFFF
    return np.array((v & _MASK32, v >> 32, 0, 0), dtype=np.uint32)


_PRNG_CONVERSIONS: dict[tuple[Unop, DType], Callable[[Any], Any]] = {
    (Unop.UNIFORM1, dtypes.float32): _uniform1_float32,
    (Unop.UNIFORM1, dtypes.float64): _uniform1_float64,
    (Unop.UINT4X32_OF, dtypes.uint4x32): _uint4x32_of,
}
