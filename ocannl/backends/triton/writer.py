"""Writing one ``@triton.jit`` kernel from its partition (:class:`~ocannl.backends.partition.Kernel`)
and its plan (plan.py): :class:`ExpressionWriter` prints what every kernel shares (loads, offsets,
masks, checks, the register cache, expressions), :class:`KernelWriter` the statements, stores and
loops, and one small writer per tiling holds what only it prints: flat.py (fills, flat tiles and
their inner ``RBLOCK`` stages and split reductions) and dot.py (``tl.dot`` tiles, split-K).
Operators are rendered by tile_expr.py.

**Values stay in registers.** Within a program, a value stored or loaded is remembered by node
and (canonical) index: a later read of the same cell in the same kernel uses the register, so a
matmul's epilogue and a softmax's stages never reload what the kernel computed. A read from
memory of a node an earlier statement of the kernel wrote (through another pattern, by the same
program: the partition rules guarantee no other program wrote it) is preceded by
``tl.debug_barrier()``, which makes the program's earlier stores visible to all its threads.

**Bounds.** Every access is proven in bounds from the loop extents and index symbol sizes, or
masked: lanes past a ragged edge by the tile masks, padded reads (``Load.oob_value``) and
skipping stores (``Store.skip_oob``) by per-axis tests. Any other access the bounds do not prove,
a data-dependent position (``oc.take``) or an index through a symbol without a size, is an error:
outside its axis, it raises the routine's error flag to the number of the check
(:meth:`ExpressionWriter.site`), which the runtime turns into
:class:`~ocannl.errors.OutOfBoundsError`, and is masked (reads give 0, stores are skipped), or,
for an index the same in every lane, clamped to 0 as the C backend does.
Scatter-adds use ``tl.atomic_add`` (rows may repeat). Offsets into a buffer of ``2**31`` cells
or more, and the flat index of a grid that large, are computed in int64 (:data:`WIDE`); smaller
ones stay int32, which is cheaper.

**Arithmetic** follows the scalar catalog (ocannl/lowlevel/scalar_ops.py), each operator written
by ``tile_expr.py``: float32 division and
square roots are the correctly rounded ``tl.div_rn``/``tl.sqrt_rn``; the launcher passes
``enable_fp_fusion=False`` so that no multiply-add is contracted (unless the ``fast_math``
setting is on); transcendental functions are Triton's (a few ulps from libm); float16 and
bfloat16 values load as float32 and round to nearest even on every store; uint4x32 values are
four uint32 lanes.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, replace
from typing import Any

from ocannl.errors import OcannlError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.analysis import accesses, index_range, loop_chain, nodes_written, range_within, row_major_strides
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.indexing import (
    Affine, AnySymbol, AxisIndex, Fixed, IndexSymbol, Iter, index_bounds, index_symbols,
)
from ocannl.lowlevel.ir import (
    Binary, Cast, Comment, Const, DeclareLocal, EmbedIndex, Expr, Fill, For, GetLocal, Load, LoadDynamic, Local,
    LocalScope, Namer, Seq, SetLocal, Stmt, Store, StoreDynamic, Ternary, Unary, format_expr, format_stmt,
    iter_exprs, iter_stmts, stmt_exprs,
)
from ocannl.lowlevel.identifiers import Namespace, comment_text
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop
from ocannl.lowlevel.tnode import TNode

from ocannl.backends.triton import tiling
from ocannl.backends.triton.plan import Plan, cells
from ocannl.backends.triton.stages import (
    Accumulation, accumulation, accumulator_dtype, canon_indices, overwritten_accumulation, reset_accumulation,
    sets_first,
)
from ocannl.backends.triton.tile_expr import (
    TileArithmetic, Val, from_storage, literal_code, paren, stored_literal, stored_value,
)
from ocannl.backends.partition import Kernel, Part, scatter_add_value

# ---------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True)
class Options:
    fp32_dot: str = "ieee"
    """``input_precision`` of float32 ``tl.dot``: ``ieee`` (exact products, the default),
    ``tf32`` or ``tf32x3`` (the ``triton_fp32_dot`` setting)."""
    fp_fusion: bool = False
    """Let Triton contract multiply-adds (the ``fast_math`` setting)."""
    symbols: tuple[IndexSymbol, ...] = ()
    """The routine's index symbols in the order of its symbol table: the int64 device buffer the
    runtime writes before a run, from which each kernel loads the symbols it reads (slot ``i``
    holds ``symbols[i]``). Symbols are not scalar arguments, so a launch's arguments are the same
    at every run: a recorded launch (a CUDA graph) replays with new bindings."""


# ---------------------------------------------------------------------------------------------
# What the runtime needs to know about a generated module


@dataclass(frozen=True)
class Param:
    """A kernel argument: a node's buffer, the routine's symbol table (``symbols``: int64 values
    of the index symbols, see :attr:`Options.symbols`), a scratch buffer, or the error flag."""

    name: str
    node: TNode | None = None
    symbols: bool = False
    scratch: tuple[tuple[str, str], int, str] | None = None
    """A buffer the runtime allocates for one kernel, zero-filled once: its key (the kernel's and
    the parameter's names: a tuple, so never a node's name), cells and Triton element type
    (a split reduction's partial results and per-tile counters; the kernel leaves the counters
    at zero after every run)."""

    @property
    def signature(self) -> str:
        """Triton's type string for this argument (``*fp32``, ``*i64``...)."""
        if self.node is not None:
            return "*" + _POINTER_TYPES[self.node.dtype.name]
        if self.scratch is not None:
            return "*" + self.scratch[2]
        return "*i64" if self.symbols else "*i32"

    @property
    def is_error_flag(self) -> bool:
        return self.node is None and not self.symbols and self.scratch is None


_POINTER_TYPES = {"float32": "fp32", "float64": "fp64", "float16": "fp16", "bfloat16": "u16", "int32": "i32",
                  "int64": "i64", "uint32": "u32", "uint4x32": "u32"}


@dataclass
class KernelSource:
    name: str
    params: list[Param]
    constexprs: dict[str, int]
    grid: int
    num_warps: int
    num_stages: int | None
    text: str
    tiling: str
    uses_dot: bool = False
    uses_atomics: bool = False


# ---------------------------------------------------------------------------------------------
# Values and regions


@dataclass
class Region:
    """Where statements are being emitted: the code and tile axes of each loop symbol, the
    bounds each symbol is known to lie in (lanes masked off aside), the canonical name of each
    symbol for the register cache, the lane mask of each tile axis, the tile axes of this
    region and the code of its full shape."""

    symbols: dict[AnySymbol, tuple[str, frozenset[str]]]
    bounds: dict[AnySymbol, tuple[int, int]]
    canon: dict[AnySymbol, Any]
    masks: dict[str, str]
    axes: frozenset[str]
    shape: str
    guards: tuple[str, ...] = ()
    """The conditions under which the value being written is used: those of the ``where``
    branches it is in (:meth:`ExpressionWriter.branch`)."""

    def child(self, **changes: Any) -> Region:
        r = replace(self, symbols=dict(self.symbols), bounds=dict(self.bounds), canon=dict(self.canon),
                    masks=dict(self.masks))
        for k, v in changes.items():
            setattr(r, k, v)
        return r


