"""The vectorized interpreter: the scalar interpreter's results, bit for bit, with numpy doing the
loops.

The scalar interpreter (``interpreter.py``) is the literal executable semantics of the loop IR and
stays so; this module evaluates the same IR faster, and ``OCANNL_INTERP_MODE=scalar`` (or
``Context("interp", interp_mode="scalar")``) switches back to the literal walk. The equivalence
argument, which ``docs/interpreter.md`` states in full:

* **Grids.** A loop whose iterations touch disjoint cells of every node its body writes (each
  access to such a node indexes one common axis by the bare loop index), and which sets no local
  declared outside it, carries no dependence: its iterations can run in any interleaving that
  keeps each iteration's own statement order. Such loops become axes of a *grid*; each statement
  of their body runs once over the whole grid, as numpy arrays with one axis per grid loop (of
  the loop's extent, or 1 where the value does not depend on it). Every other loop is walked in
  order, in Python, one grid-wide operation per iteration.
* **Sums in loop order.** A reduction ``acc := acc + term`` over loops that do not index
  ``acc`` (a store to one cell, or a local of a ``LocalScope``), where ``term`` does not read
  ``acc``, is evaluated as all its terms at once, then combined into each accumulator in loop
  order, starting from ``acc``'s value: by ``np.add.accumulate`` (defined as the sequential left
  fold) or one grid-wide addition per term, so each cell sees the additions, and roundings, of
  the loop (:func:`_summation`).
* **Operators** are the array forms of ``ocannl/lowlevel/op_semantics.py``, written beside the
  scalar ones and equal to them applied elementwise: the same numpy ufuncs on arrays of the
  same dtype, comparisons and selections through ``np.where`` returning the operand the scalar
  code returns, the single-rounding ``fma`` by the same round-to-odd argument. Operators whose
  exact elementwise form numpy lacks (float64 ``fma``, int64 division, ``pow``) apply the scalar
  implementation to each element. Which NaN an operation on two NaNs passes on is left open,
  in both modes (numpy's scalar and array loops choose differently).
* **Errors.** A nest that may fail (an access not provably in bounds, a gather, integer division,
  a float-to-integer cast) runs vectorized with its written buffers saved; if any element would
  fail, the buffers are restored and the nest runs on the scalar path, which raises exactly the
  scalar error (or, when the failing element was on a branch ``where`` does not take, completes).
  A construct this module does not vectorize runs on the scalar path too, one top-level nest at a
  time.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ocannl.lowlevel import dtypes
from ocannl.lowlevel.analysis import (
    accesses,
    affine_form,
    cell_provably_within,
    indices_symbols,
    locals_read,
    loop_chain,
    nodes_read,
    nodes_written,
    row_major_strides,
    sets_outer_local,
)
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.indexing import AxisIndex, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Cast, Comment, Const, DeclareLocal, EmbedIndex, Expr, For, GetLocal, Load, LoadDynamic, Local,
    LocalScope, RoutineIR, Seq, SetLocal, Stmt, Store, StoreDynamic, Ternary, Unary,
)
from ocannl.lowlevel.op_semantics import (array_binary, array_fma, array_uint4x32_pack, array_uint4x32_word,
                                         array_unary)
from ocannl.lowlevel.prng_reference import threefry4x32
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop
from ocannl.lowlevel.tnode import TNode
from ocannl.backends.interp.interpreter import InterpExecutable, ScalarCompiler, counted_loop, in_order
from ocannl.backends.interp import scalars

Thunk = Callable[[], Any]

ACCUMULATE_LIMIT = 1 << 22
"""The most cells (terms times accumulators) a sum evaluates at once; a larger one is walked in
order, one grid-wide addition per iteration, in bounded memory."""


class VectorizedExecutable(InterpExecutable):
    """A routine compiled to numpy closures over grids; runs exactly as
    :class:`~ocannl.backends.interp.interpreter.InterpExecutable` does (same bindings, same
    buffers, same registers for the nests that run on the scalar path)."""

    def __init__(self, routine: RoutineIR):
        self.routine = routine
        self._compiler = ScalarCompiler(routine)
        self._body = _Vectorizer(self._compiler).top(routine.body)
        self._bound: dict[int, np.ndarray] = {}

    def _bind_buffer(self, node: TNode, slot: int, array: np.ndarray) -> None:
        """Rebind only a buffer the context replaced: the flat views, and the views of them the
        closures keep, stay valid while the array does."""
        if self._bound.get(slot) is not array:
            super()._bind_buffer(node, slot, array)
            self._bound[slot] = array


class _Unsupported(Exception):
    """A construct the vectorizer leaves to the scalar path (raised while compiling)."""


class _Fault(Exception):
    """Some element of a grid-wide operation would fail: rerun the nest on the scalar path."""


# ---------------------------------------------------------------------------------------------
# Grids


class _Grid:
    """The loops evaluated together, outermost first. A value over the grid is an array with one
    axis per grid loop, of the loop's extent or of size 1 (it does not vary along that loop)."""

    def __init__(self, loops: tuple[tuple[Symbol, int], ...] = ()):
        self.loops = loops
        self.axis = {s: k for k, (s, _) in enumerate(loops)}
        self.shape = tuple(n for _, n in loops)
        self.ndim = len(loops)

    def extended(self, symbol: Symbol, extent: int) -> _Grid:
        return _Grid(self.loops + ((symbol, extent),))

    def arange(self, symbol: Symbol) -> np.ndarray:
        """The values of ``symbol`` along its own axis."""
        k = self.axis[symbol]
        shape = [1] * self.ndim
        shape[k] = self.shape[k]
        return np.arange(self.shape[k], dtype=np.int64).reshape(shape)


