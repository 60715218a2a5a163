"""Writing one ``@triton.jit`` kernel from its partition (:class:`~ocannl.backends.partition.Kernel`)
and its plan (plan.py): a base writer for statements, loads, stores and registers, and one small
writer per tiling (fills, flat tiles, ``tl.dot`` tiles). Operators are rendered by tile_expr.py.

**Tiles.** A *flat* kernel flattens its grid axes into one index ``xindex`` (``XBLOCK`` points a
program, masked by ``xmask`` at the ragged end) and recovers each axis by ``//`` and ``%``
(``x0``, ``x1``, ...). What remains of each statement after its grid loops is emitted by
:meth:`KernelWriter.stmt`:

* a chain of inner loops over which the body is pointwise (every store indexes each of them) is
  a *stage*: its points are flattened into ``rindex`` (``RBLOCK`` a chunk, looped over unless
  one chunk holds them all) and computed as ``[XBLOCK, RBLOCK]`` tiles;
* a chain of loops accumulating one cell or a local (``c[I] := c[I] op v``) is a reduction
  stage when its operator may be regrouped (``schedule.regrouping``): the terms of each
  ``rindex`` tile are combined by ``tl.sum``, ``tl.max``, ``tl.min`` or ``tlib.product`` and the
  result applied to the cell's value with ``op`` (a subtraction subtracts the sum of its terms,
  a float division divides by their product). A long one the plan splits (``FlatPlan.split``:
  few rows, many terms) combines one slice of its terms per program, and the tile's last
  program combines the slices (:meth:`KernelWriter.combine_slices`), applies them to the cell and
  alone runs the rest of the kernel. Integer divisions, float sums of fewer than
  :data:`SHORT_SUM` terms and half-precision accumulators, which round on every store, take the
  sequential path below instead;
* any other loop runs sequentially inside the program (``for s0 in range(n)``).

A *dot* kernel tiles a contraction's rows and columns (``rm``, ``rn``), loops over the reduction
in ``BLOCK_K`` steps with ``tl.dot`` (``input_precision="ieee"`` for float32 unless the
``triton_fp32_dot`` setting says ``tf32``/``tf32x3``), and runs the kernel's other statements
(its epilogue) on the ``[BLOCK_M, BLOCK_N]`` accumulator tile. With split-K (tiling.py), each
program sums one slice of the reduction and the last program of each tile adds the slices in
order before the epilogue (:meth:`KernelWriter.combine_slices`).

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
(:meth:`KernelWriter.site`), which the runtime turns into
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
from ocannl.lowlevel.analysis import accesses, index_range, loop_chain, range_within, row_major_strides
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.indexing import (
    Affine, AnySymbol, AxisIndex, Fixed, IndexSymbol, Iter, Symbol, index_bounds, index_symbols,
)
from ocannl.lowlevel.ir import (
    Binary, Cast, Comment, Const, DeclareLocal, EmbedIndex, Expr, Fill, For, GetLocal, Load, LoadDynamic, Local,
    LocalScope, Namer, Seq, SetLocal, Stmt, Store, StoreDynamic, Ternary, Unary, format_expr, format_stmt,
    iter_exprs, iter_stmts, stmt_exprs,
)
from ocannl.lowlevel.identifiers import Namespace, comment_text
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop
from ocannl.lowlevel.schedule import regrouping, update_of
from ocannl.lowlevel.tnode import TNode

from ocannl.backends.triton import tiling
from ocannl.backends.triton.plan import DotPlan, FillPlan, FlatPlan, Plan, cells
from ocannl.backends.triton.tile_expr import (
    NAME_PATTERN, TileArithmetic, Val, from_storage, literal_code, paren, stored_literal, stored_value,
)
from ocannl.backends.partition import (
    Contraction,
    Kernel,
    Part,
    scatter_add_value,
    scatter_add_nodes,
    signature_ok,
)

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


class KernelWriter:
    """Emits one kernel (module docstring)."""

    def __init__(self, name: str, kernel: Kernel, plan: Plan, options: Options, segment: bool = False):
        self.kernel = kernel
        self.segment = segment
        """Written as a device function of a grouped launch (emit.py): its program number is its
        first parameter, ``program``, instead of ``tl.program_id(0)``."""
        self.plan = plan
        self.used_stages = False
        self.options = options
        self.helpers: set[str] = set()
        self.arithmetic = TileArithmetic(self.temp, self.helpers)
        self.lines: list[str] = []
        self.depth = 1
        self.constexprs: dict[str, int] = {}
        self.cache: list[dict[Any, Val]] = [{}]
        self.written: set[TNode] = set()
        """Nodes the kernel's earlier statements stored to memory."""
        self.reads_written = False
        self.stage_vars: dict[Any, Any] = {}
        self.locals: dict[Local, Val] = {}
        self.uses_dot = False
        self.uses_atomics = False
        self.native_bf16_dot = False
        """Whether the kernel reads the module's ``NATIVE_BF16_DOT`` switch."""
        self.checks_positions = False
        self.sites: dict[int, str] = {}
        """What each error-flag value this kernel may set means (:meth:`site`)."""
        self.division_sites: set[int] = set()
        """The sites of :attr:`sites` that are integer divisions by zero (:meth:`divisor`)."""
        self.branch_guards: list[str] = []
        """The conditions under which the value being written is used: those of the ``where``
        branches it is in (:meth:`branch`)."""
        self.rblock: int | None = plan.rblock if isinstance(plan, FlatPlan) else None
        self.two_d = self.rblock is not None
        """Whether tiles are ``[XBLOCK, RBLOCK]`` (a flat kernel with inner tiles)."""
        self.top = 0
        self.scatter: frozenset[TNode] = frozenset()
        self.persistent_rindex: str | None = None
        self.dot_site: For | None = kernel.contraction.site if isinstance(plan, DotPlan) else None
        self.deferred: tuple | None = None
        """The cell the loop about to be written accumulates into when the next statement
        overwrites it (:meth:`statement`; :meth:`loop` takes it)."""
        self.split_pid: str | None = None
        """With a split reduction (split-K, or a flat kernel's :attr:`FlatPlan.split`): the
        program's slice of it; ``tile_pid`` the tile whose slices it shares."""
        self.tile_pid: str | None = None
        self.split_last: tuple[str, str] | None = None
        """After a split reduction: whether this program is its tile's last (scalar, and as a
        one-cell tile), which masks the epilogue's loads and stores."""
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
        written = {s.tnode for p in self.kernel.parts for s in iter_stmts(p.stmt) if isinstance(s, (Store, StoreDynamic, Fill))}
        first = next(iter(sorted(written, key=lambda n: list(nodes).index(n))), None)
        self.name = name + (f"_{first.name}" if first is not None else "")
        # The module's own names (tl, the tlib helpers, XBLOCK, error...) are reserved, so no
        # node or symbol takes them; the scope separates nodes of one name (two sessions) and
        # symbols whose names sanitize alike, or like a node's.
        scope = Namespace({"program"} if self.segment else ())
        self.params: list[Param] = []
        self.node_names: dict[TNode, str] = {}
        for node in nodes:
            pname = scope.claim(node.name, f"n{node.id}")
            self.node_names[node] = pname
            self.params.append(Param(pname, node=node))
        self.symbol_names: dict[IndexSymbol, str] = {}
        """The kernel's local variable holding each index symbol (loaded from the table)."""
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

    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def temp(self, code: str, prefix: str = "t") -> str:
        name = self.names.numbered(prefix)
        self.line(f"{name} = {code}")
        return name

    def emit(self) -> KernelSource:
        k, plan = self.kernel, self.plan
        body_start = len(self.lines)
        self.tiles()
        body = self.symbol_loads() + self.lines[body_start:]
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
        start, top = len(self.lines), self.top
        self.reads_written = False
        self.scatter = part.scatter
        self.statement(part.body, r, following)
        if self.reads_written:
            barrier = "tl.debug_barrier()  # makes this program's earlier stores visible to its threads"
            self.lines.insert(start + self.top - top, "    " * self.depth + barrier)
        self.written |= {a.node for a in accesses(part.stmt) if a.write}

    def statement(self, s: Stmt, region: Region, following: tuple[Stmt, Region] | None) -> None:
        """``s``, whose successor in its sequence (or the kernel) is ``following``: a reduction
        whose cell the successor overwrites keeps its result in a register (the successor reads
        it from there) instead of storing it first."""
        self.deferred = self.overwritten(s, region, *following) if following is not None else None
        try:
            self.stmt(s, region)  # ``loop`` takes ``deferred`` before it writes any statement
        finally:
            self.deferred = None

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
        if not (isinstance(s, For) and isinstance(following, Store)) or following.skip_oob:
            return None
        dtype = following.tnode.dtype
        if not dtype.is_compute_type or dtype is dtypes.uint4x32:
            return None  # a half-precision cell rounds on its store: the register would not
        if self.dot_site is not None and s == self.dot_site:
            return None
        found = self.accumulation(*loop_chain(s))
        if found is None or not isinstance(found[1], Store):
            return None
        cell = (found[1].tnode, self.canon_indices(found[1].indices, region))
        return cell if cell == (following.tnode, self.canon_indices(following.indices, following_region)) else None

    # -- statements ----------------------------------------------------------------------------

    def stmt(self, s: Stmt, region: Region) -> None:
        match s:
            case Seq(stmts=stmts):
                for k, x in enumerate(stmts):
                    following = stmts[k + 1] if k + 1 < len(stmts) else None
                    if isinstance(x, DeclareLocal) and following is not None and _sets_first(following, x.local):
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
                self.loop(s, region)
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
        if target.lanes is not None:
            for name, lane in zip(target.lanes, value.lanes):
                self.line(f"{name} = {self.broadcast(Val(lane, value.axes, dtypes.uint32), region.child(axes=target.axes, shape=self.shape_of(target.axes, region)))}")
        else:
            shape_region = region.child(axes=target.axes, shape=self.shape_of(target.axes, region))
            self.line(f"{target.code} = {self.broadcast(value, shape_region)}")

    def shape_of(self, axes: frozenset[str], region: Region) -> str:
        if axes == region.axes:
            return region.shape
        return self.shape_for_axes(axes)

    def shape_for_axes(self, axes: frozenset[str]) -> str:
        if not axes:
            return "[]"
        if axes == {"m", "n"}:
            return "[BLOCK_M, BLOCK_N]"
        if axes == {"x"}:
            return "[XBLOCK, 1]" if self.two_d else "[XBLOCK]"
        if axes == {"x", "r"}:
            return "[XBLOCK, RBLOCK]"
        if axes == {"r"}:
            return "[1, RBLOCK]" if self.kernel.extents else "[RBLOCK]"
        raise AssertionError(axes)

    def broadcast(self, v: Val, region: Region) -> str:
        """``v`` as a tensor of the region's full shape and ``v``'s type."""
        if v.literal:
            return f"tl.full({region.shape}, {v.code}, {v.dtype.triton_name})"
        if v.axes == region.axes:
            return v.code
        return f"tl.broadcast_to({v.code}, {region.shape})"

    # -- loops -----------------------------------------------------------------------------

    def loop(self, s: For, region: Region) -> None:
        deferred, self.deferred = self.deferred, None
        if self.dot_site is not None and s == self.dot_site:
            self.dot_loop(s, region)
            return
        chain, body = loop_chain(s)
        found = self.accumulation(chain, body)
        if found is not None:
            op, target, value = found
            total = math.prod(tuple(loop.extent for loop in chain))
            dtype = _accumulator_type(target)
            tiled = (self.kernel.tiling == "flat" and "r" not in region.axes and self.rblock is not None
                     and regrouping(op, dtype) is not None and dtype in _EXACT_ACCUMULATORS
                     and (op in (Binop.MAX, Binop.MIN) or total >= SHORT_SUM))
            if tiled:
                self.reduction_stage(chain, op, target, value, region, deferred)
            else:
                self.sequential_reduction(chain, op, target, value, region, deferred)
            return
        if self.kernel.tiling == "flat" and "r" not in region.axes and self.rblock is not None:
            if self.pointwise_stage(s, chain, body, region):
                return
        self.serial(s, region)

    def resets(self, store: Store, region: Region, loop: For, loop_region: Region) -> bool:
        """Whether ``loop`` (in ``loop_region``) accumulates into the cell ``store`` (in
        ``region``) writes, from a register."""
        if store.skip_oob or not store.tnode.dtype.is_compute_type or store.tnode.dtype is dtypes.uint4x32:
            return False
        if self.dot_site is not None and loop == self.dot_site:
            target = self.kernel.contraction.accumulator
        else:
            found = self.accumulation(*loop_chain(loop))
            if found is None:
                return False
            target = found[1]
        return isinstance(target, Store) and target.tnode is store.tnode and (
            self.canon_indices(target.indices, loop_region) == self.canon_indices(store.indices, region))

    def accumulation(self, chain: list[For], body: Stmt) -> tuple[Binop, Store | SetLocal, Expr] | None:
        """``(op, statement, v)`` when the loops of ``chain`` accumulate ``v`` into one cell or
        local with ``op`` (the cell's indices and ``v``'s reads independent of the loop order)."""
        found = _accumulation(body)
        if found is None:
            return None
        op, target, value = found
        syms = {loop.symbol for loop in chain}
        if isinstance(target, Store):
            if target.skip_oob or any(s in syms for i in target.indices for s in index_symbols(i)):
                return None
        elif target.local not in self.locals or target.local.dtype is dtypes.uint4x32:
            return None
        if any(isinstance(x, (Store, StoreDynamic, Fill)) for x in iter_stmts(SetLocal(Local(value.dtype), value))):
            return None
        return found

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
        dtype = _accumulator_type(target)
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
        written = {a.node for a in accesses(s) if a.write} | {f.tnode for f in iter_stmts(s) if isinstance(f, Fill)}
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

    def stage_index(self, extents: tuple[int, ...], region: Region,
                    piece: tuple[str, int] | None = None) -> tuple[Region, bool, list[str]]:
        """Enter an inner tile over ``extents``: returns its region and whether a loop over
        chunks was opened (the caller closes it with :meth:`end_stage`). ``piece``, ``(start,
        length)``: only the ``length`` points from ``start`` (code) on, a split reduction's slice
        (``length`` a multiple of ``RBLOCK``)."""
        total = math.prod(extents)
        persistent = total <= self.rblock and piece is None
        self.used_stages = True
        expand = "[None, :]" if self.kernel.extents else ""
        key = ("stage", extents)
        if persistent:
            if self.persistent_rindex is None:
                self.persistent_rindex = self.names.word("rindex")
                self.line_at_top(f"{self.persistent_rindex} = tl.arange(0, RBLOCK){expand}")
            rindex = self.persistent_rindex
            if key in self.stage_vars:
                mask, codes = self.stage_vars[key]
            else:
                mask = None
                if total != self.rblock:
                    mask = self.names.numbered("rmask")
                    self.line_at_top(f"{mask} = {rindex} < {total}")
                codes = []
                for d in decompose(rindex, extents):
                    if len(extents) == 1:
                        codes.append(d)
                    else:
                        n = self.names.numbered("r")
                        self.line_at_top(f"{n} = {d}")
                        codes.append(n)
                self.stage_vars[key] = (mask, codes)
        else:
            roffset = self.names.numbered("roffset")
            self.line(f"for {roffset} in range(0, {total if piece is None else piece[1]}, RBLOCK):")
            self.depth += 1
            self.push()
            start = "" if piece is None else f"{piece[0]} + "
            rindex = self.temp(f"{start}{roffset} + tl.arange(0, RBLOCK){expand}", "rindex")
            ragged = total % (self.rblock if piece is None else piece[1])
            mask = self.temp(f"{rindex} < {total}", "rmask") if ragged else None
            codes = [d if len(extents) == 1 else self.temp(d, "r") for d in decompose(rindex, extents)]
        axes = region.axes | {"r"}
        inner = region.child(axes=axes, shape=self.shape_for_axes(axes))
        if mask is not None:
            inner.masks["r"] = mask
        return inner, not persistent, codes

    def line_at_top(self, text: str) -> None:
        """Tile indices shared by persistent stages are defined once, before any statement."""
        self.lines.insert(self.top, "    " + text)
        self.top += 1

    def end_stage(self, looped: bool) -> None:
        if looped:
            self.pop()
            self.depth -= 1

    def pointwise_stage(self, s: For, chain: list[For], body: Stmt, region: Region) -> bool:
        if _has_loop(body) or _sets_undeclared_local(body):
            return False  # a nested loop nest, or a reduction into an enclosing local
        syms = tuple(loop.symbol for loop in chain)
        scatter = scatter_add_nodes(s)
        if not any(a.write for a in accesses(s)):
            return False
        if not signature_ok([(s, syms, scatter)], len(syms)):
            return False
        extents = tuple(loop.extent for loop in chain)
        inner, looped, codes = self.stage_index(extents, region)
        for t, (loop, code) in enumerate(zip(chain, codes)):
            inner.symbols[loop.symbol] = (code, frozenset({"r"}))
            inner.bounds[loop.symbol] = (0, loop.extent - 1)
            inner.canon[loop.symbol] = ("inner", extents, t) if not looped else ("chunk", loop.symbol)
        self.stmt(body, inner)
        self.end_stage(looped)
        return True

    def reduction_stage(self, chain: list[For], op: Binop, target: Store | SetLocal, value: Expr,
                        region: Region, deferred: tuple | None = None) -> None:
        """The loops' points as ``rindex`` tiles, each tile's terms combined by the operator of
        ``op``'s :class:`~ocannl.lowlevel.schedule.Regrouping` (``tl.sum``, ``tl.max``,
        ``tl.min``, ``tlib.product``) and applied to the accumulator with ``op`` (a sum's or a
        product's order differs from the loop's)."""
        combine = regrouping(op, _accumulator_type(target)).combine
        acc = self.accumulator(target, region)
        extents = tuple(loop.extent for loop in chain)
        dtype = value.dtype
        neutral = _NEUTRAL[combine](dtype)
        piece, chunk_op = None, op  # how each chunk's combined terms update ``acc``
        if self.splits(math.prod(extents)):
            # This program combines one slice's terms, from the operator's neutral value; the
            # tile's last program combines the slices and applies the result to the cell once.
            initial, chunk_op = acc, combine
            acc = self.names.word("partial")
            self.line(f"{acc} = tl.full({region.shape}, {literal_code(neutral, dtype)}, {dtype.triton_name})")
            plan = self.plan
            piece = (self.temp(f"{self.split_pid} * {plan.slice_terms}", "r_start"), plan.slice_terms)
        length = math.prod(extents) if piece is None else piece[1]
        compensated = combine is Binop.ADD and value.dtype.is_float and length > self.rblock
        if compensated:  # the chunk sums are added with Kahan's compensation (see below)
            carry = self.names.word("carry")
            self.line(f"{carry} = tl.zeros_like({acc})")
        inner, looped, codes = self.stage_index(extents, region, piece)
        for t, (loop, code) in enumerate(zip(chain, codes)):
            inner.symbols[loop.symbol] = (code, frozenset({"r"}))
            inner.bounds[loop.symbol] = (0, loop.extent - 1)
            inner.canon[loop.symbol] = ("inner", extents, t) if not looped else ("chunk", loop.symbol)
        v = self.expr(value, inner)
        tile = self.arithmetic.tensor(v)
        if "r" in inner.masks:  # lanes past the ragged end add nothing
            tile = f"tl.where({inner.masks['r']}, {tile}, {literal_code(neutral, dtype)})"
        elif "r" not in v.axes:
            tile = f"tl.broadcast_to({tile}, {inner.shape})"
        axis = "axis=1, keep_dims=True" if region.axes else "axis=0"
        if combine is Binop.MUL:
            self.helpers.add("product")
        fn = {Binop.ADD: "tl.sum", Binop.MUL: "product", Binop.MAX: "tl.max", Binop.MIN: "tl.min"}[combine]
        reduced = f"{fn}({tile}, {axis})"
        if compensated:
            # Each chunk is a tl.sum tree; adding the chunk sums one after the other would lose
            # their low bits once the total is large (1.5e-5 relative on 2^20 equal float32
            # terms). Kahan's compensation carries the rounding error of each addition into the
            # next, so the sum stays as accurate as one tree; the carry is dropped once the total
            # is not finite, where it would turn an infinity into a NaN. A subtraction adds the
            # negated chunk sums (negation is exact).
            y, total = self.names.numbered("y"), self.names.numbered("t")
            self.line(f"{y} = {'-' if chunk_op is Binop.SUB else ''}{reduced} - {carry}")
            self.line(f"{total} = {acc} + {y}")
            self.line(f"{carry} = tl.where(tl.abs({total}) < float('inf'), ({total} - {acc}) - {y}, 0.0)")
            self.line(f"{acc} = {total}")
        else:
            self.line(f"{acc} = {self.apply(chunk_op, Val(acc, region.axes, dtype), Val(reduced, region.axes, dtype))}")
        self.end_stage(looped)
        if piece is not None:
            flat = bool(self.kernel.extents)
            self.combine_slices(acc, combine, dtype, "tl.arange(0, XBLOCK)[:, None]" if flat else None,
                                self.plan.blocks.xblock if flat else 1, self.plan.tiles)
            partials = Val(acc, region.axes, dtype)
            acc = initial
            self.line(f"{acc} = {self.apply(op, Val(acc, region.axes, dtype), partials)}")
        self.finish_accumulation(target, acc, region, deferred)

    def combine_slices(self, acc: str, combine: Binop, dtype: DType, cell: str | None, tile_cells: int,
                       tiles: int) -> None:
        """The second stage of a split reduction (split-K, or a flat kernel's split reduction),
        in the kernel: each program stores its slice's partial result ``acc`` (a tile of
        ``tile_cells`` cells at ``cell``, or a scalar when ``cell`` is ``None``); the tile's last
        program to finish (a counter per tile) combines the partial results with ``combine`` in
        a fixed order, whichever program that is, so the result is the same at every run, with no
        float atomics. A contraction's partial tiles are added one after the other, in slice
        order; a flat kernel's partial results (one or a few cells a slice, up to a few hundred
        slices) are loaded as one tile and combined by a tree (``tl.sum``...), whose shape alone
        fixes its order. The other programs go on with the loads and stores of what follows
        masked off (:meth:`mask`). On a GPU the barriers and the counter's acquire-release atomic
        order the partial results' stores before their loads (that ordering only matters, and is
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
        one = "[1, 1]" if self.kernel.extents or isinstance(self.plan, DotPlan) else "[1]"
        last_tile = self.temp(f"(tl.zeros({one}, tl.int32) + {done}) == {split - 1}", "last")
        self.line("tl.debug_barrier()")
        self.line(f"if {last}:  # the tile's last program combines the slices")
        self.depth += 1
        if isinstance(self.plan, DotPlan):
            self.line(f'{acc} = tl.load({base}{at}, cache_modifier=".cg")')
            s0 = self.names.word("s0")
            self.line(f"for {s0} in range(1, {split}):  # in slice order: the same result at every run")
            term = Val(f'tl.load({base} + {s0} * {tile_cells}{at}, cache_modifier=".cg")', frozenset({"m", "n"}), dtype)
            self.line(f"    {acc} = {self.apply(combine, Val(acc, term.axes, dtype), term)}")
        else:
            width = tiling.next_power_of_2(split)
            slices = self.temp(f"tl.arange(0, {width})" + ("" if cell is None else "[None, :]"), "k")
            mask = "" if width == split else f", mask={slices} < {split}, other={literal_code(_NEUTRAL[combine](dtype), dtype)}"
            loaded = self.temp(f'tl.load({base}{at} + {slices} * {tile_cells}{mask}, cache_modifier=".cg")', "p")
            if combine is Binop.MUL:
                self.helpers.add("product")
            fn = {Binop.ADD: "tl.sum", Binop.MUL: "product", Binop.MAX: "tl.max", Binop.MIN: "tl.min"}[combine]
            self.line(f"{acc} = {fn}({loaded}, {'axis=0' if cell is None else 'axis=1, keep_dims=True'})")
        self.line(f"tl.store({counts} + {tile}, 0)  # ready for the next run")
        self.depth -= 1
        self.split_last = (last, last_tile)

    def apply(self, op: Binop, acc: Val, combined: Val) -> str:
        """The code of ``acc`` updated by the combined terms of an accumulation with ``op``."""
        if op in (Binop.MAX, Binop.MIN):
            return f"{'tl.maximum' if op is Binop.MAX else 'tl.minimum'}({acc.code}, {combined.code})"
        if op is Binop.DIV:
            return self.arithmetic.divide(acc, combined)
        return f"{acc.code} {_APPLY[op]} {combined.code}"

    def splits(self, terms: int) -> bool:
        """Whether the reduction stage about to be written over ``terms`` points is the one the
        plan splits (:attr:`FlatPlan.split`): the kernel's first of that length, run once per
        program (not inside a sequential loop), before the kernel stores anything (so that every
        program of a tile may run what comes before it, and only the last what follows)."""
        plan = self.plan
        return (isinstance(plan, FlatPlan) and plan.split > 1 and self.split_last is None and not self.stored
                and terms == plan.split_terms and self.depth == 1)

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
        def canon(s: AnySymbol) -> Any:
            return s if isinstance(s, IndexSymbol) else region.canon.get(s, s)

        out = []
        for idx in indices:
            match idx:
                case Fixed(index=i):
                    out.append(("fixed", i))
                case Iter(symbol=s):
                    out.append(("iter", canon(s)))
                case Affine(terms=terms, offset=off):
                    out.append(("affine", tuple((c, canon(s)) for c, s in terms), off))
        return tuple(out)

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
        ``where(b != 0, div(a, b), 0)`` raises nothing (:attr:`branch_guards`)."""
        if not any(_integer_quotient(x) for x in iter_exprs(e)):
            return self.expr(e, region)
        self.branch_guards.append(f"({cond.code} {taken} 0)")
        try:
            return self.expr(e, region)
        finally:
            self.branch_guards.pop()

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
        failing = self.temp(" & ".join(lanes + self.branch_guards + [f"({name} == 0)"]), "zero_divisor")
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
            case LoadDynamic(tnode=node, axis=axis, position=p, indices=indices):
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
                if not _sets_first(first, local):
                    self.declare(local, region)
                self.stmt(body, region)
                return self.locals[local]
        raise TypeError(f"the Triton emitter does not know the expression {e!r}")