def decompose(index: str, extents: tuple[int, ...]) -> list[str]:
    """The code of each axis of a row-major flattened ``index`` over ``extents``. An extent of 0
    (a size-0 axis: no point at all, every lane masked) counts as 1, so that no code divides
    by zero."""
    extents = tuple(max(e, 1) for e in extents)
    out = []
    for t, e in enumerate(extents):
        stride = math.prod(extents[t + 1:])
        code = index if stride == 1 else f"{index} // {stride}"
        if t > 0:
            code = f"{code} % {e}" if stride != 1 else f"{index} % {e}"
        out.append(code)
    return out


class Names:
    """Identifiers of one kernel: parameters first, then generated names that avoid them."""

    def __init__(self, taken: set[str]):
        self.taken = set(taken)
        self._counters: dict[str, int] = {}

    def numbered(self, prefix: str) -> str:
        k = self._counters.get(prefix, 0)
        while f"{prefix}{k}" in self.taken:
            k += 1
        self._counters[prefix] = k + 1
        name = f"{prefix}{k}"
        self.taken.add(name)
        return name

    def word(self, word: str) -> str:
        name, k = word, 1
        while name in self.taken:
            name, k = f"{word}_{k}", k + 1
        self.taken.add(name)
        return name


# ---------------------------------------------------------------------------------------------
# One kernel