def _within(value: Any, dim: int) -> Any:
    """``value`` (an int, or an int64 array over a grid) where it lies in ``[0, dim)``, else 0."""
    if isinstance(value, np.ndarray):
        return np.where((0 <= value) & (value < dim), value, 0)
    return value if 0 <= value < dim else 0


def _lift(value: Any, dtype: DType, ndim: int) -> Any:
    """A value computed over a grid of ``value``'s rank (a numpy scalar for the scalar path's
    locals) as a value over a grid with ``ndim`` axes, the outer ones first."""
    if dtype is dtypes.uint4x32:
        lanes = value if isinstance(value, tuple) else tuple(np.asarray(value[j]) for j in range(4))
        return tuple(_lift(lane, dtypes.uint32, ndim) for lane in lanes)
    array = np.asarray(value, dtype=dtype.storage)
    return array.reshape(array.shape + (1,) * (ndim - array.ndim))


# ---------------------------------------------------------------------------------------------
# Which loops form grids


def carries_no_dependence(loop: For) -> bool:
    """Whether ``loop``'s iterations are independent: for every node its body writes, all the
    body's accesses to that node index one common axis by the bare loop index (so two iterations
    never touch one cell), and the body sets only locals it declares."""
    it = Iter(loop.symbol)
    found = list(accesses(loop.body, fills=True))
    for node in {a.node for a in found if a.write}:
        common = set(range(len(node.dims)))
        for a in found:
            if a.node is node:
                common &= {k for k, idx in enumerate(a.indices) if idx == it}
        if not common:
            return False
    return not sets_outer_local(loop.body)


# ---------------------------------------------------------------------------------------------
# Sums in loop order


_STORED_AS_COMPUTED = (dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64, dtypes.uint32)
"""Types whose buffers hold the computed values themselves: a load is a view of the cells, and a
store then a reload gives back the value (no float16 rounding between a sum's terms)."""


def _stored_sum(stmt: For) -> tuple[list[For], Store, Expr] | None:
    """``for ...: node[idx] := node[idx] + term`` (or ``-``), where the loops that do not index
    ``idx`` (at least one) reduce and the others each index an axis of ``idx`` directly: the
    loops, the store and ``term``."""
    loops, inner = loop_chain(stmt)
    match inner:
        case Store(tnode=node, indices=idx, value=Binary(op=Binop.ADD | Binop.SUB, a=Load(tnode=n2, indices=idx2, oob_value=None),
                                                          b=term), skip_oob=False):
            pass
        case _:
            return None
    if n2 is not node or idx2 != idx or node.dtype not in _STORED_AS_COMPUTED:
        return None
    if node in nodes_read(term) or nodes_written(term):
        return None
    symbols = indices_symbols(idx)
    reducing = [f for f in loops if f.symbol not in symbols]
    if not reducing or any(Iter(f.symbol) not in idx for f in loops if f.symbol in symbols):
        return None
    return loops, inner, term