class FillKernelWriter(KernelWriter):
    """Fills whole buffers, ``XBLOCK`` cells a program."""

    def tiles(self) -> None:
        self.constexprs["XBLOCK"] = self.plan.blocks.xblock
        xindex = self.names.word("xindex")
        self.line(f"{xindex} = {self.program_id(self.plan.numel)} * XBLOCK + tl.arange(0, XBLOCK)")
        for f in self.plan.fills:
            self.fill(f, xindex, "XBLOCK")



class FlatKernelWriter(KernelWriter):
    """Flattens the grid into ``XBLOCK`` tiles (module docstring, "Tiles")."""

    def tiles(self) -> None:
        k, plan = self.kernel, self.plan
        two_d = self.two_d
        pid = self.program_id(plan.numel * plan.split)
        if plan.split > 1:  # the slices of one tile are neighbouring programs
            self.line(f"# the reduction over {plan.split_terms} terms in {plan.split} slices of {plan.slice_terms}")
            self.split_pid = self.names.word("pid_r")
            self.line(f"{self.split_pid} = {pid} % {plan.split}")
            self.tile_pid = self.temp(f"{pid} // {plan.split}", "pid")
            pid = self.tile_pid
        if plan.has_grid:
            self.constexprs["XBLOCK"] = plan.blocks.xblock
            xindex, xmask = self.names.word("xindex"), self.names.word("xmask")
            expand = "[:, None]" if two_d else ""
            self.line(f"{xindex} = {pid} * XBLOCK + tl.arange(0, XBLOCK){expand}")
            ragged = plan.ragged
            if ragged:  # the last program's tile runs past the grid
                self.line(f"{xmask} = {xindex} < {plan.numel}")
            codes = decompose(xindex, k.extents)
            axes = []
            for code in codes:
                axes.append(code if len(k.extents) == 1 else self.temp(code, "x"))
            region = Region({}, {}, {}, {"x": xmask} if ragged else {}, frozenset({"x"}),
                            "[XBLOCK, 1]" if two_d else "[XBLOCK]")
            self.axis_codes = axes
        else:
            region = Region({}, {}, {}, {}, frozenset(), "[]")
            self.axis_codes = []
        if plan.rblock is not None:
            self.constexprs["RBLOCK"] = plan.rblock
        self.top = len(self.lines)
        self.parts(region)