class ExpressionWriter:
    """The expression printing every kernel shares: output lines and temporaries, the register
    cache, indices, offsets, masks and checks, loads, and expressions (module docstring). The
    statements, and the tiles they are written in, are :class:`KernelWriter`'s and its
    subclasses': a local scope's statements go through their ``stmt`` and ``declare``."""

    def __init__(self, options: Options):
        self.options = options
        self.helpers: set[str] = set()
        self.arithmetic = TileArithmetic(self.temp, self.helpers)
        self.lines: list[str] = []
        self.depth = 1
        self.cache: list[dict[Any, Val]] = [{}]
        self.written: set[TNode] = set()
        """Nodes the kernel's earlier statements stored to memory."""
        self.reads_written = False
        self.locals: dict[Local, Val] = {}
        self.checks_positions = False
        self.sites: dict[int, str] = {}
        """What each error-flag value this kernel may set means (:meth:`site`)."""
        self.division_sites: set[int] = set()
        """The sites of :attr:`sites` that are integer divisions by zero (:meth:`divisor`)."""
        self.split_last: tuple[str, str] | None = None
        """After a split reduction: whether this program is its tile's last (scalar, and as a
        one-cell tile), which masks the epilogue's loads and stores."""
        self.node_names: dict[TNode, str] = {}
        self.symbol_names: dict[IndexSymbol, str] = {}
        """The kernel's local variable holding each index symbol (loaded from the table)."""
        self.names = Names(set())

    # -- output ----------------------------------------------------------------------------

    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def temp(self, code: str, prefix: str = "t") -> str:
        name = self.names.numbered(prefix)
        self.line(f"{name} = {code}")
        return name

    def to_storage(self, v: Val, dtype: DType) -> str:
        if v.literal:
            if dtype is dtypes.bfloat16:
                return str(stored_value(v.value, dtype))
            if dtype is dtypes.float16:
                return literal_code(stored_value(v.value, dtype), dtype)
            return v.code
        if dtype is dtypes.float16:
            return f"{self.arithmetic.atom(v)}.to(tl.float16)"
        if dtype is dtypes.bfloat16:
            self.helpers.add("bfloat16_bits")
            return f"bfloat16_bits({v.code})"
        return v.code

    # -- indices, offsets, masks -----------------------------------------------------------

    def index_code(self, idx: AxisIndex, region: Region) -> tuple[str, frozenset[str]]:
        match idx:
            case Fixed(index=i):
                return str(i), frozenset()
            case Iter(symbol=sym):
                return self.symbol_code(sym, region)
            case Affine(terms=terms, offset=off):
                parts, axes = [], frozenset()
                for c, sym in terms:
                    code, ax = self.symbol_code(sym, region)
                    axes |= ax
                    parts.append(code if c == 1 else f"{c} * {paren(code)}")
                text = " + ".join(parts)
                if off:
                    text += f" + {off}" if off > 0 else f" - {-off}"
                return text.replace("+ -", "- "), axes
        raise TypeError(f"not an axis index: {idx!r}")

    def symbol_code(self, sym: AnySymbol, region: Region) -> tuple[str, frozenset[str]]:
        if isinstance(sym, IndexSymbol):
            return self.symbol_names[sym], frozenset()
        return region.symbols[sym]

    def offset(self, node: TNode, indices: tuple[AxisIndex, ...], region: Region,
               dynamic: tuple[int, Val] | None = None, checked: bool = False) -> tuple[str, frozenset[str], list[str]]:
        """The row-major offset of an access (one coefficient per symbol, outer axes first), the
        tile axes it varies along, and the bounds tests it needs (those not proven). ``checked``:
        the access is an error outside the buffer (not a padded read nor a skipping store), so an
        index through a symbol without a size also sets the error flag past the axis; one the same
        in every lane is clamped instead of masked."""
        full: list[Any] = list(indices)
        if dynamic is not None:
            full.insert(dynamic[0], dynamic[1])
        strides = row_major_strides(node.dims)
        coefficients: dict[str, int] = {}
        constant = 0
        axes: frozenset[str] = frozenset()
        checks: list[str] = []
        for idx, dim, stride in zip(full, node.dims, strides):
            if isinstance(idx, Val):  # ``position`` has set the error flag for it
                code, ax = idx.code, idx.axes
                if not ax:  # the same in every lane: clamped (see ``checked_scalar_index``)
                    code = self.temp(f"tl.where(({code} >= 0) & ({code} < {dim}), {code}, 0)", "pos")
                else:
                    checks.append(f"({code} >= 0) & ({code} < {dim})")
                coefficients[code] = coefficients.get(code, 0) + stride
            elif isinstance(idx, Fixed):
                constant += idx.index * stride
                continue
            else:
                code, ax = self.index_code(idx, region)
                if not self.provable(idx, dim, region):
                    # Through a symbol without a size: the binding may pass the axis (an error).
                    unsized = checked and any(isinstance(x, IndexSymbol) and x.size is None for x in index_symbols(idx))
                    if unsized and not ax:
                        clamped = self.checked_scalar_index(code, dim, self.unsized_index_site(node, idx, dim))
                        coefficients[clamped] = coefficients.get(clamped, 0) + stride
                        continue
                    c = paren(code)
                    low = self.lower_bound(idx, region)
                    tests = ([f"({c} >= 0)"] if low is None or low < 0 else []) + [f"({c} < {dim})"]
                    checks.append(" & ".join(tests))
                    if unsized:
                        self.flag_outside(c, dim, ax, region, self.unsized_index_site(node, idx, dim))
                terms = ((1, idx.symbol),) if isinstance(idx, Iter) else idx.terms
                for c, sym in terms:
                    scode, _ = self.symbol_code(sym, region)
                    coefficients[scode] = coefficients.get(scode, 0) + c * stride
                if isinstance(idx, Affine):
                    constant += idx.offset * stride
            axes |= ax
        # A node with a size-0 axis has only zero strides, yet its accesses keep the shape of
        # their tile (a pointer as wide as its mask): ``x0 * 0`` terms stay.
        empty = 0 in node.dims
        if cells(node) >= WIDE:  # int32 products would overflow: every term in int64
            coefficients = {f"{paren(code)}.to(tl.int64)": c for code, c in coefficients.items()}
        parts = [_scaled(code, c) for code, c in coefficients.items() if c or empty]
        text = " + ".join(parts)
        if constant or not text:
            text = f"{text} + {constant}" if text else str(constant)
        return text.replace("+ -", "- "), axes, checks

    def site(self, message: str) -> int:
        """The number a failed check of ``message`` writes to the error flag: a digest of the
        message (so kernels number their checks alike without sharing a counter), at least 2.
        Checks raise it with ``tl.atomic_max``, so when several fail, the flag ends the same at
        every run; the runtime reads the message back from the module's sites."""
        number = zlib.crc32(message.encode()) % (2**31 - 3) + 2
        self.sites[number] = message
        return number

    def unsized_index_site(self, node: TNode, idx: AxisIndex, dim: int) -> int:
        names = ", ".join(sorted(s.name for s in index_symbols(idx) if isinstance(s, IndexSymbol) and s.size is None))
        return self.site(f"an index into {node.debug_name} (dims {node.dims}) through index symbol {names}, "
                         f"which has no size, is outside its axis of size {dim}")

    def checked_scalar_index(self, code: str, dim: int, site: int) -> str:
        """An index the same in every lane (static symbols, scalar loops) the bounds do not
        prove: outside ``[0, dim)`` it raises the error flag to ``site`` and reads or writes row
        0, like the C backend's checked index. A scalar mask would do, but Triton's interpreter
        cannot combine one with a lane mask."""
        name = self.temp(code, "idx")
        self.checks_positions = True
        self.line(f"tl.atomic_max(error, {site}, mask=({name} < 0) | ({name} >= {dim}))")
        return self.temp(f"tl.where(({name} >= 0) & ({name} < {dim}), {name}, 0)", "idx")

    def flag_outside(self, code: str, dim: int, axes: frozenset[str], region: Region, site: int) -> None:
        """Raise the error flag to ``site`` where lanes of an unproven index fall outside ``[0, dim)``."""
        self.checks_positions = True
        outside = f"({code} < 0) | ({code} >= {dim})"
        lanes = [region.masks[a] for a in sorted(axes) if a in region.masks]
        mask = " & ".join(lanes + [f"({outside})"])
        self.line(f"tl.atomic_max(error + {code} * 0, {site}, mask={mask})")

    def provable(self, idx: AxisIndex, dim: int, region: Region) -> bool:
        return range_within(index_range(idx, region.bounds), dim)

    def lower_bound(self, idx: AxisIndex, region: Region) -> int | None:
        def bounds(s: AnySymbol) -> tuple[int, int] | None:
            if isinstance(s, IndexSymbol):
                return (0, s.size - 1) if s.size is not None else (0, 2**31 - 1)
            return region.bounds.get(s)

        b = index_bounds(idx, bounds)
        return None if b is None else b[0]

    def mask(self, axes: frozenset[str], checks: list[str], region: Region) -> str | None:
        parts = [region.masks[a] for a in sorted(axes) if a in region.masks] + checks
        if self.split_last is not None:
            parts.append(self.split_last[1] if axes else self.split_last[0])
        return " & ".join(parts) if parts else None

    def canon_indices(self, indices: tuple[AxisIndex, ...], region: Region) -> tuple:
        """``indices`` comparable across the region's loops (stages.py, :func:`canon_indices`)."""
        return canon_indices(indices, region.canon)

    def position(self, e: Expr, node: TNode, axis: int, region: Region, what: str) -> Val:
        """A data-dependent position into ``axis`` of ``node`` (``what``: a gather or a
        scatter), checked: out of range raises the error flag to its site."""
        dim = node.dims[axis]
        site = self.site(f"a {what} position into {node.debug_name} (axis {axis} of dims {node.dims}) is outside "
                         f"its axis")
        v = self.expr(e, region)
        name = self.temp(v.code, "pos")
        self.checks_positions = True
        outside = f"({name} < 0) | ({name} >= {dim})"
        lanes = [region.masks[a] for a in sorted(v.axes) if a in region.masks]
        mask = " & ".join(lanes + [f"({outside})"]) if lanes else outside
        self.line(f"tl.atomic_max(error + {name} * 0, {site}, mask={mask})")
        return Val(name, v.axes, v.dtype)

    def branch(self, cond: Val, taken: str, e: Expr, region: Region) -> Val:
        """``e``, a branch of a ``where`` on ``cond``, taken where ``cond {taken} 0``. Triton
        computes both branches, where C and the interpreter compute the one taken: an integer
        division in ``e`` checks its divisor only in the lanes that take the branch, so that
        ``where(b != 0, div(a, b), 0)`` raises nothing (:attr:`Region.guards`)."""
        if not any(_integer_quotient(x) for x in iter_exprs(e)):
            return self.expr(e, region)
        return self.expr(e, region.child(guards=(*region.guards, f"({cond.code} {taken} 0)")))

    def divisor(self, op: Binop, e: Expr, v: Val, region: Region) -> Val:
        """The divisor ``v`` (computed from ``e``) of an integer ``div`` or ``mod``, checked:
        where a lane's is zero, it raises the error flag to its site (the runtime's
        :class:`~ocannl.errors.IntegerDivisionError`) and divides by 1 instead, as the C
        backend's helper does, since a GPU gives no defined quotient."""
        if v.literal:
            if v.value != 0:
                return v
            v = v.computed(self.arithmetic.tensor(v))
        site = self.site(f"integer {op.value} by zero (the divisor {format_expr(e, Namer())} is 0)")
        self.division_sites.add(site)
        name = self.arithmetic.atom(v)
        self.checks_positions = True
        lanes = [region.masks[a] for a in sorted(v.axes) if a in region.masks]
        failing = self.temp(" & ".join([*lanes, *region.guards, f"({name} == 0)"]), "zero_divisor")
        self.line(f"tl.atomic_max(error + {failing}.to(tl.int32) * 0, {site}, mask={failing})")
        one = self.arithmetic.tensor(Val.constant(1, v.dtype))  # of v's type: uint32 is no weak partner
        return Val(self.temp(f"tl.where({name} == 0, {one}, {name})", "divisor"), v.axes, v.dtype)

    # -- the register cache ------------------------------------------------------------------

    def push(self) -> None:
        self.cache.append({})

    def pop(self) -> None:
        self.cache.pop()

    def lookup(self, key: Any) -> Val | None:
        for scope in reversed(self.cache):
            if key in scope:
                return scope[key]
        return None

    def remember(self, key: Any, v: Val) -> None:
        self.cache[-1][key] = v

    def invalidate(self, node: TNode) -> None:
        for scope in self.cache:
            for key in [k for k in scope if k[0] is node]:
                del scope[key]

    # -- expressions ---------------------------------------------------------------------------

    def load(self, e: Load, region: Region) -> Val:
        key = (e.tnode, self.canon_indices(e.indices, region), e.oob_value)
        hit = self.lookup(key)
        if hit is not None:
            return hit
        if e.tnode in self.written:
            self.reads_written = True
        offset, axes, checks = self.offset(e.tnode, e.indices, region, checked=e.oob_value is None)
        mask = self.mask(axes, checks, region)
        ptr = self.node_names[e.tnode]
        node = e.tnode
        other = "" if mask is None else ", other=" + stored_literal(e.oob_value or 0, node.dtype)
        if node.dtype is dtypes.uint4x32:
            lanes = tuple(self.temp(f"tl.load({ptr} + ({offset}) * 4 + {lane}{', mask=' + mask if mask else ''})", "w")
                          for lane in range(4))
            v = Val("", axes, node.dtype, lanes=lanes)
        else:
            code = f"tl.load({_pointer(f'{ptr} + {offset}')}{', mask=' + mask if mask else ''}{other})"
            code += from_storage(node.dtype)
            v = Val(self.temp(code), axes, node.dtype.compute)
        self.remember(key, v)
        return v

    def load_code(self, e: Load, region: Region, convert: bool = True) -> str:
        offset, axes, checks = self.offset(e.tnode, e.indices, region, checked=e.oob_value is None)
        mask = self.mask(axes, checks, region)
        ptr = self.node_names[e.tnode]
        if e.tnode in self.written:
            self.reads_written = True
        other = "" if mask is None else ", other=" + stored_literal(e.oob_value or 0, e.tnode.dtype)
        code = f"tl.load({ptr} + {offset}{', mask=' + mask if mask else ''}{other})"
        return code + (from_storage(e.tnode.dtype) if convert else "")

    def expr(self, e: Expr, region: Region) -> Val:
        match e:
            case Const(value=tuple() as lanes):
                return Val("", frozenset(), dtypes.uint4x32,
                           lanes=tuple(f"tl.full([], {int(v)}, tl.uint32)" for v in lanes))
            case Const(value=value, dtype=dtype):
                return Val.constant(value, dtype)
            case Load():
                return self.load(e, region)
            case LoadDynamic():
                return self.load_dynamic(e, region)
            case Unary():
                return self.unary(e, region)
            case Binary():
                return self.binary(e, region)
            case Ternary():
                return self.ternary(e, region)
            case Cast(x=x, dtype=dtype):
                v = self.expr(x, region)
                return self.arithmetic.cast(v, dtype)
            case EmbedIndex(index=index, dtype=dtype):
                code, axes = self.index_code(index, region)
                if not axes and isinstance(index, Fixed):
                    return Val.constant(index.index, dtype, code=str(index.index))
                if not axes:  # sequential loops' counters are Python ints in Triton's interpreter
                    return Val(f"tl.cast({code}, {dtype.triton_name})", axes, dtype)
                return Val(f"{paren(code)}.to({dtype.triton_name})", axes, dtype)
            case GetLocal(local=local):
                return self.locals[local]
            case LocalScope(local=local, body=body):
                first = body.stmts[0] if isinstance(body, Seq) and body.stmts else body
                if not sets_first(first, local):
                    self.declare(local, region)
                self.stmt(body, region)
                return self.locals[local]
        raise TypeError(f"the Triton emitter does not know the expression {e!r}")

    def load_dynamic(self, e: LoadDynamic, region: Region) -> Val:
        """A gather: a load at a data-dependent position (checked: :meth:`position`)."""
        node, axis, p, indices = e.tnode, e.axis, e.position, e.indices
        key = (node, ("dynamic", axis, p, self.canon_indices(indices, region)))
        hit = self.lookup(key)
        if hit is not None:
            return hit
        pos = self.position(p, node, axis, region, "gather")
        offset, axes, checks = self.offset(node, indices, region, dynamic=(axis, pos), checked=True)
        mask = self.mask(axes, checks, region)
        if node in self.written:
            self.reads_written = True
        guard = "" if mask is None else f", mask={mask}, other=0"  # no mask: the position is clamped
        code = f"tl.load({self.node_names[node]} + {offset}{guard}){from_storage(node.dtype)}"
        v = Val(self.temp(code), axes, node.dtype.compute)
        self.remember(key, v)
        return v

    def unary(self, e: Unary, region: Region) -> Val:
        match e:
            case Unary(op=Unop.UNIFORM1, x=x, to=to):
                w = self.expr(x, region)
                self.helpers.add(f"uniform1_{to.name}")
                args = w.lanes[0] if to is dtypes.float32 else f"{w.lanes[0]}, {w.lanes[1]}"
                return Val(f"uniform1_{to.name}({args})", w.axes, to)
            case Unary(op=Unop.UINT4X32_OF, x=x):
                v = self.expr(x, region)
                self.helpers.add("uint4x32_of")
                lanes = tuple(self.names.numbered("w") for _ in range(4))
                self.line(f"{', '.join(lanes)} = uint4x32_of({self.arithmetic.tensor(v)})")
                return Val("", v.axes, dtypes.uint4x32, lanes=lanes)
            case Unary(op=op, x=x):
                v = self.expr(x, region)
                if v.literal and op in (Unop.NEG, Unop.ID):
                    return v if op is Unop.ID else self.arithmetic.negate(v)
                return Val(self.arithmetic.unary(op, v), v.axes, v.dtype)
        raise TypeError(f"the Triton emitter does not know the expression {e!r}")

    def binary(self, e: Binary, region: Region) -> Val:
        match e:
            case Binary(op=Binop.THREEFRY4X32, a=a, b=b):
                key, counter = self.expr(a, region), self.expr(b, region)
                self.helpers.add("threefry4x32")
                lanes = tuple(self.names.numbered("w") for _ in range(4))
                self.line(f"{', '.join(lanes)} = threefry4x32({', '.join(key.lanes + counter.lanes)})")
                return Val("", key.axes | counter.axes, dtypes.uint4x32, lanes=lanes)
            case Binary(op=Binop.UINT4X32_PACK, a=a, b=b):
                lo, hi = self.expr(a, region), self.expr(b, region)
                self.helpers.add("uint4x32_pack")
                lanes = tuple(self.names.numbered("w") for _ in range(4))
                halves = ", ".join(self.arithmetic.tensor(v) for v in (lo, hi))
                self.line(f"{', '.join(lanes)} = uint4x32_pack({halves})")
                return Val("", lo.axes | hi.axes, dtypes.uint4x32, lanes=lanes)
            case Binary(op=Binop.UINT4X32_WORD, a=a, b=Const(value=lane)):
                x = self.expr(a, region)
                return Val(x.lanes[lane], x.axes, dtypes.uint32)
            case Binary(op=op, a=a, b=b):
                x, y = self.expr(a, region), self.expr(b, region)
                if _integer_quotient(e):
                    y = self.divisor(op, b, y, region)
                return Val(self.arithmetic.binary(op, x, y, e.dtype), x.axes | y.axes, e.dtype)
        raise TypeError(f"the Triton emitter does not know the expression {e!r}")

    def ternary(self, e: Ternary, region: Region) -> Val:
        match e:
            case Ternary(op=Ternop.WHERE, a=a, b=b, c=c):
                cond = self.expr(a, region)
                if any(_integer_quotient(x) for branch in (b, c) for x in iter_exprs(branch)):
                    cond = cond if cond.literal else cond.computed(self.arithmetic.atom(cond))
                then, other = self.branch(cond, "!=", b, region), self.branch(cond, "==", c, region)
                axes = cond.axes | then.axes | other.axes
                if e.dtype is dtypes.uint4x32:
                    ca = self.arithmetic.atom(cond) if not cond.literal else cond.code
                    lanes = tuple(self.temp(f"tl.where({ca} != 0, {p}, {q})", "w")
                                  for p, q in zip(then.lanes, other.lanes))
                    return Val("", axes, e.dtype, lanes=lanes)
                return Val(self.arithmetic.where(cond, then, other), axes, e.dtype)
            case Ternary(op=Ternop.FMA, a=a, b=b, c=c):
                x, y, z = (self.expr(v, region) for v in (a, b, c))
                return Val(self.arithmetic.fma(x, y, z, e.dtype), x.axes | y.axes | z.axes, e.dtype)
            case Ternary(op=Ternop.MUL3, a=a, b=b, c=c):
                x, y, z = (self.expr(v, region) for v in (a, b, c))
                xy = Val(self.arithmetic.arith(x, y, "*"), x.axes | y.axes, e.dtype)
                return Val(self.arithmetic.arith(xy, z, "*"), xy.axes | z.axes, e.dtype)
        raise TypeError(f"the Triton emitter does not know the expression {e!r}")