def _local_sum(scope: LocalScope) -> tuple[Expr | None, list[For], Binop, Expr] | None:
    """``v { v := init; for ...: v := v + term }`` (or ``-``; ``init`` may be left out: 0), with
    neither ``init`` nor ``term`` reading ``v``: ``init``, the loops, the operator and ``term``."""
    local, body, init = scope.local, scope.body, None
    if isinstance(body, Seq) and len(body.stmts) == 2 and isinstance(body.stmts[0], SetLocal):
        first, body = body.stmts
        if first.local is not local or local in locals_read(first.value) or nodes_written(first.value):
            return None
        init = first.value
    loops, inner = loop_chain(body)
    match inner:
        case SetLocal(local=l1, value=Binary(op=Binop.ADD | Binop.SUB as op, a=GetLocal(local=l2), b=term)):
            pass
        case _:
            return None
    if not loops or l1 is not local or l2 is not local or local.dtype not in _STORED_AS_COMPUTED:
        return None
    if local in locals_read(term) or nodes_written(term):
        return None
    return init, loops, op, term


_ACCUMULATE = {Binop.ADD: np.add, Binop.SUB: np.subtract}


def _summation(op: Binop, dtype: DType, reduced_axes: tuple[int, ...], cell_axes: tuple[int, ...],
               full: tuple[int, ...]) -> Callable[[Any, np.ndarray], np.ndarray]:
    """A function adding (``op``: or subtracting) terms to initial values in loop order, for
    every accumulator at once.

    Its ``terms`` are an array over a grid of extents ``full`` (of size 1 along axes where they
    do not vary); ``reduced_axes`` are the reduction loops in loop order, ``cell_axes`` the
    accumulators'. Few accumulators with many terms: one ``accumulate`` along a contiguous last
    axis (accumulate is the sequential left fold by definition). Many accumulators: one
    grid-wide operation per term, in order (numpy's accumulate along a leading axis runs column
    by column, far slower)."""
    reduced = tuple(full[a] for a in reduced_axes)
    shape = tuple(full[a] for a in cell_axes)
    n_terms, n_cells, storage, ufunc = math.prod(reduced), math.prod(shape), dtype.storage, _ACCUMULATE[op]
    if n_cells <= 8 * n_terms:
        order, stacked_shape, last = cell_axes + reduced_axes, shape + (1 + n_terms,), shape + (n_terms,)

        def accumulated(init: Any, terms: np.ndarray) -> np.ndarray:
            stacked = np.empty(stacked_shape, dtype=storage)
            stacked[..., 0] = init
            if len(reduced) == 1:
                stacked[..., 1:] = terms.transpose(order)
            else:
                block = np.empty(shape + reduced, dtype=storage)
                block[...] = terms.transpose(order)
                stacked[..., 1:] = block.reshape(last)
            return ufunc.accumulate(stacked, axis=-1)[..., -1]

        return accumulated
    order, block_shape, rows = reduced_axes + cell_axes, reduced + shape, (n_terms,) + shape

    def walked(init: Any, terms: np.ndarray) -> np.ndarray:
        block = np.empty(block_shape, dtype=storage)
        block[...] = terms.transpose(order)
        total = np.empty(shape, dtype=storage)
        total[...] = init
        for term in block.reshape(rows):
            ufunc(total, term, out=total)
        return total

    return walked


def _may_view_a_buffer(e: Expr) -> bool:
    """Whether ``e``'s value over a grid may be a view of a buffer (a load, or one passed
    through unchanged) rather than a fresh array."""
    while isinstance(e, Unary) and e.op is Unop.ID:
        e = e.x
    return isinstance(e, Load)


# ---------------------------------------------------------------------------------------------
# The compiler