class DotKernelWriter(KernelWriter):
    """Tiles a contraction's rows and columns and sums over ``BLOCK_K`` steps with ``tl.dot``."""

    def tiles(self) -> None:
        k, plan = self.kernel, self.plan
        c: Contraction = k.contraction
        first = k.parts[0]
        rows_e, cols_e, batch_e, k_e = plan.rows, plan.cols, plan.batch, plan.k
        M, N = plan.m, plan.n
        blocks = plan.blocks
        self.constexprs.update(BLOCK_M=blocks.block_m, BLOCK_N=blocks.block_n, BLOCK_K=blocks.block_k,
                               GROUP_M=blocks.group_m)
        npm, npn = plan.row_tiles, plan.col_tiles
        self.line(f"# rows ({', '.join(map(str, rows_e))}) x columns ({', '.join(map(str, cols_e))})"
                  + (f" x batch ({', '.join(map(str, batch_e))})" if c.batch else "")
                  + f", summing over ({', '.join(map(str, k_e))})")
        pid = self.temp(self.program_id(plan.grid), "pid")
        tiles = npm * npn
        self.split_pid = None
        if plan.split_k > 1:  # the slices of one tile are neighbouring programs
            self.split_pid = self.names.word("pid_k")
            self.line(f"{self.split_pid} = {pid} % {plan.split_k}")
            pid = self.temp(f"{pid} // {plan.split_k}", "pid")
        self.tile_pid = pid
        if c.batch:
            pb = self.names.word("pid_b")
            self.line(f"{pb} = {pid} // {tiles}")
            pid = self.temp(f"{pid} % {tiles}", "pid")
        # Grouped order: GROUP_M row tiles share each column sweep (operand tiles stay in L2).
        group = self.temp(f"{pid} // (GROUP_M * {npn})", "group")
        first_m = self.temp(f"{group} * GROUP_M", "first_m")
        size_m = self.temp(f"tl.minimum({npm} - {first_m}, GROUP_M)", "group_size")
        pm, pn = self.names.word("pid_m"), self.names.word("pid_n")
        self.line(f"{pm} = {first_m} + ({pid} % (GROUP_M * {npn})) % {size_m}")
        self.line(f"{pn} = ({pid} % (GROUP_M * {npn})) // {size_m}")
        rm, rn = self.names.word("rm"), self.names.word("rn")
        self.line(f"{rm} = {pm} * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]")
        self.line(f"{rn} = {pn} * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]")
        masks = {}
        for ax, r, size, block in (("m", rm, M, blocks.block_m), ("n", rn, N, blocks.block_n)):
            if size % block:  # tiles run past the edge
                masks[ax] = self.names.word(f"{ax}mask")
                self.line(f"{masks[ax]} = {r} < {size}")
        code: dict[Symbol, tuple[str, frozenset[str]]] = {}
        for syms, ext, src, ax in ((c.rows, rows_e, rm, "m"), (c.cols, cols_e, rn, "n")):
            for sym, d in zip(syms, decompose(src, ext)):
                code[sym] = (d if len(syms) == 1 else self.temp(d, "x"), frozenset({ax}))
        if c.batch:
            for sym, d in zip(c.batch, decompose(pb, batch_e)):
                code[sym] = (d if len(c.batch) == 1 else self.temp(d, "b"), frozenset())
        self.axis_codes = [code[s][0] for s in first.grid]
        self.dot_axis_tiles = [set(code[s][1]) for s in first.grid]
        region = Region({}, {}, {}, masks, frozenset({"m", "n"}), "[BLOCK_M, BLOCK_N]")
        self.parts(region)

    def kernel_axis_tiles(self, t: int) -> set[str]:
        return self.dot_axis_tiles[t]

    def dot_loop(self, site: For, region: Region) -> None:
        """The contraction at ``site``: its accumulator's tile, then ``tl.dot`` over K tiles."""
        c: Contraction = self.kernel.contraction
        acc_stmt = c.accumulator
        if isinstance(acc_stmt, Store):
            acc = self.names.word("acc")
            old = self.load(Load(acc_stmt.tnode, acc_stmt.indices), region)
            self.line(f"{acc} = {self.broadcast(old, region)}")
        else:
            if acc_stmt.local not in self.locals:
                self.declare(acc_stmt.local, region)
            acc = self.locals[acc_stmt.local].code
        K, k_e = self.plan.k_total, self.plan.k
        k0 = self.names.word("k0")
        if self.split_pid is not None:
            pk, slice_k = self.split_pid, self.plan.k_slice
            self.line(f"{acc} = tl.where({pk} == 0, {acc}, 0.0)  # the first slice adds to the initial value")
            start = self.temp(f"{pk} * {slice_k}", "k_start")
            self.line(f"for {k0} in range({start}, tl.minimum({start} + {slice_k}, {K}), BLOCK_K):")
        else:
            self.line(f"for {k0} in range(0, {K}, BLOCK_K):")
        self.depth += 1
        self.push()
        rka, rkb = self.names.word("rka"), self.names.word("rkb")
        self.line(f"{rka} = {k0} + tl.arange(0, BLOCK_K)[None, :]")
        self.line(f"{rkb} = {k0} + tl.arange(0, BLOCK_K)[:, None]")
        kmask = self.plan.k_ragged
        ra = region.child(axes=frozenset({"m", "k"}), shape="[BLOCK_M, BLOCK_K]")
        ra.masks = {a: m for a, m in (("m", region.masks.get("m")), ("k", kmask and f"({rka} < {K})")) if m}
        rb = region.child(axes=frozenset({"k", "n"}), shape="[BLOCK_K, BLOCK_N]")
        rb.masks = {a: m for a, m in (("k", kmask and f"({rkb} < {K})"), ("n", region.masks.get("n"))) if m}
        ksyms = [s for s, _ in c.k]
        for reg, src, prefix in ((ra, rka, "ka"), (rb, rkb, "kb")):
            for sym, d, e in zip(ksyms, decompose(src, k_e), k_e):
                reg.symbols[sym] = (d if len(ksyms) == 1 else self.temp(d, prefix), frozenset({"k"}))
                reg.bounds[sym] = (0, e - 1)
                reg.canon[sym] = ("k", sym)
        if self.plan.sixteen is dtypes.float16:
            a, b = self.operand_16(c.a, ra), self.operand_16(c.b, rb)
            self.line(f"{acc} = tl.dot({a}, {b}, {acc})")
        elif self.plan.sixteen is dtypes.bfloat16:
            # On a GPU the bfloat16 tiles go to the tensor cores as they are. Triton's interpreter
            # cannot multiply bfloat16 tiles: there, a TF32 dot of the float32 tiles computes the
            # same (bfloat16 values are exact in TF32, 7 < 10 mantissa bits; exact products,
            # float32 sums). The module's NATIVE_BF16_DOT constant picks the branch.
            self.line("if NATIVE_BF16_DOT:")
            self.depth += 1
            a, b = (self.temp(self.load_code(e, r, convert=False) + ".to(tl.bfloat16, bitcast=True)", name)
                    for e, r, name in ((c.a, ra, "a"), (c.b, rb, "b")))
            self.line(f"{acc} = tl.dot({a}, {b}, {acc})")
            self.depth -= 1
            self.line("else:")
            self.depth += 1
            a, b = self.operand(c.a, ra, "a"), self.operand(c.b, rb, "b")
            self.line(f'{acc} = tl.dot({a}, {b}, {acc}, input_precision="tf32")')
            self.depth -= 1
            self.native_bf16_dot = True
        else:
            a, b = self.operand(c.a, ra, "a"), self.operand(c.b, rb, "b")
            self.line(f'{acc} = tl.dot({a}, {b}, {acc}, input_precision="{self.options.fp32_dot}")')
        self.uses_dot = True
        self.pop()
        self.depth -= 1
        if self.split_pid is not None:
            blocks = self.plan.blocks
            self.combine_slices(acc, Binop.ADD, dtypes.float32,
                                "tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]",
                                blocks.block_m * blocks.block_n, self.plan.grid // self.plan.split_k)
        if isinstance(acc_stmt, Store):
            result = Val(acc, frozenset({"m", "n"}), dtypes.float32)
            self.store_value(acc_stmt.tnode, acc_stmt.indices, result, region, skip_oob=False)

    def operand(self, e: Expr, region: Region, prefix: str) -> str:
        v = self.expr(e, region)
        code = v.code
        plain = isinstance(e, Load) and e.oob_value in (None, 0, 0.0)
        if not plain and region.masks:
            masks = " & ".join(region.masks[a] for a in sorted(region.masks))
            code = f"tl.where({masks}, {code}, 0.0)"
        if v.axes != region.axes:
            code = f"tl.broadcast_to({code}, {region.shape})"
        return code if NAME_PATTERN.match(code) else self.temp(code, prefix)

    def operand_16(self, e: Expr, region: Region) -> str:
        """A float16 load kept in its storage type for the tensor cores."""
        return self.temp(self.load_code(e, region, convert=False), "a" if "m" in region.axes else "b")



WRITERS: dict[type, type[KernelWriter]] = {FillPlan: FillKernelWriter, FlatPlan: FlatKernelWriter, DotPlan: DotKernelWriter}
"""The writer of each kind of plan."""


# ---------------------------------------------------------------------------------------------
# Helpers

_EXACT_ACCUMULATORS = frozenset({dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64, dtypes.uint32})
"""Accumulator types a tiled reduction computes as the loop does (half precision rounds on every
store, so it stays sequential)."""


SHORT_SUM = 16
"""Sums, differences, products and quotients over fewer points run in the loop's order (bit for
bit the interpreter's); longer ones are tiled (a tree order, within the conformance tolerance).
Max and min are exact in any order and tiled at every length."""

_COMMUTATIVE = frozenset({Binop.ADD, Binop.MUL, Binop.MAX, Binop.MIN})

_NEUTRAL = {Binop.ADD: lambda dtype: 0, Binop.MUL: lambda dtype: 1, Binop.MAX: dtypes.lowest, Binop.MIN: dtypes.highest}
"""The value each combining operator of a regrouped reduction starts from (what masked lanes add)."""

_APPLY = {Binop.ADD: "+", Binop.SUB: "-", Binop.MUL: "*"}
"""Infix operators applying a tile's combined terms to the accumulator."""


def _accumulator_type(target: Store | SetLocal) -> DType:
    return target.tnode.dtype if isinstance(target, Store) else target.local.dtype


def _accumulation(body: Stmt) -> tuple[Binop, Store | SetLocal, Expr] | None:
    """``(op, statement, v)`` when ``body`` is ``c[I] := op(c[I], v)`` or ``l := op(l, v)`` (or
    ``op(v, old)`` for a commutative ``op``), ``v`` not reading the cell."""
    found = update_of(body, _COMMUTATIVE)
    if found is None or found.op not in scalar_accumulators():
        return None
    old = Load(body.tnode, body.indices) if isinstance(body, Store) else GetLocal(found.statement.local)
    return None if _mentions(found.term, old) else (found.op, found.statement, found.term)


def scalar_accumulators() -> frozenset[Binop]:
    from ocannl.lowlevel.scalar_ops import ACCUMULATORS

    return ACCUMULATORS


def _integer_quotient(e: Expr) -> bool:
    """Whether ``e`` is an integer ``div`` or ``mod``, whose divisor the kernel checks."""
    return isinstance(e, Binary) and e.op in (Binop.DIV, Binop.MOD) and not e.dtype.is_float


def _mentions(e: Expr, old: Expr) -> bool:
    if isinstance(old, GetLocal):
        return any(isinstance(x, GetLocal) and x.local is old.local for x in iter_exprs(e)) or any(
            isinstance(x, LocalScope) for x in iter_exprs(e))
    return any(isinstance(x, (Load, LoadDynamic)) and x.tnode is old.tnode for x in iter_exprs(e))


def _sets_first(s: Stmt, local: Local) -> bool:
    """Whether ``s`` assigns ``local`` a value that does not read it (so its zero is never seen)."""
    return isinstance(s, SetLocal) and s.local is local and not any(
        isinstance(x, GetLocal) and x.local is local for x in iter_exprs(s.value))


def _has_loop(body: Stmt) -> bool:
    """Whether ``body`` has a loop of its own (local scopes aside)."""
    if isinstance(body, For):
        return True
    return isinstance(body, Seq) and any(_has_loop(s) for s in body.stmts)


def _sets_undeclared_local(body: Stmt) -> bool:
    declared = {s.local for s in iter_stmts(body) if isinstance(s, DeclareLocal)}
    for s in iter_stmts(body):
        for e in stmt_exprs(s):
            declared.update(x.local for x in iter_exprs(e) if isinstance(x, LocalScope))
    return any(isinstance(s, SetLocal) and s.local not in declared for s in iter_stmts(body))


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