class KernelWriter(ExpressionWriter):
    """Writes one kernel's statements into the tiles its subclass sets up (module docstring):
    :class:`~ocannl.backends.triton.flat.FillKernelWriter`,
    :class:`~ocannl.backends.triton.flat.FlatKernelWriter` and
    :class:`~ocannl.backends.triton.dot.DotKernelWriter`, one a tiling, each holding only what
    it prints."""

    uses_dot = False
    native_bf16_dot = False
    """Whether the kernel reads the module's ``NATIVE_BF16_DOT`` switch."""

    def __init__(self, name: str, kernel: Kernel, plan: Plan, options: Options, segment: bool = False):
        super().__init__(options)
        self.kernel = kernel
        self.segment = segment
        """Written as a device function of a grouped launch (emit.py): its program number is its
        first parameter, ``program``, instead of ``tl.program_id(0)``."""
        self.plan = plan
        self.constexprs: dict[str, int] = {}
        self.uses_atomics = False
        self.scatter: frozenset[TNode] = frozenset()
        self.split_pid: str | None = None
        """With a split reduction (split-K, or a flat kernel's :attr:`FlatPlan.split`): the
        program's slice of it; ``tile_pid`` the tile whose slices it shares."""
        self.tile_pid: str | None = None
        self.stored = False
        """Whether the kernel has written a store yet (a flat kernel splits a reduction that
        comes first)."""
        self._params(name)

    # -- parameters and names --------------------------------------------------------------

    def _params(self, name: str) -> None:
        nodes: dict[TNode, None] = {}
        symbols: dict[IndexSymbol, None] = {}
        dynamic = False
        for part in self.kernel.parts:
            for s in iter_stmts(part.stmt):
                if isinstance(s, (Store, StoreDynamic, Fill)):
                    nodes.setdefault(s.tnode, None)
                dynamic |= isinstance(s, StoreDynamic)
                for e in stmt_exprs(s):
                    for x in iter_exprs(e):
                        if isinstance(x, (Load, LoadDynamic)):
                            nodes.setdefault(x.tnode, None)
                            dynamic |= isinstance(x, LoadDynamic)
                        dynamic |= _integer_quotient(x)  # its divisor is checked (``divisor``)
                        idx = ()
                        if isinstance(x, (Load, LoadDynamic)):
                            idx = x.indices
                        elif isinstance(x, EmbedIndex):
                            idx = (x.index,)
                        for i in idx:
                            for sym in index_symbols(i):
                                if isinstance(sym, IndexSymbol):
                                    symbols.setdefault(sym, None)
                                    # An access through it may be checked (``offset``).
                                    dynamic |= sym.size is None and not isinstance(x, EmbedIndex)
                if isinstance(s, (Store, StoreDynamic)):
                    for i in s.indices:
                        for sym in index_symbols(i):
                            if isinstance(sym, IndexSymbol):
                                symbols.setdefault(sym, None)
                                dynamic |= sym.size is None
        written = set().union(*(nodes_written(p.stmt) for p in self.kernel.parts))
        first = next(iter(sorted(written, key=lambda n: list(nodes).index(n))), None)
        self.name = name + (f"_{first.name}" if first is not None else "")
        # The module's own names (tl, the tlib helpers, XBLOCK, error...) are reserved, so no
        # node or symbol takes them; the scope separates nodes of one name (two sessions) and
        # symbols whose names sanitize alike, or like a node's.
        scope = Namespace({"program"} if self.segment else ())
        self.params: list[Param] = []
        for node in nodes:
            pname = scope.claim(node.name, f"n{node.id}")
            self.node_names[node] = pname
            self.params.append(Param(pname, node=node))
        for sym in symbols:
            self.symbol_names[sym] = scope.claim(sym.identifier, "sym")
        if symbols:
            self.params.append(Param(scope.claim("symbol_table", "symbol_table"), symbols=True))
        if dynamic:
            self.params.append(Param("error"))
        self.names = Names({*scope.taken, "error"})

    def program_id(self, points: int) -> str:
        """The program's number, in int64 when the grid's ``points`` reach :data:`WIDE`."""
        number = "program" if self.segment else "tl.program_id(0)"
        return f"{number}.to(tl.int64)" if points >= WIDE else number

    # -- output ----------------------------------------------------------------------------

    def emit(self) -> KernelSource:
        k, plan = self.kernel, self.plan
        self.tiles()
        body = self.symbol_loads() + self.body()
        sig = ", ".join(["program"] * self.segment + [p.name for p in self.params]
                        + [f"{c}: tl.constexpr" for c in self.constexprs])
        header = ["@triton.jit"]
        header.append(f"def {self.name}({sig}):")
        doc = self.docstring()
        header.append(f'    """{doc[0]}')
        header += [f"    {d}" if d else "" for d in doc[1:]]
        header.append('    """')
        text = "\n".join(header + body) + "\n"
        return KernelSource(self.name, self.params, dict(self.constexprs), plan.grid, plan.num_warps, plan.num_stages,
                            text, k.tiling, self.uses_dot, self.uses_atomics)

    def body(self) -> list[str]:
        """The kernel's lines after its symbol loads."""
        return self.lines

    def symbol_loads(self) -> list[str]:
        """The kernel's first lines: each index symbol it reads, loaded from the symbol table. A
        symbol with a size (at most ``2**31``) is narrowed to int32, since the runtime checked its
        binding; one without a size stays int64, so that a binding past 32 bits fails the
        kernel's bounds check instead of wrapping onto a row."""
        table = next((p.name for p in self.params if p.symbols), None)
        lines = []
        for sym, name in self.symbol_names.items():
            if sym not in self.options.symbols:
                raise OcannlError(f"kernel {self.name} reads index symbol {sym.name}, which is not in its "
                                  f"routine's symbol table {[s.name for s in self.options.symbols]}")
            load = f"tl.load({table} + {self.options.symbols.index(sym)})"
            narrow = sym.size is not None and sym.size <= 2**31
            lines.append(f"    {name} = {load}{'.to(tl.int32)' if narrow else ''}")
        return lines

    def docstring(self) -> list[str]:
        k = self.kernel
        out = []
        if k.tiling == "fill":
            out.append(f"Fills {', '.join(f.tnode.name for f in k.fills)}.")
        else:
            dims = "grid " + " x ".join(map(str, k.extents)) if k.extents else "one program"
            what = f"{'Tiled tl.dot' if k.tiling == 'dot' else 'Flat'} kernel over {dims}"
            out.append(what + (": " + "; ".join(k.comments) if k.comments else "."))
        out.append("")
        namer = Namer()
        for p in k.parts:
            text = format_stmt(p.stmt, namer)
            grid = ", ".join(namer.symbol(s) for s in p.grid)
            out.append(f"{'grid ' + grid + ': ' if grid else ''}{_shorten(text)}")
        return [comment_text(line) for line in out]

    # -- the kernel's tiles: one writer class per tiling --------------------------------------

    def tiles(self) -> None:
        """The program's tile indices and masks, then every statement of the kernel."""
        raise TypeError(f"{type(self).__name__} writes no tiling")  # the base is never instantiated

    def kernel_axis_tiles(self, t: int) -> set[str]:
        """The tile axes grid axis ``t`` of the kernel varies along."""
        return {"x"}

    def is_contraction(self, s: For) -> bool:
        """Whether ``s`` is the contraction a dot kernel writes with ``tl.dot``."""
        return False

    def fill(self, f: Fill, index: str, block: str) -> None:
        node, n = f.tnode, cells(f.tnode)
        ptr = self.node_names[node]
        self.stored = True
        mask = f"{index} < {n}"
        if node.dtype is dtypes.uint4x32:
            for lane, v in enumerate(f.value.value):
                self.line(f"tl.store({ptr} + {index} * 4 + {lane}, {v}, mask={mask})")
        else:
            value = literal_code(stored_value(f.value.value, node.dtype), node.dtype)
            self.line(f"tl.store({ptr} + {index}, {value}, mask={mask})")
        self.invalidate(node)
        self.written.add(node)

    def parts(self, region: Region) -> None:
        """Every statement of the kernel in order, each through :meth:`part`; a reset the
        reduction in the next statement starts from stays in a register (:meth:`absorbs_reset`)."""
        parts = self.kernel.parts
        regions = [self.part_region(p, region) for p in parts]
        for n, (part, r) in enumerate(zip(parts, regions)):
            following = (parts[n + 1].body, regions[n + 1]) if n + 1 < len(parts) else None
            if following is not None and self.absorbs_reset(part.body, r, *following):
                continue
            self.part(part, r, following)

    def part_region(self, part: Part, region: Region) -> Region:
        """``region`` with the part's grid loops bound to the kernel's axes."""
        r = region.child()
        for t, sym in enumerate(part.grid):
            r.symbols[sym] = (self.axis_codes[t], frozenset(self.kernel_axis_tiles(t)))
            r.bounds[sym] = (0, self.kernel.extents[t] - 1)
            r.canon[sym] = ("grid", t)
        return r

    def part(self, part: Part, r: Region, following: tuple[Stmt, Region] | None = None) -> None:
        """Emit one statement of the kernel in its region (:meth:`part_region`)."""
        start = len(self.lines)
        self.reads_written = False
        self.scatter = part.scatter
        self.statement(part.body, r, following)
        if self.reads_written:
            barrier = "tl.debug_barrier()  # makes this program's earlier stores visible to its threads"
            self.lines.insert(start, "    " * self.depth + barrier)
        self.written |= {a.node for a in accesses(part.stmt) if a.write}

    def statement(self, s: Stmt, region: Region, following: tuple[Stmt, Region] | None) -> None:
        """``s``, whose successor in its sequence (or the kernel) is ``following``: a reduction
        whose cell the successor overwrites keeps its result in a register (the successor reads
        it from there) instead of storing it first."""
        self.stmt(s, region, self.overwritten(s, region, *following) if following is not None else None)

    def absorbs_reset(self, s: Stmt, region: Region, following: Stmt, following_region: Region) -> bool:
        """When ``s`` is a reset of the cell the reduction ``following`` accumulates into: its
        value goes to the register cache, where the reduction's accumulator starts from, and the
        reset itself never goes to memory."""
        if not (isinstance(s, Store) and isinstance(following, For)
                and self.resets(s, region, following, following_region)):
            return False
        self.remember((s.tnode, self.canon_indices(s.indices, region), None), self.expr(s.value, region))
        return True

    def overwritten(self, s: Stmt, region: Region, following: Stmt, following_region: Region) -> tuple | None:
        """The cell (node and canonical indices) the reduction ``s`` accumulates into when the
        statement ``following`` stores that same cell, on the same lanes, right after."""
        if self.is_contraction(s):
            return None
        target = overwritten_accumulation(s, following, self.locals)
        if target is None:
            return None
        cell = (target.tnode, self.canon_indices(target.indices, region))
        return cell if cell == (following.tnode, self.canon_indices(following.indices, following_region)) else None

    # -- statements ----------------------------------------------------------------------------

    def stmt(self, s: Stmt, region: Region, deferred: tuple | None = None) -> None:
        """``s`` in ``region``; a loop accumulating into the cell ``deferred`` leaves its result
        in a register (:meth:`statement`)."""
        match s:
            case Seq(stmts=stmts):
                for k, x in enumerate(stmts):
                    following = stmts[k + 1] if k + 1 < len(stmts) else None
                    if isinstance(x, DeclareLocal) and following is not None and sets_first(following, x.local):
                        continue  # declared by the assignment that follows
                    if following is not None and self.absorbs_reset(x, region, following, region):
                        continue
                    self.statement(x, region, (following, region) if following is not None else None)
            case Comment(text=text):
                self.line(f"# {comment_text(text)}")
            case DeclareLocal(local=local):
                self.declare(local, region)
            case SetLocal(local=local, value=value):
                self.set_local(local, self.expr(value, region), region)
            case Store(tnode=node, indices=indices, value=value, skip_oob=skip):
                self.store_value(node, indices, self.expr(value, region), region, skip)
            case StoreDynamic():
                self.store_dynamic(s, region)
            case Fill():
                self.fill_in_program(s)
            case For():
                self.loop(s, region, deferred)
            case _:
                raise TypeError(f"the Triton emitter does not know the statement {s!r}")

    def declare(self, local: Local, region: Region, zero: bool = True) -> None:
        """A variable of the region's full shape for ``local`` (zero, unless its first
        assignment follows)."""
        if local.dtype is dtypes.uint4x32:
            lanes = tuple(self.names.numbered("v") for _ in range(4))
            for name in lanes if zero else ():
                self.line(f"{name} = tl.zeros({region.shape}, tl.uint32)")
            self.locals[local] = Val("", region.axes, local.dtype, lanes=lanes)
        else:
            name = self.names.numbered("v")
            if zero:
                self.line(f"{name} = tl.zeros({region.shape}, {local.dtype.triton_name})")
            self.locals[local] = Val(name, region.axes, local.dtype)

    def set_local(self, local: Local, value: Val, region: Region) -> None:
        if local not in self.locals:
            self.declare(local, region, zero=False)
        target = self.locals[local]
        shape_region = region.child(axes=target.axes, shape=self.shape_of(target.axes, region))
        if target.lanes is not None:
            for name, lane in zip(target.lanes, value.lanes):
                self.line(f"{name} = {self.broadcast(Val(lane, value.axes, dtypes.uint32), shape_region)}")
        else:
            self.line(f"{target.code} = {self.broadcast(value, shape_region)}")

    def shape_of(self, axes: frozenset[str], region: Region) -> str:
        if axes == region.axes:
            return region.shape
        return self.shape_for_axes(axes)

    def shape_for_axes(self, axes: frozenset[str]) -> str:
        """The code of the shape of a tile along ``axes`` (each tiling's writer knows its own)."""
        if not axes:
            return "[]"
        raise AssertionError(axes)

    def broadcast(self, v: Val, region: Region) -> str:
        """``v`` as a tensor of the region's full shape and ``v``'s type."""
        if v.literal:
            return f"tl.full({region.shape}, {v.code}, {v.dtype.triton_name})"
        if v.axes == region.axes:
            return v.code
        return f"tl.broadcast_to({v.code}, {region.shape})"

    # -- loops -----------------------------------------------------------------------------

    def loop(self, s: For, region: Region, deferred: tuple | None = None) -> None:
        """A loop nest: an accumulation into one cell or local (:meth:`reduction`), an inner tile
        of the tiling (:meth:`stage`), or else a sequential loop."""
        chain, body = loop_chain(s)
        found = self.accumulation(chain, body)
        if found is not None:
            self.reduction(chain, *found, region, deferred)
        elif not self.stage(s, chain, body, region):
            self.serial(s, region)

    def reduction(self, chain: list[For], op: Binop, target: Store | SetLocal, value: Expr, region: Region,
                  deferred: tuple | None) -> None:
        """The loops of ``chain`` accumulating ``value`` into ``target`` with ``op``: in order
        (:meth:`sequential_reduction`) unless the tiling tiles them."""
        self.sequential_reduction(chain, op, target, value, region, deferred)

    def stage(self, s: For, chain: list[For], body: Stmt, region: Region) -> bool:
        """Whether the tiling wrote the loop nest ``s`` as an inner tile (none here)."""
        return False

    def resets(self, store: Store, region: Region, loop: For, loop_region: Region) -> bool:
        """Whether ``loop`` (in ``loop_region``) accumulates into the cell ``store`` (in
        ``region``) writes, from a register."""
        if self.is_contraction(loop):
            if store.skip_oob or not store.tnode.dtype.is_compute_type or store.tnode.dtype is dtypes.uint4x32:
                return False
            target = self.kernel.contraction.update
        else:
            target = reset_accumulation(store, loop, self.locals)
        return isinstance(target, Store) and target.tnode is store.tnode and (
            self.canon_indices(target.indices, loop_region) == self.canon_indices(store.indices, region))

    def accumulation(self, chain: list[For], body: Stmt) -> Accumulation | None:
        """The accumulation the loops of ``chain`` around ``body`` are (stages.py,
        :func:`accumulation`), into a cell or a local this kernel has declared."""
        return accumulation(chain, body, self.locals)

    def accumulator(self, target: Store | SetLocal, region: Region) -> str:
        """A variable holding the accumulated cell or local, of the region's full shape."""
        if isinstance(target, Store):
            acc = self.names.word("acc")
            self.line(f"{acc} = {self.broadcast(self.load(Load(target.tnode, target.indices), region), region)}")
            return acc
        return self.locals[target.local].code

    def finish_accumulation(self, target: Store | SetLocal, acc: str, region: Region, deferred: tuple | None) -> None:
        """Store the accumulated cell, unless it is ``deferred``, the cell the next statement
        overwrites (:meth:`statement`): then the result only goes to the register cache."""
        if isinstance(target, Store) and deferred == (target.tnode, self.canon_indices(target.indices, region)):
            self.invalidate(target.tnode)
            self.remember((target.tnode, self.canon_indices(target.indices, region), None),
                          Val(acc, region.axes, target.tnode.dtype.compute))
        elif isinstance(target, Store):
            self.store_value(target.tnode, target.indices, Val(acc, region.axes, target.tnode.dtype.compute),
                             region, False)

    def sequential_reduction(self, chain: list[For], op: Binop, target: Store | SetLocal, value: Expr,
                             region: Region, deferred: tuple | None = None) -> None:
        """The loops run in order inside the program, the accumulator in registers: the
        interpreter's order and roundings (a half-precision cell rounds at every step, as its
        store would)."""
        acc = self.accumulator(target, region)
        inner = region.child()
        opened = []
        for loop in chain:
            name = self.names.numbered("s")
            self.line(f"for {name} in range({loop.extent}):")
            self.depth += 1
            self.push()
            opened.append(name)
            inner.symbols[loop.symbol] = (name, frozenset())
            inner.bounds[loop.symbol] = (0, loop.extent - 1)
            inner.canon[loop.symbol] = ("serial", loop.symbol)
        v = self.expr(value, inner)
        dtype = accumulator_dtype(target)
        a = Val(acc, region.axes, dtype.compute)
        old_first = isinstance(target, Store) and target.value.a == Load(target.tnode, target.indices) or (
            isinstance(target, SetLocal) and target.value.a == GetLocal(target.local))
        x, y = (a, v) if old_first else (v, a)
        code = self.arithmetic.binary(op, x, y, dtype.compute)
        if dtype is dtypes.float16:
            code = f"{paren(code)}.to(tl.float16).to(tl.float32)"
        elif dtype is dtypes.bfloat16:  # not .to(tl.bfloat16): the interpreter's conversion truncates
            self.helpers.add("bfloat16_round")
            code = f"bfloat16_round({code})"
        self.line(f"{acc} = {code}")
        for _ in opened:
            self.pop()
            self.depth -= 1
        self.finish_accumulation(target, acc, region, deferred)

    def serial(self, s: For, region: Region) -> None:
        name = self.names.numbered("s")
        written = nodes_written(s)
        for node in written:
            self.invalidate(node)
        self.line(f"for {name} in range({s.extent}):")
        self.depth += 1
        self.push()
        inner = region.child()
        inner.symbols[s.symbol] = (name, frozenset())
        inner.bounds[s.symbol] = (0, s.extent - 1)
        inner.canon[s.symbol] = ("serial", s.symbol)
        self.stmt(s.body, inner)
        self.pop()
        self.depth -= 1
        for node in written:
            self.invalidate(node)

    def combine_slices(self, acc: str, combine: Binop, dtype: DType, cell: str | None, tile_cells: int,
                       tiles: int) -> None:
        """The second stage of a split reduction (split-K, or a flat kernel's split reduction),
        in the kernel: each program stores its slice's partial result ``acc`` (a tile of
        ``tile_cells`` cells at ``cell``, or a scalar when ``cell`` is ``None``); the tile's last
        program to finish (a counter per tile) combines the partial results with ``combine`` in
        a fixed order, whichever program that is, so the result is the same at every run, with no
        float atomics. The tiling's writer combines them (``combine_partials``): a contraction's
        partial tiles are added one after the other, in slice order; a flat kernel's partial
        results (one or a few cells a slice, up to a few hundred slices) are loaded as one tile
        and combined by a tree (``tl.sum``...), whose shape alone fixes its order. The other
        programs go on with the loads and stores of what follows masked off (:meth:`mask`). On a
        GPU the barriers and the counter's acquire-release atomic order the partial results'
        stores before their loads (that ordering only matters, and is
        only exercised, on a GPU: the interpreter runs programs one after another)."""
        split = self.plan.grid // tiles
        partials, counts = self.names.word("partials"), self.names.word("slices_done")
        element = _POINTER_TYPES[dtype.name]
        self.params.append(Param(partials, scratch=((self.name, partials), tiles * split * tile_cells, element)))
        self.params.append(Param(counts, scratch=((self.name, counts), tiles, "i32")))
        tile, pk = self.tile_pid, self.split_pid
        at = "" if cell is None else f" + {self.temp(cell, 'cell')}"
        base = self.temp(f"{partials} + {tile} * {split * tile_cells}", "slices")
        self.line(f'tl.store({base} + {pk} * {tile_cells}{at}, {acc}, cache_modifier=".cg")')
        self.line("tl.debug_barrier()")
        done = self.temp(f'tl.atomic_add({counts} + {tile}, 1, sem="acq_rel")', "done")
        last = self.temp(f"{done} == {split - 1}", "last")
        last_tile = self.temp(f"(tl.zeros({self.one_cell_shape()}, tl.int32) + {done}) == {split - 1}", "last")
        self.line("tl.debug_barrier()")
        self.line(f"if {last}:  # the tile's last program combines the slices")
        self.depth += 1
        self.combine_partials(acc, combine, dtype, base, at, split, tile_cells)
        self.line(f"tl.store({counts} + {tile}, 0)  # ready for the next run")
        self.depth -= 1
        self.split_last = (last, last_tile)

    def one_cell_shape(self) -> str:
        """The shape of a one-cell tile of the kernel's tiles' rank."""
        return "[1, 1]" if self.kernel.extents else "[1]"

    def apply(self, op: Binop, acc: Val, combined: Val) -> str:
        """The code of ``acc`` updated by the combined terms of an accumulation with ``op``."""
        if op in (Binop.MAX, Binop.MIN):
            return f"{'tl.maximum' if op is Binop.MAX else 'tl.minimum'}({acc.code}, {combined.code})"
        if op is Binop.DIV:
            return self.arithmetic.divide(acc, combined)
        return f"{acc.code} {_APPLY[op]} {combined.code}"

    # -- stores ------------------------------------------------------------------------------

    def store_value(self, node: TNode, indices: tuple[AxisIndex, ...], value: Val, region: Region,
                    skip_oob: bool) -> None:
        offset, axes, checks = self.offset(node, indices, region, checked=not skip_oob)
        mask = self.mask(axes, checks, region)
        ptr = self.node_names[node]
        self.stored = True
        if node.dtype is dtypes.uint4x32:
            for lane, code in enumerate(value.lanes):
                self.line(_store(f"{ptr} + ({offset}) * 4 + {lane}", code, mask))
        else:
            if not value.literal:  # loads of this cell read the name (see the register cache)
                value = replace(value, code=self.arithmetic.atom(value))
            code = self.to_storage(value, node.dtype)
            if value.axes - axes:
                offset = f"{offset} + tl.zeros({self.shape_for_axes(value.axes | axes)}, tl.int32)"
            self.line(_store(f"{ptr} + {offset}", code, mask))
        self.invalidate(node)
        if node.dtype.is_compute_type and not checks:
            self.remember((node, self.canon_indices(indices, region), None), value)

    def store_dynamic(self, s: StoreDynamic, region: Region) -> None:
        node = s.tnode
        self.stored = True
        pos = self.position(s.position, node, s.axis, region, "scatter")
        offset, axes, checks = self.offset(node, s.indices, region, dynamic=(s.axis, pos), checked=True)
        mask = self.mask(axes, checks, region)
        ptr = self.node_names[node]
        added = scatter_add_value(s) if node in self.scatter else None
        if added is not None:
            v = self.expr(added, region)
            code = self.to_storage(v, node.dtype)
            if v.literal:
                code = f"tl.full({self.shape_for_axes(axes)}, {v.code}, {node.dtype.triton_name})"
            self.line(f"tl.atomic_add({ptr} + {offset}, {code}{', mask=' + mask if mask else ''})")
            self.uses_atomics = True
        else:
            v = self.expr(s.value, region)
            if node.dtype is dtypes.uint4x32:
                for lane, code in enumerate(v.lanes):
                    self.line(_store(f"{ptr} + ({offset}) * 4 + {lane}", code, mask))
            else:
                self.line(_store(f"{ptr} + {offset}", self.to_storage(v, node.dtype), mask))
        self.invalidate(node)

    def fill_in_program(self, f: Fill) -> None:
        """A fill among the statements of a single-program kernel: a loop over chunks."""
        n = cells(f.tnode)
        chunk = min(1024, tiling.next_power_of_2(n))
        name = self.names.numbered("f")
        self.line(f"for {name} in range(0, {n}, {chunk}):")
        self.depth += 1
        index = self.temp(f"{name} + tl.arange(0, {chunk})", "findex")
        self.fill(f, index, str(chunk))
        self.depth -= 1


# ---------------------------------------------------------------------------------------------
# Helpers

_APPLY = {Binop.ADD: "+", Binop.SUB: "-", Binop.MUL: "*"}
"""Infix operators applying a tile's combined terms to the accumulator."""


def _integer_quotient(e: Expr) -> bool:
    """Whether ``e`` is an integer ``div`` or ``mod``, whose divisor the kernel checks."""
    return isinstance(e, Binary) and e.op in (Binop.DIV, Binop.MOD) and not e.dtype.is_float


WIDE = 2**31
"""Offsets into a buffer of this many cells or more, and flattened indices over this many grid
points, overflow int32, Triton's default index type: they are computed in int64."""


def _store(pointer: str, value: str, mask: str | None) -> str:
    return f"tl.store({_pointer(pointer)}, {value}{', mask=' + mask if mask else ''})"


def _pointer(code: str) -> str:
    """``p + 0`` as ``p``."""
    return code[:-4] if code.endswith(" + 0") else code


def _scaled(code: str, c: int) -> str:
    return code if c == 1 else f"{paren(code)} * {c}"


def _shorten(text: str, width: int = 92) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