class _Vectorizer:
    """Compiles statements over grids into closures sharing the scalar compiler's registers (loop
    indices walked in order, index symbols, locals) and buffers."""

    def __init__(self, scalar: ScalarCompiler):
        self.scalar = scalar
        self.regs = scalar.registers
        self.bufs = scalar.buffers
        self.extents: dict[Symbol, int] = {}
        """Every enclosing loop's extent (grid and walked loops), for bounds proofs."""
        self.local_rank: dict[Local, int] = {}
        """The rank of the grid each local declared here lives on (absent: the scalar path's)."""
        self.may_fault = False
        self.written: set[TNode] = set()

    # -- statements outside every grid ----------------------------------------------------------

    def top(self, s: Stmt) -> Thunk:
        """A statement outside every grid: loops become grids or are walked; single statements
        run on the scalar path, where one cell is cheapest."""
        match s:
            case Seq(stmts=stmts):
                return in_order(tuple(self.top(x) for x in stmts if not isinstance(x, Comment)))
            case For():
                return self.top_loop(s)
        return self.scalar.stmt(s)

    def top_loop(self, s: For) -> Thunk:
        if not (carries_no_dependence(s) or _stored_sum(s)):
            return self.walk_top(s)
        self.may_fault, self.written = False, set()
        try:
            vector = self.stmt(s, _Grid())
        except _Unsupported:
            return self.scalar_nest(s)
        if not self.may_fault:
            return vector
        scalar, bufs = self.scalar_nest(s), self.bufs
        slots = tuple(self.scalar.buffer(node) for node in self.written)

        def guarded() -> None:
            saved = [(k, bufs[k].copy()) for k in slots]
            try:
                vector()
            except (_Fault, ZeroDivisionError):  # the latter: an integer quotient's zero divisor
                for k, data in saved:
                    bufs[k][...] = data
                scalar()

        return guarded

    def scalar_nest(self, s: For) -> Thunk:
        """The scalar path's closure of a nest (inside the loops :meth:`walk_top` walks)."""
        return self.scalar.stmt(s)

    def walk_top(self, s: For) -> Thunk:
        """A loop outside every grid that carries a dependence: its iterations in order, its
        body's loops vectorized where they can be."""
        r, extent = self.scalar.register(s.symbol), s.extent
        self.extents[s.symbol] = extent
        try:
            with self.scalar.inside_loop(s.symbol, extent):
                body = self.top(s.body)
        finally:
            del self.extents[s.symbol]
        return counted_loop(self.regs, r, extent, body)

    # -- statements over a grid -----------------------------------------------------------------

    def stmt(self, s: Stmt, grid: _Grid) -> Thunk:
        regs, bufs = self.regs, self.bufs
        match s:
            case For():
                return self.loop(s, grid)
            case Seq(stmts=stmts):
                return in_order(tuple(self.stmt(x, grid) for x in stmts if not isinstance(x, Comment)))
            case Comment():
                return lambda: None
            case Store(tnode=node, indices=indices, value=value, skip_oob=skip):
                self.written.add(node)
                k, compute = self.scalar.buffer(node), self.expr(value, grid)
                to_storage = _vector_to_storage(node.dtype)
                window = self.window(node, indices, grid)
                if window is not None:
                    view = self.view(k, *window)

                    def store_window() -> None:
                        view()[...] = to_storage(compute())

                    return store_window
                where = self.offsets(node, indices, grid, checked_oob=skip, full=True)
                shape = grid.shape

                def run_store() -> None:
                    offsets, valid = where()
                    values = to_storage(compute())
                    if valid is None:
                        bufs[k][offsets] = values
                    else:
                        bufs[k][offsets[valid]] = np.broadcast_to(values, shape + np.shape(values)[len(shape):])[valid]

                return run_store
            case StoreDynamic(tnode=node, axis=axis, position=position, indices=indices, value=value):
                self.written.add(node)
                k, compute = self.scalar.buffer(node), self.expr(value, grid)
                where = self.offsets(node, indices, grid, dynamic=(axis, self.expr(position, grid)), full=True)
                to_storage = _vector_to_storage(node.dtype)

                def run_store_dynamic() -> None:
                    offsets, _ = where()
                    bufs[k][offsets] = to_storage(compute())

                return run_store_dynamic
            case DeclareLocal(local=local):
                r, zero = self.scalar.register(local), self.zero(local.dtype, grid)
                self.local_rank[local] = grid.ndim

                def run_declare() -> None:
                    regs[r] = zero

                return run_declare
            case SetLocal(local=local, value=value):
                r, compute = self.scalar.register(local), self.expr(value, grid)
                if _may_view_a_buffer(value):  # a later store must not change the local
                    compute = (lambda read: lambda: np.array(read()))(compute)

                def run_set_local() -> None:
                    regs[r] = compute()

                return run_set_local
        raise _Unsupported(f"{type(s).__name__} inside a grid")

    def loop(self, s: For, grid: _Grid) -> Thunk:
        """A loop over a grid: a sum evaluated at once, a new grid axis, or walked in order."""
        summed = _stored_sum(s)
        if summed is not None:
            sum_thunk = self.stored_sum(*summed, grid)
            if sum_thunk is not None:
                return sum_thunk
        self.extents[s.symbol] = s.extent
        try:
            if carries_no_dependence(s):
                return self.stmt(s.body, grid.extended(s.symbol, s.extent))
            r, extent, body = self.scalar.register(s.symbol), s.extent, self.stmt(s.body, grid)
        finally:
            del self.extents[s.symbol]
        return counted_loop(self.regs, r, extent, body)

    def stored_sum(self, loops: list[For], store: Store, term: Expr, grid: _Grid) -> Thunk | None:
        """``node[idx] := node[idx] + term`` over ``loops``: every term at once over the grid
        extended by all the loops, then added in loop order into each cell (``None`` when that
        would exceed :data:`ACCUMULATE_LIMIT`)."""
        node, idx = store.tnode, store.indices
        indexing = {i.symbol for i in idx if isinstance(i, Iter)}
        terms_grid, cells_grid = grid, grid
        for f in loops:
            terms_grid = terms_grid.extended(f.symbol, f.extent)
            if f.symbol in indexing:
                cells_grid = cells_grid.extended(f.symbol, f.extent)
        if math.prod(terms_grid.shape) + math.prod(cells_grid.shape) > ACCUMULATE_LIMIT:
            return None
        for f in loops:
            self.extents[f.symbol] = f.extent
        try:
            compute = self.expr(term, terms_grid)
            load = self.load(node, idx, None, cells_grid)
            k, window = self.scalar.buffer(node), self.window(node, idx, cells_grid)
            where = self.offsets(node, idx, cells_grid, full=True) if window is None else None
        finally:
            for f in loops:
                del self.extents[f.symbol]
        self.written.add(node)
        reduced = tuple(terms_grid.axis[f.symbol] for f in loops if f.symbol not in indexing)
        cells = tuple(a for a in range(terms_grid.ndim) if a not in reduced)
        bufs, add = self.bufs, _summation(store.value.op, node.dtype, reduced, cells, terms_grid.shape)

        if window is not None:
            view = self.view(k, *window)

            def run_stored_sum_window() -> None:
                total = add(load(), compute())
                view()[...] = total

            return run_stored_sum_window

        def run_stored_sum() -> None:
            total = add(load(), compute())
            offsets, _ = where()
            bufs[k][offsets] = total

        return run_stored_sum

    # -- expressions over a grid ----------------------------------------------------------------

    def zero(self, dtype: DType, grid: _Grid) -> Any:
        return _lift(scalars.zero(dtype), dtype, grid.ndim)

    def expr(self, e: Expr, grid: _Grid) -> Thunk:
        regs = self.regs
        match e:
            case Const(value=value, dtype=dtype):
                constant = _lift(scalars.constant(value, dtype), dtype, grid.ndim)
                return lambda: constant
            case Load(tnode=node, indices=indices, oob_value=oob):
                return self.load(node, indices, oob, grid)
            case LoadDynamic(tnode=node, axis=axis, position=position, indices=indices):
                where = self.offsets(node, indices, grid, dynamic=(axis, self.expr(position, grid)))
                return self.gather(node, where, None)
            case Unary(op=Unop.UNIFORM1, x=x):
                f, arg = _UNIFORM1[e.dtype], self.expr(x, grid)
                return lambda: f(arg())
            case Unary(op=Unop.UINT4X32_OF, x=x):
                arg = self.expr(x, grid)
                return lambda: _uint4x32_of(arg())
            case Unary(op=op, x=x):
                f, arg = array_unary(op, e.dtype), self.expr(x, grid)
                return lambda: f(arg())
            case Binary(op=Binop.THREEFRY4X32, a=a, b=b):
                key, counter = self.expr(a, grid), self.expr(b, grid)
                return lambda: _threefry4x32(key(), counter())
            case Binary(op=Binop.UINT4X32_PACK, a=a, b=b):
                lo, hi = self.expr(a, grid), self.expr(b, grid)
                return lambda: array_uint4x32_pack(lo(), hi())
            case Binary(op=Binop.UINT4X32_WORD, a=a, b=Const(value=lane)):
                x = self.expr(a, grid)
                return lambda: array_uint4x32_word(x(), lane)
            case Binary(op=op, a=a, b=b):
                if op in (Binop.DIV, Binop.MOD) and not e.dtype.is_float:
                    self.may_fault = True
                f, left, right = array_binary(op, e.dtype), self.expr(a, grid), self.expr(b, grid)
                return lambda: f(left(), right())
            case Ternary(op=Ternop.WHERE, a=a, b=b, c=c):
                if a.dtype is dtypes.uint4x32:
                    raise _Unsupported("a uint4x32 condition")
                cond, then, other = self.expr(a, grid), self.expr(b, grid), self.expr(c, grid)
                if e.dtype is dtypes.uint4x32:
                    return lambda: _where_lanes(cond() != 0, then(), other())
                return lambda: np.where(cond() != 0, then(), other())
            case Ternary(op=Ternop.FMA, a=a, b=b, c=c):
                f, x, y, z = array_fma(e.dtype), self.expr(a, grid), self.expr(b, grid), self.expr(c, grid)
                return lambda: f(x(), y(), z())
            case Ternary(op=Ternop.MUL3, a=a, b=b, c=c):
                x, y, z = self.expr(a, grid), self.expr(b, grid), self.expr(c, grid)
                return lambda: x() * y() * z()
            case Cast(x=x, dtype=dtype):
                if x.dtype.is_float and not dtype.is_float:
                    self.may_fault = True
                f, arg = _vector_cast(x.dtype, dtype), self.expr(x, grid)
                return lambda: f(arg())
            case EmbedIndex(index=index, dtype=dtype):
                value, storage, rank = self.index_value(index, grid), dtype.storage, (1,) * grid.ndim
                return lambda: (np.asarray(value(), dtype=np.int64) + np.zeros(rank, np.int64)).astype(storage)
            case GetLocal(local=local):
                r, rank, dtype = self.scalar.register(local), self.local_rank.get(local, 0), local.dtype
                if rank == grid.ndim:
                    return lambda: regs[r]
                return lambda: _lift(regs[r], dtype, grid.ndim)
            case LocalScope(local=local):
                return self.local_scope(e, grid)
        raise _Unsupported(f"{type(e).__name__} over a grid")

    def local_scope(self, e: LocalScope, grid: _Grid) -> Thunk:
        if nodes_written(e):
            # Loads evaluated before the scope may be views of what it stores into.
            raise _Unsupported("a local scope that stores into a buffer")
        local = e.local
        summed = _local_sum(e)
        if summed is not None:
            init_expr, loops, op, term = summed
            terms_grid = grid
            for f in loops:
                terms_grid = terms_grid.extended(f.symbol, f.extent)
            if math.prod(terms_grid.shape) + math.prod(grid.shape) <= ACCUMULATE_LIMIT:
                init = self.expr(init_expr, grid) if init_expr is not None else (lambda zero=scalars.zero(local.dtype): zero)
                for f in loops:
                    self.extents[f.symbol] = f.extent
                try:
                    compute = self.expr(term, terms_grid)
                finally:
                    for f in loops:
                        del self.extents[f.symbol]
                reduced, cells = tuple(range(grid.ndim, terms_grid.ndim)), tuple(range(grid.ndim))
                add = _summation(op, local.dtype, reduced, cells, terms_grid.shape)

                def run_sum() -> Any:
                    return add(init(), compute())

                return run_sum
        r, zero, regs = self.scalar.register(local), self.zero(local.dtype, grid), self.regs
        self.local_rank[local] = grid.ndim
        body = self.stmt(e.body, grid)

        def scope() -> Any:
            regs[r] = zero
            body()
            return regs[r]

        return scope

    # -- buffer accesses ------------------------------------------------------------------------

    def load(self, node: TNode, indices: tuple[AxisIndex, ...], oob: float | int | None, grid: _Grid) -> Thunk:
        if oob is not None and node.dtype is dtypes.uint4x32:
            raise _Unsupported("a padded uint4x32 load")
        bufs, k = self.bufs, self.scalar.buffer(node)
        if node.dtype in _STORED_AS_COMPUTED:  # a view of the buffer needs no conversion
            window = self.window(node, indices, grid)
            if window is not None:
                return self.view(k, *window)
            fixed = self.constant_offsets(node, indices, grid)
            if fixed is not None:
                return lambda: bufs[k].take(fixed)
        where = self.offsets(node, indices, grid, checked_oob=oob is not None)
        outside = None if oob is None else scalars.constant(oob, node.dtype.compute)
        return self.gather(node, where, outside)

    def gather(self, node: TNode, where: Callable[[], tuple[Any, Any]], outside: Any) -> Thunk:
        bufs, k, convert = self.bufs, self.scalar.buffer(node), _vector_from_storage(node.dtype)

        def gathered() -> Any:
            offsets, valid = where()
            values = convert(bufs[k].take(offsets, axis=0))
            if valid is not None:
                values = np.where(valid, values, outside)
            return values

        return gathered

    def index_value(self, idx: AxisIndex, grid: _Grid) -> Callable[[], Any]:
        """An axis index over the grid: a Python int, or an int64 array."""
        base, grid_part, registers = self.affine(idx, grid, 1)
        regs = self.regs
        if grid_part is None:
            if not registers:
                return lambda: base
            return lambda: base + sum(c * regs[r] for c, r in registers)
        if not registers:
            fixed = grid_part + base
            return lambda: fixed
        return lambda: grid_part + (base + sum(c * regs[r] for c, r in registers))

    def affine(self, idx: AxisIndex, grid: _Grid, scale: int) -> tuple[int, np.ndarray | None, list[tuple[int, int]]]:
        """``scale * idx`` split into a constant, an array over the grid (``None`` if it does not
        vary) and ``(coefficient, register)`` terms read at run time."""
        terms, offset = affine_form(idx)
        grid_part, registers = None, []
        for c, s in terms:
            if s in grid.axis:
                part = scale * c * grid.arange(s)
                grid_part = part if grid_part is None else grid_part + part
            else:
                registers.append((scale * c, self.scalar.register(s)))
        return scale * offset, grid_part, registers

    def offsets(
        self,
        node: TNode,
        indices: tuple[AxisIndex, ...],
        grid: _Grid,
        checked_oob: bool = False,
        dynamic: tuple[int, Thunk] | None = None,
        full: bool = False,
    ) -> Callable[[], tuple[np.ndarray, Any]]:
        """A closure giving the row-major offsets of an access over the grid (of the grid's full
        shape with ``full``, as stores need) and, for an access that may leave the buffer with a
        defined outcome (``checked_oob``: a load with an ``oob_value``, a store with
        ``skip_oob``), the mask of the elements inside (else ``None``). Any other access found
        outside raises :class:`_Fault`."""
        dims = node.dims
        if dynamic is None and cell_provably_within(indices, dims, self.extents):
            return self.linear_offsets(indices, dims, grid, full)
        self.may_fault |= not checked_oob
        axes = [self.index_value(i, grid) for i in indices]
        if dynamic is not None:
            position = dynamic[1]
            axes.insert(dynamic[0], lambda: np.asarray(position(), dtype=np.int64))
        strides = row_major_strides(dims)
        zeros = np.zeros(grid.shape if full else (1,) * grid.ndim, dtype=np.int64)

        def checked_offsets() -> tuple[np.ndarray, Any]:
            values = [a() for a in axes]
            valid: Any = True
            for v, d in zip(values, dims):
                valid = valid & (0 <= v) & (v < d)
            inside = np.all(valid)
            if not inside and not checked_oob:
                raise _Fault
            offsets: Any = zeros
            for v, d, stride in zip(values, dims, strides):
                # Offsets of values inside their axis only: a far index (a binding near 2**63)
                # times a stride would overflow int64.
                offsets = offsets + (v if inside else _within(v, d)) * stride
            if inside:
                return offsets, None
            return np.where(valid, offsets, 0), valid | (zeros != 0)

        return checked_offsets

    def linear_offsets(self, indices: tuple[AxisIndex, ...], dims: tuple[int, ...], grid: _Grid,
                       full: bool = False) -> Callable[[], tuple[np.ndarray, None]]:
        """Offsets proven in bounds: an array over the grid fixed at compile time, plus the
        registers' terms (walked loops, index symbols) added at run time."""
        base, registers = 0, []
        grid_part = np.zeros(grid.shape if full else (1,) * grid.ndim, dtype=np.int64)
        for idx, stride in zip(indices, row_major_strides(dims)):
            b, g, r = self.affine(idx, grid, stride)
            base += b
            if g is not None:
                grid_part = grid_part + g
            registers += r
        regs = self.regs
        if not registers:
            fixed = grid_part + base
            return lambda: (fixed, None)
        if len(registers) == 1:
            ((c0, r0),) = registers
            return lambda: (grid_part + (base + c0 * regs[r0]), None)
        return lambda: (grid_part + (base + sum(c * regs[r] for c, r in registers)), None)

    def view(self, k: int, cells: Callable[[], slice] | slice, shape: tuple[int, ...]) -> Callable[[], np.ndarray]:
        """A closure giving the view ``shape`` of the cells ``cells`` of buffer ``k``; a view at
        a fixed place is made again only when the run binds another array."""
        bufs = self.bufs
        if not isinstance(cells, slice):
            return lambda: bufs[k][cells()].reshape(shape)
        cache: list[Any] = [None, None]

        def fixed_view() -> np.ndarray:
            flat = bufs[k]
            if flat is not cache[0]:
                cache[0], cache[1] = flat, flat[cells].reshape(shape)
            return cache[1]

        return fixed_view

    def window(self, node: TNode, indices: tuple[AxisIndex, ...], grid: _Grid
               ) -> tuple[Callable[[], slice] | slice, tuple[int, ...]] | None:
        """An access proven in bounds whose cells, over the grid axes it varies along, are one
        contiguous run of the buffer in row-major order: that run's slice (a closure when its
        start reads registers) and the shape to view it as (1 along the axes it does not vary
        along, a trailing 4 for uint4x32). ``None`` for any other access."""
        dims = node.dims
        if not cell_provably_within(indices, dims, self.extents):
            return None
        coefficients, base, registers = [0] * grid.ndim, 0, []
        for idx, stride in zip(indices, row_major_strides(dims)):
            terms, offset = affine_form(idx)
            base += stride * offset
            for c, sym in terms:
                if sym in grid.axis:
                    coefficients[grid.axis[sym]] += stride * c
                else:
                    registers.append((stride * c, self.scalar.register(sym)))
        shape, expected = [], 1
        for c, n in reversed(list(zip(coefficients, grid.shape))):
            if n == 1 or c == 0:
                shape.append(1)
                continue
            if c != expected:
                return None
            shape.append(n)
            expected *= n
        view = tuple(reversed(shape)) + ((4,) if node.dtype is dtypes.uint4x32 else ())
        length, regs = expected, self.regs
        if not registers:
            return slice(base, base + length), view
        return (lambda: slice(start := base + sum(c * regs[r] for c, r in registers), start + length)), view

    def constant_offsets(self, node: TNode, indices: tuple[AxisIndex, ...], grid: _Grid) -> np.ndarray | None:
        """The offsets of an access proven in bounds that reads no register (else ``None``)."""
        if not cell_provably_within(indices, node.dims, self.extents):
            return None
        if any(s not in grid.axis for s in indices_symbols(indices)):
            return None
        return self.linear_offsets(indices, node.dims, grid)()[0]


# ---------------------------------------------------------------------------------------------
# Values over grids: storage conversions and casts (the operators' array forms are in
# ocannl/lowlevel/op_semantics.py).


def _vector_from_storage(dtype: DType) -> Callable[[np.ndarray], Any]:
    if dtype is dtypes.float16:
        return lambda v: v.astype(np.float32)
    if dtype is dtypes.bfloat16:
        return lambda v: (v.astype(np.uint32) << 16).view(np.float32)
    if dtype is dtypes.uint4x32:
        return lambda v: tuple(v[..., j] for j in range(4))
    return lambda v: v


def _vector_to_storage(dtype: DType) -> Callable[[Any], np.ndarray]:
    if dtype is dtypes.bfloat16:
        return dtypes.float32_to_bfloat16_bits
    if dtype is dtypes.uint4x32:
        return lambda lanes: np.stack(np.broadcast_arrays(*lanes), axis=-1)
    return lambda v: v


def _vector_cast(source: DType, target: DType) -> Callable[[Any], Any]:
    storage = target.storage
    if target.is_float:
        return lambda v: np.asarray(v).astype(storage)
    if source.is_float:
        scalar = np.frompyfunc(scalars.cast(source, target), 1, 1)

        def float_to_int(v: Any) -> Any:
            v = np.asarray(v)
            if not np.isfinite(v).all():
                raise _Fault
            if (np.abs(v) < 2.0**62).all():
                return np.trunc(v).astype(np.int64).astype(storage)
            return np.asarray(scalar(v.astype(object)), dtype=object).astype(storage)

        return float_to_int
    return lambda v: np.asarray(v).astype(storage)


def _where_lanes(cond: Any, then: tuple, other: tuple) -> tuple:
    return tuple(np.where(cond, x, y) for x, y in zip(then, other))


# -- the PRNG, lane-wise on uint32 arrays ---------------------------------------------------------


def _threefry4x32(key: tuple, counter: tuple) -> tuple:
    """Threefry-4x32-20 of every cell of the grid: the lanes (arrays that broadcast together)
    stacked into words and run through the array implementation of
    ocannl/lowlevel/prng_reference.py, the same standard function as the scalar interpreter's."""
    words = np.broadcast_arrays(*key, *counter)
    out = threefry4x32(np.stack(words[:4], axis=-1), np.stack(words[4:], axis=-1))
    return tuple(out[..., j] for j in range(4))


def _uniform1_float32(bits: tuple) -> np.ndarray:
    return (bits[0] >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)


def _uniform1_float64(bits: tuple) -> np.ndarray:
    wide = (bits[1].astype(np.uint64) << np.uint64(32)) | bits[0].astype(np.uint64)
    return (wide >> np.uint64(11)).astype(np.float64) * np.float64(2.0**-53)


_UNIFORM1 = {dtypes.float32: _uniform1_float32, dtypes.float64: _uniform1_float64}


def _uint4x32_of(value: Any) -> tuple:
    v = np.asarray(value).astype(np.int64).astype(np.uint64) if np.asarray(value).dtype.kind == "i" else (
        np.asarray(value).astype(np.uint64))
    low = (v & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    zeros = np.zeros_like(low)
    return low, (v >> np.uint64(32)).astype(np.uint32), zeros, zeros
