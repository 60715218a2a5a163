"""CPU scheduling decisions for the C-family emitters (C, and the loops inside a Metal thread):
which contraction nests become register tiles, with which tile and block sizes and vector
lanes, which run as packed GEMMs, which loops run in parallel and where selects print without
branches. It reads the loop IR and the reduction records of schedule.py and returns plain data:
one :class:`NestPlan` per loop nest (:func:`plan_nest`), holding a :class:`ContractionPlan`, its
:class:`TileNest` records and its :class:`GemmPlan`; ``ocannl/backends/codegen.py`` prints what
it decides, and decides nothing itself.

**Register tiles** (:func:`plan_contraction`): a nest of parallel loops around reduction loops
accumulating into one cell per parallel iteration (matmul ``c[i,j] += a[i,k]*b[k,j]``) is worked
as ``mr x nr`` tiles of cells held in registers, the reduction loops inside, the column loop
unit-stride, the outermost reduction loop blocked for the cache. Each cell still adds its terms
in the interpreter's order, so results stay bit-identical; only which cell is worked on when
changes. A sum in blocks (summation.py) is tiled as it is written.

**Packed GEMM** (:class:`GemmPlan`, :func:`plan_gemm`): on a target that runs them (the C backend
tells :func:`plan_contraction` the width of its vector registers), a float32 contraction whose
term is the product of two loads, some result loops read by one only (rows) and some by the
other only (columns), runs as a BLIS-style GEMM: matmul, batched matmul, both of their
gradients, attention's einsums, convolutions as implicit GEMMs. Panels of both operands are
packed into contiguous buffers, in cache blocks ``mc x kc x nc`` (:data:`GEMM_BLOCKING`), for an
``mr x nr`` micro-kernel of vector registers (:data:`GEMM_TILES`). The micro-kernel
adds each cell's terms in their order, and starts each block of the summation order
(ocannl/lowlevel/summation.py) from zero before adding it to the cell, which is exactly how the
interpreter sums: ``kc`` is a multiple of the block, so a block never straddles two panels.

**Parallel loops** (:func:`parallel_safe`, :data:`PARALLEL_MIN_WORK`): a parallel loop whose
iterations write disjoint cells and read no cell another iteration writes may run on threads;
it is worth it from :data:`PARALLEL_MIN_WORK` innermost iterations, register tiles from
:data:`TILE_PARALLEL_MIN_WORK` multiply-adds in one region, packed GEMMs from
:data:`GEMM_PARALLEL_MIN_WORK`: each about a tenth of a millisecond of one core's work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal, Sequence

from ocannl.lowlevel import dtypes
from ocannl.lowlevel.analysis import (
    affine_form, expr_symbols, locals_bound, locals_read, locals_written, loop_chain, provably_within, row_major_offset,
    substitute_index, under_constant_arithmetic,
)
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.indexing import Affine, AnySymbol, AxisIndex, Iter, Symbol, index_symbols
from ocannl.lowlevel.ir import (
    Binary, Cast, Const, Expr, Fill, For, GetLocal, Load, LoadDynamic, Local, LocalScope, LoopKind, Seq, SetLocal,
    Stmt, Store, StoreDynamic, Ternary, Unary, iter_exprs, iter_stmts, seq, stmt_exprs, total_over_executions,
)
from ocannl.lowlevel.rewrite import FreshCopy, Rewriter
from ocannl.lowlevel.scalar_ops import Binop, Ternop
from ocannl.lowlevel.schedule import Contraction, block_terms, blocked_reduction_of, contraction_of, reduction_of
from ocannl.lowlevel.tnode import TNode

PARALLEL_MIN_WORK = 1 << 15
"""A loop nest gets a parallel pragma when it runs at least this many innermost iterations
(about 10-30 µs of one core's work for an elementwise loop): below that, handing the
iterations out and joining the threads costs more than it saves, and more still where another
process holds a core (a parallel loop waits for its last thread). Threads spin briefly between
regions (``ocannl/backends/c/compiler.py``), so in a routine of many nests a region finds them
awake. At 2^19 the GPT step of ``bench/cpu_steps.py`` ran its 131k- and 262k-element nests
(layer norms, softmax rows, residual adds: about 7 of its 40 ms on one core) on one thread
while the other spun; from 2^15 (register tiles from 2^18) its two-thread step went from 25.0
to 22.4 ms (best rounds, both builds in one process taking turns, Zen 4), one thread and the
small MLP, CNN and transformer steps unchanged. With another process busy on one of the two
cores (the thread count then follows the free cores) the step took 1.06x its one-thread time.
An MLP training step of 64-256-256-10 ran slower on two threads than on one while its small
contractions had parallel pragmas and the threads slept between regions."""

TILE_PARALLEL_MIN_WORK = 1 << 18
"""Multiply-adds (cells x terms) from which one parallel region of register tiles runs on
threads, counted per region (a nest of tiles inside the loop over the cache blocks of its
reduction is one region per block): tiles do about 15 multiply-adds a nanosecond on one core,
so this is about 17 µs of work, as :data:`PARALLEL_MIN_WORK` is for plain loops."""

TILE_MIN_WORK = 4096
"""A contraction is register-tiled when (parallel cells) x (reduction steps) reaches this; smaller
ones print as plain loops, which read better and run as fast."""

TILE_ROWS = 4
TILE_BYTES = 64
"""A register tile is ``TILE_ROWS`` cells of the row loop by ``TILE_BYTES / itemsize`` cells of
the unit-stride column loop (4 x 16 floats): 64 independent accumulators, enough to hide the
adder latency that an in-order sum per cell would otherwise expose."""

SCALAR_TILE_CELLS = 8
SCALAR_TILE_COLUMNS = 4
"""A tile whose columns no term reads adjacent, and whose terms the walk cannot build vectors
of (a row's mean, max or sum of exponentials, along the rows' contiguous axis), runs in scalar
registers: 8 cells, ``SCALAR_TILE_COLUMNS`` of them a row, are independent sums enough to keep
two adders busy. 64 (4 x 16) ran no faster and took GCC several times as long."""

REDUCTION_BLOCK = 128
"""The reduction steps a tile runs before moving on to the next tile (cache blocking of the
outermost reduction loop)."""


GEMM_TILES: dict[int, tuple[int, int]] = {64: (12, 16), 32: (6, 16), 16: (6, 8), 0: (4, 4)}
"""The micro-kernel's ``mr x nr`` float32 cells by the width of the target's vector registers in
bytes (0: scalar code), chosen so that the multiplies and adds (unfused: the interpreter rounds
each) are independent enough to keep both FP multiply and both FP add pipes of a core busy.
AVX2 and SSE: ``mr`` rows of two vectors, 12 accumulators, which with two vectors of the packed
B row and one broadcast A value fill their 16 registers. AVX-512: 12 rows of one vector, 12
accumulators of its 32 registers: on a core that runs 512-bit operations as two halves (Zen 4),
two vectors a row (6 x 32) measured 63-65 GFLOP/s on the 1024 product and one (12 x 16) 83-89
(numpy 100, with fused multiply-adds), for 192 cells either way. Scalar code gets 16
accumulators."""

GEMM_TILES_ONE_BLOCK: dict[int, tuple[int, int]] = {64: (16, 16)}
"""The tile for a product whose cells each sum one block of terms (at most a block, or in loop
order), where it pads the rows less than :data:`GEMM_TILES`' does: with no running totals to
keep beside the sums, AVX-512's registers hold 16 rows. Attention's products (64 rows, 32 or 64
terms) then run as 4 whole tiles instead of 5 and a padded one: the scores of a 16 x 4 batch of
heads took 287 us instead of 318 (Zen 4, one thread)."""

GEMM_TILES_FEWER_ROWS: dict[int, tuple[int, int]] = {64: (8, 16)}
"""The tile for a product whose rows it pads less than :data:`GEMM_TILES`' does (chosen then, the
fewest padded rows winning, :data:`GEMM_TILES_ONE_BLOCK` first on a tie): an edge tile runs
through a buffer, its padding rows computed for nothing. The large MLP's layers have 128 and
1024 rows, which 12 divides neither, 8 both. The 1024 product (``bench/gemm.py``, Zen 4) ran at
80-94 GFLOP/s in 12 x 16 tiles, 85 of them and a padded one down each block, and at 90-100 in
8 x 16 tiles (numpy 95-104, measured alongside; two threads: 115-152 and 135-162)."""

VECTOR_REGISTERS: dict[int, int] = {64: 32, 32: 16, 16: 16, 0: 16}
"""The vector (or floating-point) registers of a target by the width of its vector registers
in bytes, as few as x86-64 has (ARM's 32 at 16 bytes are not counted on)."""

GEMM_BLOCKING = (144, 256, 512)
"""``(mc, kc, nc)`` of the packed GEMM, for cores with a 32 KiB L1 data cache and at least 512
KiB of L2 (x86-64 since Haswell/Zen, recent ARM cores): a ``kc x nr`` micro-panel of B (16 KiB
at nr = 16) stays in L1 while the micro-kernel streams an ``mr x kc`` micro-panel of A; the
``mc x kc`` block of A (144 KiB) stays in L2 while it meets every micro-panel of the ``kc x nc``
panel of B (512 KiB, in L2 or L3). ``kc`` is a multiple of the summation order's block (64
terms), so the blocks of every cell fall whole into one panel. Each thread takes its buffers
from the heap, at most ``(mc + nc) * kc`` floats (656 KiB): more than a small thread stack
holds."""

PACK_K_BLOCK = 16
PACK_ALIASING_BYTES = 4096
"""Terms of each row or column packed at a time from an operand contiguous along ``k`` whose
rows (or columns) lie a multiple of ``PACK_ALIASING_BYTES`` apart (:class:`Packing`). Taking
``k`` after ``k`` across a strip's 16 columns reads one value of 16 cache lines at a time, lines
that then wait in L1 for the next ``k``: at 4 KiB apart they all fall in one set of the cache,
and evict each other. Packing the 1024 x 1024 weight of ``x @ w.T`` (an MLP layer's forward
product) took 0.9-1.4 ms ``k`` after ``k``, 0.35 ms 16 terms of a column at a time (Zen 4; the
product of 128 rows runs in 2.8 ms). Rows 3136 bytes apart (784 floats) packed in 0.16 ms ``k``
after ``k`` and 0.35 ms by blocks, so blocks are kept for the strides that need them."""

IN_PLACE_MAX_BYTES = 1 << 14
"""The largest operand (of one product of a batch) a packed GEMM reads in place rather than packs
(:func:`_in_place`). Packing pays for itself when each packed value feeds many micro-kernel
calls; in attention's products (a 16 x 4 batch of heads, 64 x 64 x 32 each) a value feeds two to
four, and packing took about a third of the time. Read in place, the batch of scores ran in 214
us instead of 284, of values in 177 instead of 254, the values' gradient in 169 instead of 202
(Zen 4, one thread, operands in the caches; in the GPT step of ``bench/cpu_steps.py``, where they
come from the nests before, the twenty products gained 1-2% of the step, within its noise). The
128 x 128 weights of the same step's projections (64 KiB) measured no better in place: they
stay packed."""

GEMM_MIN_WORK = 1 << 15
"""Multiply-adds from which a GEMM-class contraction is packed: below it, packing costs more than
it saves and the register tiles of :class:`ContractionPlan` do the work."""

GEMM_PARALLEL_MIN_WORK = 1 << 21
"""Multiply-adds from which a packed GEMM runs on threads. A packed GEMM does a multiply-add in
10-25 ps on one core, far faster than the loops :data:`PARALLEL_MIN_WORK` is sized for, and
each unit of work packs the panel of the operand it does not split: below this (25-50 µs of
work) handing out the units costs more than the other cores give. The MLP step of
``bench/cpu_steps.py`` (64 x 256 x 256 products, 2^22) took 463 µs on one thread and 363 µs on
two with its three largest products on threads (the threads spinning briefly between regions,
``ocannl/backends/c/compiler.py``; sleeping, two threads took 554 µs)."""

GEMM_MIN_REUSE = 16
"""Multiply-adds per packed value (``M N K / ((M + N) K)``, that is ``M N / (M + N)``) from which a
contraction is packed: packing reads each operand value once through its general index (digits
of flat indices, bounds tests of a padding) and writes it again, a few nanoseconds, which a
product reusing each value only a dozen times does not earn back. The CNN step of
``bench/cpu_steps.py``, whose second convolution's forward product (1024 positions by 16 channels:
15) and kernel gradient (16 channels by 72 kernel cells: 13) were packed, ran in 400 µs, and in
240 µs with both in vector tiles (``docs/codegen.md``); an MLP's products (64 x 256 x 256: 51)
run faster packed."""

GEMM_THIN_MIN_WORK = 1 << 20
"""Multiply-adds from which a product thinner than :data:`GEMM_MIN_TILES` is still packed, when
its other operand is read in place (``Packing.in_place``), so that no packed value serves only a
few multiply-adds: the edge tiles run through a buffer on lanes partly padding, still far
faster than register tiles whose operands are both contiguous along the terms (scalar cells).
The 784-1024-1024-10 MLP step's output layer (128 rows, 10 classes, 1024 terms) took 280-370 µs
in 4 x 10 scalar register tiles and 72 µs packed, its weight gradient (10 rows) 67-133 µs and
67, the step 15.6 ms and 14.9 (Zen 4, one thread). Smaller thin products (a 64 x 128 x 10
layer) keep their register tiles (:data:`GEMM_MIN_TILES`)."""

GEMM_MIN_TILES = (2, 1)
"""Whole micro-kernel tiles a packed GEMM needs down its rows and across its columns: a product
narrower than one tile (10 classes against an ``nr`` of 32) would only run edge tiles, through a
buffer, on lanes mostly padding, slower than register tiles (measured: 64 x 128 x 16 in 8 us
packed, 3 us in register tiles)."""


Loops = tuple[tuple[Symbol, int], ...]


@dataclass(frozen=True)
class MicroKernel:
    """What tells two GEMM micro-kernels apart (a source prints each once): the ``mr x nr``
    tile, ``lanes`` floats per vector (1: scalar), the summation order (``block``: each
    ``block`` terms summed from zero, then added to the cell; ``None``: the terms added to the
    cell one by one) and the operand order of the product (``a_first``: ``a * b``).
    ``totals_in_registers``: under a block order, the cells' running totals stay in registers
    next to the block sums, so a call reads and writes its tile once rather than once a block
    (:func:`plan_gemm`). ``a_in_place`` / ``b_in_place``: the strides ``(along, k)`` at which the
    kernel reads an operand left unpacked (:attr:`Packing.in_place`); ``None``: a packed strip."""

    mr: int
    nr: int
    lanes: int
    block: int | None
    a_first: bool
    totals_in_registers: bool = False
    a_in_place: tuple[int, int] | None = None
    b_in_place: tuple[int, int] | None = None


@dataclass(frozen=True)
class Packing:
    """How a packed GEMM reads one operand into its strips (``gemm_printer.py``).

    ``flat_along`` / ``flat_k``: the operand's offset is linear in the flat index of its rows
    (or columns) / of ``k``, and every axis these loops index is provably in bounds, so the
    packing reads it at the flat index times one stride rather than through the loops' digits
    (``64*(k / 64) + k % 64`` is one division and one remainder a value). ``k_block``: the operand
    is contiguous along ``k``, its rows :data:`PACK_ALIASING_BYTES` apart, and packed
    :data:`PACK_K_BLOCK` terms of each row or column at a time (every panel holds whole blocks);
    ``None``: ``k`` after ``k``, across the strip. ``in_place``: the operand is not packed at all,
    the micro-kernel reads it where it lies, ``(along, k)`` floats apart between consecutive rows
    (or columns) and terms (:func:`_in_place`)."""

    flat_along: bool = False
    flat_k: bool = False
    k_block: int | None = None
    in_place: tuple[int, int] | None = None


@dataclass(frozen=True)
class Strides:
    """Where an operand of a packed GEMM, or its result, lies when its offset is linear in each of
    the GEMM's loops: in ``node``, at ``offset``, plus ``outer[i]`` times the index of the ``i``-th
    loop around the products, plus ``along`` times the flat index of the operand's rows (or
    columns; the result's rows), plus ``k`` times the flat index of the terms (the result's
    columns), in floats."""

    node: TNode
    offset: int
    outer: tuple[int, ...]
    along: int
    k: int


SHARED_LOOPS_MAX_OUTER = 3
"""The loops around the products (a batch, its heads) the shared loops take (:class:`SharedLoops`)."""


@dataclass(frozen=True)
class SharedLoops:
    """A packed GEMM that runs in the loops its tile shape shares with every such GEMM of a source
    (``ocannl_gemm_loops_<mr>x<nr>``, ``ocannl/backends/c/gemm.py``): its operands and result lie
    at offsets linear in its loops (:class:`Strides`, each index provably in bounds, at most
    :data:`SHARED_LOOPS_MAX_OUTER` loops around the products), each factor is its load or
    ``0.0 + load`` (``a_plus_zero``, ``b_plus_zero``: packed as the load plus ``+0.0``, which
    turns a ``-0.0`` positive as the interpreter's ``0.0 + x`` does), and the result is stored as
    summed (no consumer around the sum). Its call passes addresses and strides, so a source
    compiles those loops once per tile shape rather than once per product."""

    a: Strides
    b: Strides
    c: Strides
    a_plus_zero: bool = False
    b_plus_zero: bool = False


@dataclass(frozen=True)
class GemmPlan:
    """A contraction as a packed GEMM (module docstring; printed by ``ocannl/backends/codegen.py``
    with the micro-kernels of ``ocannl/backends/c/gemm.py``).

    For each iteration of the ``outer`` loops (the loops both factors use, such as a batch),
    ``C[row, col] op= A(row, k) * B(k, col)`` over ``k < K``: ``a`` and ``b`` are the two factor
    loads, ``a`` reading the ``rows`` loops and not the ``cols`` ones, ``b`` the other way round.
    Each of ``rows``, ``cols`` and ``k`` is a tuple of loops read as the digits of one flat index,
    row-major (the first loop the slowest); ``k``'s flat order is each cell's order of terms.
    ``a_first``: the term is ``a * b`` (else ``b * a``; the kernel keeps the operand order).
    ``block``: every ``block`` consecutive terms are summed from zero and the sum is added to the
    cell (``None``: the terms are added to the cell one by one). ``c_strides``: the strides of
    the result between flat rows and between flat columns, when both are linear (else every tile
    goes through a buffer). ``mr x nr`` cells per micro-kernel, ``lanes``
    floats per vector (1: scalar), ``mc x kc x nc`` cache blocks. ``parallel``: worth threads
    (:data:`GEMM_PARALLEL_MIN_WORK`); in a :class:`NestPlan`, runs on them. ``a_packing`` and
    ``b_packing``: how each operand is packed (:class:`Packing`)."""

    outer: Loops
    rows: Loops
    cols: Loops
    k: Loops
    a: Load
    b: Load
    a_first: bool
    block: int | None
    c_strides: tuple[int, int] | None
    mr: int
    nr: int
    lanes: int
    mc: int
    kc: int
    nc: int
    parallel: bool
    totals_in_registers: bool = False
    a_packing: Packing = Packing()
    b_packing: Packing = Packing()
    shared: SharedLoops | None = None

    @property
    def m(self) -> int:
        return math.prod(n for _, n in self.rows)

    @property
    def n(self) -> int:
        return math.prod(n for _, n in self.cols)

    @property
    def depth(self) -> int:
        """``K``, the terms of a cell."""
        return math.prod(n for _, n in self.k)

    @property
    def kernel(self) -> MicroKernel:
        return MicroKernel(self.mr, self.nr, self.lanes, self.block, self.a_first, self.totals_in_registers,
                           self.a_packing.in_place, self.b_packing.in_place)


@dataclass(frozen=True)
class ContractionPlan:
    """How a contraction nest is worked in register tiles (see :func:`plan_contraction`; printed by
    ``ocannl/backends/c/tile_printer.py``, or ``c/gemm_printer.py`` where :attr:`gemm` is set).

    ``parallel`` are the loops that index the written cell, ``reductions`` the others, each in
    nest order (the order of ``reductions`` is each cell's summation order and never changes).
    ``rows`` and ``cols`` are the parallel loops tiled ``mr x nr`` (``cols`` unit-stride),
    ``outer`` the other parallel loops; the first reduction loop runs in blocks of ``block`` steps
    when ``block`` is set. The accumulator of a cell starts from the cell itself, or from the
    ``reset`` constant where the cell is reset before its sum (the reset is never stored: the
    cell's first read is replaced by its value), or, when ``scope`` is set, from ``init`` in that
    local scope's variable, and the store's value is then computed from it.
    """

    nest: For
    parallel: tuple[tuple[Symbol, int], ...]
    outer: tuple[tuple[Symbol, int], ...]
    rows: tuple[Symbol, int] | None
    cols: tuple[Symbol, int] | None
    mr: int
    nr: int
    reductions: tuple[tuple[Symbol, int], ...]
    block: int | None
    store: Store
    op: Binop
    term: Expr
    reset: Const | None = None
    scope: LocalScope | None = None
    init: Const | None = None
    blocks: Stmt | None = None
    """The reduction in blocks (ocannl/lowlevel/summation.py): loops around leaf stores
    ``out[I] := out[I] + v { loops { v := v op term } }``; each leaf sums its block from zero in
    the tile's registers and adds it to the cell (``reductions`` is then empty)."""
    gemm: GemmPlan | None = None
    """Set when the contraction runs as a packed GEMM instead of register tiles."""

    @property
    def work(self) -> int:
        terms = math.prod(n for _, n in self.reductions) if self.blocks is None else block_terms(self.blocks)
        return math.prod(n for _, n in self.parallel) * terms

    @property
    def accumulator_dtype(self) -> DType:
        return self.scope.local.dtype if self.scope is not None else self.store.tnode.dtype.compute


def plan_contraction(loop: For, vector_bytes: int | None = None) -> ContractionPlan | None:
    """The register-tiling plan of the nest headed by ``loop``, or ``None`` when it is not a
    contraction worth tiling. ``vector_bytes``: the width of the target's vector registers (0:
    none) when it runs packed GEMMs (C; ``None``: it does not), which then sets
    :attr:`ContractionPlan.gemm` where :func:`plan_gemm` finds one.

    A contraction accumulates into one cell per iteration of its *parallel* loops, the loops
    that index the written cell, over its *reduction* loops. Three forms reach the emitter, read
    as one :class:`~ocannl.lowlevel.schedule.Reduction` record:

    * a perfect nest of loops, in any order, around ``out[I] := out[I] <op> term`` (``I`` indexed
      by the parallel loops only; gradients put the batch reduction outermost);
    * parallel loops around ``out[I] := neutral`` followed by reduction loops around that store
      (the lowering of ``=:+``);
    * parallel loops around ``out[I] := f(v { v := init; <reduction loops> { v := v <op> term } })``
      (a reduction inlined into its consumer by the optimizer).

    ``term`` must not read ``out`` nor use other locals. Each parallel iteration owns its cell, so
    cells can be computed in any order, and in registers, as long as each cell's own steps keep
    their order: reduction loops stay in their nest order, inside the parallel ones.
    """
    plan = _plan_contraction(loop)
    if plan is None or vector_bytes is None:
        return plan
    gemm = plan_gemm(plan, vector_bytes)
    return plan if gemm is None else replace(plan, gemm=gemm)


def _plan_contraction(loop: For) -> ContractionPlan | None:
    blocked = _plan_blocked_contraction(loop)
    if blocked is not None:
        return blocked
    found = reduction_of(loop)
    if found is None or not found.separable or (found.scope is not None and found.parallel != found.around):
        return None
    store, op, term, scope, init = found.store, found.op, found.term, found.scope, found.init
    reset = found.reset.value if found.reset is not None else None
    out, idx = store.tnode, store.indices
    if scope is not None and any(isinstance(e, (Load, LoadDynamic)) and e.tnode is out and e.indices != idx
                                 for e in iter_exprs(store.value)):
        return None
    for e in iter_exprs(term):
        if isinstance(e, (GetLocal, LocalScope)) or (isinstance(e, (Load, LoadDynamic)) and e.tnode is out):
            return None
    parallel = [(f.symbol, f.extent) for f in found.parallel]
    reductions = list(found.loop_extents)
    if not reductions:
        return None
    p_volume = math.prod(n for _, n in parallel)
    r_volume = math.prod(n for _, n in reductions)
    if not parallel or p_volume < 8 or r_volume < 4 or p_volume * r_volume < TILE_MIN_WORK:
        return None

    cols = _choose_cols(parallel, idx, term)
    others = [p for p in parallel if cols is None or p[0] is not cols[0]]
    rows = _choose_rows(others, cols, [term])
    outer = tuple(p for p in others if rows is None or p[0] is not rows[0])
    itemsize = (scope.local.dtype if scope is not None else out.dtype.compute).itemsize
    mr, nr = _tile_shape({p for p, _ in parallel}, rows, cols, op, [term], itemsize)
    inner = math.prod(n for _, n in reductions[1:])
    block = max(1, REDUCTION_BLOCK // inner)
    return ContractionPlan(
        nest=loop,
        parallel=tuple(parallel),
        outer=outer,
        rows=rows,
        cols=cols,
        mr=mr,
        nr=nr,
        reductions=tuple(reductions),
        block=block if block < reductions[0][1] else None,
        store=store,
        op=op,
        term=term,
        reset=reset,
        scope=scope,
        init=init,
    )


def _plan_blocked_contraction(loop: For) -> ContractionPlan | None:
    """The plan of a contraction whose reduction is in blocks of the summation order
    (``ContractionPlan.blocks``, recognized by
    :func:`~ocannl.lowlevel.schedule.blocked_reduction_of`), when it is worth tiling."""
    found = blocked_reduction_of(loop)
    if found is None:
        return None
    parallel = [(f.symbol, f.extent) for f in found.around]
    p_volume = math.prod(n for _, n in parallel)
    if p_volume < 8 or p_volume * found.volume < TILE_MIN_WORK:
        return None
    store, term = found.store, found.term
    cols = _choose_cols(parallel, store.indices, term)
    others = [p for p in parallel if cols is None or p[0] is not cols[0]]
    terms = leaf_terms(found.blocks) if found.blocks is not None else [term]
    rows = _choose_rows(others, cols, terms)
    mr, nr = _tile_shape({p for p, _ in parallel}, rows, cols, found.op, terms, store.tnode.dtype.compute.itemsize)
    return ContractionPlan(
        nest=loop,
        parallel=tuple(parallel),
        outer=tuple(p for p in others if rows is None or p[0] is not rows[0]),
        rows=rows,
        cols=cols,
        mr=mr,
        nr=nr,
        reductions=(),
        block=None,
        store=store,
        op=found.op,
        term=term,
        reset=found.reset.value if found.reset is not None else None,
        scope=found.scope,
        init=found.init,
        blocks=found.blocks,
    )


def plan_gemm(plan: ContractionPlan, vector_bytes: int) -> GemmPlan | None:
    """The packed-GEMM plan of a register-tiled contraction, or ``None`` when it is not
    GEMM-class or too small (module docstring, :data:`GEMM_MIN_WORK`).

    GEMM-class: float32 cells, accumulator and operands; a sum (``+``) of ``x * y`` where ``x``
    and ``y`` are loads; some parallel loops read by ``x`` only (the rows), some by ``y`` only
    (the columns; the loops both read, or neither, run around the GEMM); the reduction in loop
    order, or in blocks of the summation order that are whole iterations of its loops (one leaf
    of blocks, or blocks of one loop with a shorter last one; not blocks of blocks, beyond 64 x
    64 terms). An inlined reduction (``out[I] := f(v)``) must fit one ``kc`` panel, since its
    running sum lives in the micro-kernel's tile only."""
    if plan.work < GEMM_MIN_WORK or plan.op is not Binop.ADD:
        return None
    out = plan.store.tnode
    if out.dtype is not dtypes.float32 or plan.accumulator_dtype is not dtypes.float32:
        return None
    if plan.init is not None and not isinstance(plan.init.value, float):
        return None
    flat = _flat_terms(plan)
    if flat is None:
        return None
    k, term, block = flat
    if not (isinstance(term, Binary) and term.op is Binop.MUL and term.dtype is dtypes.float32):
        return None
    if not all(_factor_load(f) is not None and f.dtype is dtypes.float32 for f in (term.a, term.b)):
        return None
    product = contraction_of(term.a, term.b, tuple(s for s, _ in plan.parallel), k)
    if product is None:
        return None
    c_terms = affine_form(row_major_offset(plan.store.indices, out.dims))[0]
    c_coefficient = {s: c for c, s in c_terms}
    # Columns: the side holding the result's contiguous loop, so whole tiles store vectors.
    contiguous = {s for s, c in c_coefficient.items() if c == 1}
    a_first = not (contiguous & set(product.rows)) or bool(contiguous & set(product.cols))
    if not a_first:
        product = product.swapped()
    extent = dict(plan.parallel)
    rows, cols, outer = (tuple((s, extent[s]) for s in side) for side in (product.rows, product.cols, product.batch))
    n_k = math.prod(n for _, n in k)
    m = math.prod(n for _, n in rows)
    mr, nr = _gemm_tile(m, block is None or n_k <= block, vector_bytes)
    mc, kc, nc = GEMM_BLOCKING  # whole tiles per block, whole summation blocks per panel
    unit = block or 1
    mc, nc, kc = max(mr, mc // mr * mr), max(nr, nc // nr * nr), max(unit, kc // unit * unit)
    if plan.scope is not None and n_k > kc:
        return None
    lanes = vector_bytes // 4 if vector_bytes in GEMM_TILES and vector_bytes else 1
    packings = _packings(plan, product, (rows, cols, k), (mr, nr, kc, nc), lanes, {**extent, **dict(k)})
    if packings is None:
        return None
    a_packing, b_packing = packings
    row_stride, col_stride = _flat_stride(rows, c_coefficient), _flat_stride(cols, c_coefficient)
    # The block sums, as many running totals, a row of B and a value of A, all in registers:
    # the tile is then read and written once a call instead of once a block. On Zen 4 (12 x 16,
    # blocks of 64, kc 256) that took the 1024 product from 82 to 93-94 GFLOP/s on one core:
    # the tile's 12 rows, 4 KiB apart, fell in one set of the L1 cache at every block.
    vectors = mr * (nr // lanes)
    totals_in_registers = block is not None and 2 * vectors + nr // lanes + 1 <= VECTOR_REGISTERS.get(vector_bytes, 16)
    return GemmPlan(
        outer=outer,
        rows=rows,
        cols=cols,
        k=k,
        a=product.a,
        b=product.b,
        a_first=a_first,
        block=block,
        c_strides=(row_stride, col_stride) if row_stride is not None and col_stride is not None else None,
        mr=mr,
        nr=nr,
        lanes=lanes,
        mc=mc,
        kc=kc,
        nc=nc,
        parallel=plan.work >= GEMM_PARALLEL_MIN_WORK,
        totals_in_registers=totals_in_registers,
        a_packing=a_packing,
        b_packing=b_packing,
        shared=_shared_loops(plan, product, outer, rows, cols, k, {**extent, **dict(k)}),
    )


def _shared_loops(plan: ContractionPlan, product: Contraction, outer: Loops, rows: Loops, cols: Loops, k: Loops,
                  extents: dict[AnySymbol, int]) -> SharedLoops | None:
    """The product as :class:`SharedLoops`, or ``None`` where it must print loops of its own."""
    if plan.scope is not None or len(outer) > SHARED_LOOPS_MAX_OUTER:
        return None
    factors = [_plain_factor(f) for f in (product.a, product.b)]
    if None in factors:
        return None
    (a, a_plus_zero), (b, b_plus_zero) = factors
    placed = (_strides(a, outer, rows, k, extents), _strides(b, outer, cols, k, extents),
              _strides(plan.store, outer, rows, cols, extents))
    if None in placed:
        return None
    return SharedLoops(*placed, a_plus_zero, b_plus_zero)


def _plain_factor(factor: Expr) -> tuple[Load, bool] | None:
    """``(load, plus_zero)`` of a factor that is a load of float32 storage, or ``0.0 + load``
    (``plus_zero``): the shared loops read the operand's floats as they lie."""
    plus_zero = (isinstance(factor, Binary) and factor.op is Binop.ADD and factor.dtype is dtypes.float32
                 and isinstance(factor.a, Const) and factor.a.value == 0.0 and math.copysign(1.0, factor.a.value) > 0)
    load = factor.b if plus_zero else factor
    if isinstance(load, Load) and load.tnode.dtype is dtypes.float32:
        return load, plus_zero
    return None


def _strides(access: Load | Store, outer: Loops, along: Loops, k: Loops,
             extents: dict[AnySymbol, int]) -> Strides | None:
    """Where ``access`` lies in the GEMM's loops (:class:`Strides`), when its offset is linear in
    them alone and each of its indices is provably in bounds."""
    node, indices = access.tnode, access.indices
    if not all(provably_within(idx, d, extents) for idx, d in zip(indices, node.dims)):
        return None
    terms, offset = affine_form(row_major_offset(indices, node.dims))
    coefficient = {s: c for c, s in terms}
    if not set(coefficient) <= {s for s, _ in (*outer, *along, *k)}:
        return None
    along_stride, k_stride = _flat_stride(along, coefficient), _flat_stride(k, coefficient)
    if along_stride is None or k_stride is None:
        return None
    return Strides(node, offset, tuple(coefficient.get(s, 0) for s, _ in outer), along_stride, k_stride)


def _packings(plan: ContractionPlan, product: Contraction, loops: tuple[Loops, Loops, Loops],
              sizes: tuple[int, int, int, int], lanes: int, extents: dict[AnySymbol, int]
              ) -> tuple[Packing, Packing] | None:
    """How a packed GEMM reads its two operands (:func:`_packing`), or ``None`` when packing them
    would not pay: fewer than :data:`GEMM_MIN_REUSE` multiply-adds per packed value, or a product
    thinner than :data:`GEMM_MIN_TILES` without an operand read in place or below
    :data:`GEMM_THIN_MIN_WORK`. ``loops``: its rows, columns and terms; ``sizes``: ``mr, nr, kc,
    nc``. A packed value of A serves the tiles of its row across a panel's columns, one of B the
    tiles of its column down the rows."""
    (rows, cols, k), (mr, nr, kc, nc) = loops, sizes
    m, n = math.prod(n for _, n in rows), math.prod(n for _, n in cols)
    a_packing = _packing(product.a, rows, k, kc, extents, mr, False, -(-min(n, nc) // nr))
    b_packing = _packing(product.b, cols, k, kc, extents, nr, lanes > 1, -(-m // mr))
    packed = (m if a_packing.in_place is None else 0) + (n if b_packing.in_place is None else 0)
    if packed and m * n < GEMM_MIN_REUSE * packed:
        return None
    thin = m < GEMM_MIN_TILES[0] * mr or n < GEMM_MIN_TILES[1] * nr
    if thin and (packed == m + n or plan.work < GEMM_THIN_MIN_WORK):
        return None
    return a_packing, b_packing


def _gemm_tile(m: int, one_block: bool, vector_bytes: int) -> tuple[int, int]:
    """The micro-kernel's ``mr x nr`` for ``m`` rows: of :data:`GEMM_TILES`, then
    :data:`GEMM_TILES_ONE_BLOCK` where each cell sums ``one_block``, then
    :data:`GEMM_TILES_FEWER_ROWS`, the first that pads the rows least."""
    tiles = [GEMM_TILES.get(vector_bytes, GEMM_TILES[0])]
    if vector_bytes in GEMM_TILES_ONE_BLOCK and one_block:
        tiles.append(GEMM_TILES_ONE_BLOCK[vector_bytes])
    if vector_bytes in GEMM_TILES_FEWER_ROWS:
        tiles.append(GEMM_TILES_FEWER_ROWS[vector_bytes])
    return min(tiles, key=lambda tile: _padded(m, tile[0]))


def _padded(m: int, mr: int) -> int:
    """``m`` rows rounded up to whole tiles of ``mr``."""
    return -(-m // mr) * mr


def _factor_load(factor: Expr) -> Load | None:
    """The one load a factor of a packed GEMM reads: the factor is that load, or a function of it
    and constants alone (a gradient's copy ``0.0 + g[i]``, a cast, ``relu x``), which the packing
    computes once per packed value; ``None`` for any other factor."""
    reads = [e for e in iter_exprs(factor) if isinstance(e, (Load, LoadDynamic, GetLocal, LocalScope))]
    return reads[0] if len(reads) == 1 and isinstance(reads[0], Load) else None


def _packing(expr: Expr, along: Loops, k: Loops, kc: int, extents: dict[AnySymbol, int], width: int,
             unit_along: bool, reuse: int) -> Packing:
    """How to pack the factor ``expr``, read by the loops ``along`` (its rows or columns) and
    ``k``, with panels of ``kc`` terms into strips ``width`` rows or columns wide
    (:class:`Packing`); ``unit_along``: the micro-kernel reads the strip's rows or columns as one
    vector, so an operand read in place must be contiguous along them; ``reuse``: the
    micro-kernel calls that would read each packed strip."""
    factor = _factor_load(expr)
    assert factor is not None, "plan_gemm packs factors that read one load"
    dims = factor.tnode.dims
    coefficient = {s: c for c, s in affine_form(row_major_offset(factor.indices, dims))[0]}

    def flat(loops: Loops) -> bool:
        symbols = {s for s, _ in loops}
        return _flat_stride(loops, coefficient) is not None and all(
            provably_within(idx, d, extents) for idx, d in zip(factor.indices, dims) if symbols.intersection(index_symbols(idx)))

    flat_along, flat_k = flat(along), flat(k)
    depth = math.prod(n for _, n in k)
    contiguous = flat_k and _flat_stride(k, coefficient) == 1
    apart = _flat_stride(along, coefficient) * factor.dtype.itemsize if flat_along else 0
    aliasing = apart != 0 and apart % PACK_ALIASING_BYTES == 0
    whole_blocks = depth % PACK_K_BLOCK == 0 and kc % PACK_K_BLOCK == 0
    in_place = None
    if expr == factor and flat_along and flat_k:
        strides = (_flat_stride(along, coefficient), _flat_stride(k, coefficient))
        extent = math.prod(n for _, n in along)
        if _in_place(strides, extent, depth, width, unit_along, factor.dtype.itemsize, reuse):
            in_place = strides
    return Packing(flat_along, flat_k, PACK_K_BLOCK if contiguous and aliasing and whole_blocks else None, in_place)


def _in_place(strides: tuple[int, int], extent: int, depth: int, width: int, unit_along: bool, itemsize: int,
              reuse: int) -> bool:
    """Whether the micro-kernel reads an operand of ``extent`` rows (or columns) by ``depth`` terms
    where it lies, ``strides`` apart (:data:`IN_PLACE_MAX_BYTES`), rather than from packed strips
    ``width`` wide that ``reuse`` micro-kernel calls would read. Its rows (or columns) must fill
    whole strips (a strip past its end would read beyond the buffer) and, where the kernel loads a
    vector's worth of them as one (``unit_along``), lie side by side. Then an operand each of whose
    strips one call reads is read in place whatever its size: packing would copy every value for
    one use (an MLP's 10-class output layer, whose 10 columns are one strip). Otherwise the
    operand must be small enough to stay in the caches between the calls that read it, neither
    stride a multiple of :data:`PACK_ALIASING_BYTES`, which would put the tile's values in one set
    of the L1 cache."""
    along, k = strides
    if along <= 0 or k <= 0 or extent % width or (unit_along and along != 1):
        return False
    if reuse <= 1:
        return True
    if extent * depth * itemsize > IN_PLACE_MAX_BYTES:
        return False
    return all(stride * itemsize % PACK_ALIASING_BYTES for stride in strides)


def _flat_stride(loops: Loops, coefficient: dict[AnySymbol, int]) -> int | None:
    """The stride between consecutive flat indices of ``loops`` (row-major) in a buffer whose
    offset has these coefficients, when the offset is linear in the flat index, else ``None``."""
    stride = coefficient.get(loops[-1][0], 0)
    expected = stride
    for (s, _), (_, n_inner) in zip(reversed(loops[:-1]), reversed(loops[1:])):
        expected *= n_inner
        if coefficient.get(s, 0) != expected:
            return None
    return stride


def _flat_terms(plan: ContractionPlan) -> tuple[Loops, Expr, int | None] | None:
    """``(k, term, block)``: a contraction's terms as one function of the loops ``k``, whose
    row-major flat index is each cell's order of terms, and the summation order's block
    (``None``: in loop order), or ``None`` when its blocks are not ``block`` consecutive terms
    each (the last may be shorter) reading the same operands at the same flat positions."""
    if plan.blocks is None:
        return plan.reductions, plan.term, None
    tops = plan.blocks.stmts if isinstance(plan.blocks, Seq) else (plan.blocks,)
    if len(tops) == 1:  # one leaf in loops: the loops and the leaf's are the digits of k
        chain, leaf = loop_chain(tops[0])
        found = _block_leaf(leaf)
        if found is None:
            return None
        inner, term = found
        loops = tuple((f.symbol, f.extent) for f in (*chain, *inner))
        return loops, term, math.prod(f.extent for f in inner)
    return _one_loop_blocks(tops)


def _one_loop_blocks(tops: tuple[Stmt, ...]) -> tuple[Loops, Expr, int] | None:
    """The blocks of one reduction loop cut into leaves (a loop of whole blocks, a shorter last
    one): the terms rewritten over the first leaf's loop as the flat index, when every leaf
    reads the same operands at the same flat positions."""
    leaves: list[tuple[For | None, For, Expr]] = []  # (loop over blocks, loop over a block's terms, term)
    for top in tops:
        outer = top if isinstance(top, For) else None
        found = _block_leaf(top.body if outer is not None else top)
        if found is None or len(found[0]) != 1:
            return None
        leaves.append((outer, found[0][0], found[1]))
    block = leaves[0][1].extent
    k = leaves[0][1].symbol
    term: Expr | None = None
    start = 0
    for n, (outer, inner, leaf_term) in enumerate(leaves):
        last = n == len(leaves) - 1
        if inner.extent > block or (inner.extent < block and (not last or outer is not None)):
            return None
        # The leaf's own loops as the flat index: inner = k - start - block * outer.
        flat_index = Affine(((1, k), *(((-block, outer.symbol),) if outer is not None else ())), -start)
        flat = _substituted(leaf_term, {inner.symbol: flat_index})
        if flat is None or (outer is not None and _uses(flat, outer.symbol)):
            return None
        if term is None:
            term = flat
        elif _key(flat) != _key(term):
            return None
        start += inner.extent * (outer.extent if outer is not None else 1)
    return ((k, start),), term, block


def _block_leaf(leaf: Stmt) -> tuple[list[For], Expr] | None:
    """``(loops, term)`` of a leaf of the summation order's blocks, ``cell := cell + v { loops {
    v := v + term } }`` (or the same into the inlined reduction's variable), when its block is
    loops of terms (not blocks of blocks)."""
    if not isinstance(leaf, (Store, SetLocal)) or not isinstance(leaf.value, Binary):
        return None
    scope = leaf.value.b
    if not isinstance(scope, LocalScope):
        return None
    body = scope.body.stmts if isinstance(scope.body, Seq) else (scope.body,)
    if len(body) != 1 or not isinstance(body[0], For):
        return None
    loops, step = loop_chain(body[0])
    if not (isinstance(step, SetLocal) and step.local is scope.local and isinstance(step.value, Binary)
            and step.value.op is Binop.ADD and step.value.a == GetLocal(scope.local)):
        return None
    if any(isinstance(e, (LocalScope, GetLocal)) for e in iter_exprs(step.value.b)):
        return None
    return loops, step.value.b


def _substituted(term: Expr, env: dict[AnySymbol, AxisIndex]) -> Expr | None:
    """``term`` with the symbols of ``env`` replaced in its loads' indices, when it is built of
    loads and constants through arithmetic and casts (a GEMM takes products of loads, or of
    functions of one load each), else ``None``."""
    match term:
        case Binary(op=op, a=a, b=b):
            x, y = _substituted(a, env), _substituted(b, env)
            return None if x is None or y is None else Binary(op, x, y)
        case Unary(x=a) | Cast(x=a):
            x = _substituted(a, env)
            return None if x is None else replace(term, x=x)
        case Const():
            return term
        case Load(tnode=node, indices=indices, oob_value=oob):
            return Load(node, tuple(substitute_index(i, env) for i in indices), oob)
    return None


def _uses(term: Expr, symbol: AnySymbol) -> bool:
    return any(symbol in index_symbols(i) for e in iter_exprs(term) if isinstance(e, Load) for i in e.indices)


def _key(term: Expr) -> object:
    """``term`` compared up to the order of the terms within its affine indices."""
    match term:
        case Binary(op=op, a=a, b=b):
            return (op, _key(a), _key(b))
        case Unary(op=op, x=x):
            return (op, _key(x))
        case Cast(x=x, dtype=dtype):
            return ("cast", dtype, _key(x))
        case Load(tnode=node, indices=indices, oob_value=oob):
            forms = []
            for i in indices:
                terms, offset = affine_form(i)
                merged: dict[AnySymbol, int] = {}
                for c, s in terms:
                    merged[s] = merged.get(s, 0) + c
                forms.append((frozenset((s, c) for s, c in merged.items() if c), offset))
            return (id(node), tuple(forms), oob)
    return term


def _choose_rows(
    others: list[tuple[Symbol, int]], cols: tuple[Symbol, int] | None, terms: list[Expr]
) -> tuple[Symbol, int] | None:
    """The row loop of the tiles, among the parallel loops but the columns: the innermost one
    that no load reading the columns reads, so that each term is a value of the row times a
    vector of the row's columns (a matmul's ``a[i, k] * b[k, j]``, a convolution's kernel
    gradient ``g[b, oh, ow, co] * x[b, oh+kh, ow+kw, ci]``: the output channel, not ``kw``); else the
    innermost one."""
    if not others:
        return None
    if cols is not None:
        col_reads = {s for t in terms for e in iter_exprs(t) if isinstance(e, Load)
                     and any(cols[0] in index_symbols(i) for i in e.indices)
                     for i in e.indices for s in index_symbols(i)}
        free = [p for p in others if p[0] not in col_reads]
        if free:
            return free[-1]
    return others[-1]


def _tile_shape(parallel: set[Symbol], rows: tuple[Symbol, int] | None, cols: tuple[Symbol, int] | None, op: Binop,
                terms: list[Expr], itemsize: int) -> tuple[int, int]:
    """``mr x nr``, the cells of a register tile: :data:`TILE_ROWS` by a vector's bytes
    (:data:`TILE_BYTES`) where the tile's columns can run in vector lanes (a term reads them
    adjacent, or the walk can build its vectors, :func:`vector_factors`); else
    :data:`SCALAR_TILE_CELLS`, :data:`SCALAR_TILE_COLUMNS` of them a row."""
    if cols is not None and (_reads_adjacent(cols[0], parallel, terms) or (
            op is Binop.ADD and all(vector_factors(t, rows[0] if rows else None, cols[0]) is not None for t in terms))):
        return (min(TILE_ROWS, rows[1]) if rows else 1), min(TILE_BYTES // itemsize, cols[1])
    nr = min(SCALAR_TILE_COLUMNS, cols[1]) if cols else 1
    return (min(SCALAR_TILE_CELLS // nr, rows[1]) if rows else 1), nr


def _reads_adjacent(col: Symbol, parallel: set[Symbol], terms: list[Expr]) -> bool:
    """Whether a load of ``terms`` that moves with the reduction (reads a symbol not among the
    ``parallel`` loops) reads adjacent elements along ``col``: its last index is ``col``."""
    return any(isinstance(e, Load) and e.indices and isinstance(e.indices[-1], Iter) and e.indices[-1].symbol is col
               and any(s not in parallel for i in e.indices for s in index_symbols(i))
               for t in terms for e in iter_exprs(t))


def leaf_terms(blocks: Stmt) -> list[Expr]:
    """The terms of the leaves of a reduction in blocks (``v := v op term``)."""
    return [s.value.b for s in iter_stmts(blocks)
            if isinstance(s, SetLocal) and isinstance(s.value, Binary) and not isinstance(s.value.b, LocalScope)]


def _choose_cols(
    parallel: list[tuple[Symbol, int]], out_idx: tuple[AxisIndex, ...], term: Expr
) -> tuple[Symbol, int] | None:
    """The column (vector) loop: the one indexing the result's last axis, where cells are
    adjacent; else the one indexing the last axis of the most loads of ``term``."""
    by_symbol = {s: (s, n) for s, n in parallel}
    if out_idx and isinstance(out_idx[-1], Iter) and out_idx[-1].symbol in by_symbol:
        return by_symbol[out_idx[-1].symbol]
    counts: dict[Symbol, int] = {}
    for e in iter_exprs(term):
        if isinstance(e, Load) and e.indices and isinstance(e.indices[-1], Iter):
            s = e.indices[-1].symbol
            if s in by_symbol:
                counts[s] = counts.get(s, 0) + 1
    if not counts:
        return None
    return by_symbol[max(counts, key=lambda s: counts[s])]


def work(stmt: Stmt) -> int:
    """The number of innermost statement executions of ``stmt`` (a loop nest's cost); a fill
    counts one per cell."""
    return total_over_executions(stmt, lambda s: s.tnode.size if isinstance(s, Fill) else 1)


def parallel_safe(loop: For) -> bool:
    """Whether the iterations of ``loop`` may run concurrently: it is a parallel loop (its stores
    index their node by the loop's own index, so iterations write disjoint cells), and every node
    it writes is read back only at the cell the same iteration writes."""
    if loop.kind is not LoopKind.PARALLEL:
        return False
    written: dict[TNode, set[tuple[AxisIndex, ...] | None]] = {}  # None: a dynamic index
    for s in iter_stmts(loop.body):
        if isinstance(s, Fill):
            return False
        if isinstance(s, (Store, StoreDynamic)):
            written.setdefault(s.tnode, set()).add(s.indices if isinstance(s, Store) else None)
    for s in iter_stmts(loop.body):
        for e in (sub for top in stmt_exprs(s) for sub in iter_exprs(top)):
            if isinstance(e, LoadDynamic) and e.tnode in written:
                return False
            if isinstance(e, Load) and e.tnode in written:
                if written[e.tnode] != {e.indices}:
                    return False
    return True


def in_store_order(loop: For) -> For | None:
    """:func:`store_ordered_nest` where it reorders ``loop``; ``None`` where the nest is not such
    a store or is in that order already."""
    nest = store_ordered_nest(loop)
    return None if nest is loop else nest


def store_ordered_nest(loop: For) -> For | None:
    """The perfect nest headed by ``loop`` when every iteration writes a cell of its own and
    computes it from values no other iteration writes (no chain from one iteration to the next,
    unlike a maximum over a row), its loops ordered by their stride in the stored node (the loop
    over consecutive cells innermost, so the C compiler vectorizes it; ``loop`` itself where
    they are in that order already), else ``None``. The nest of a gradient keeps the order of
    its product space: the max pool's gradient has its window loops innermost, over cells 8 or
    16 apart. Each iteration computes the same value in any order: the bits do not change.

    The stored cell's offset must be a sum of the loop indices with positive strides, each loop
    of a stride larger than the span of the loops below it (mixed radix); the stored value may
    read the stored node only at that cell, and nothing by a dynamic position or in a local
    scope."""
    chain, body = loop_chain(loop)
    if not isinstance(body, Store):
        return None
    by_symbol = {f.symbol: f for f in chain}
    terms, _ = affine_form(row_major_offset(body.indices, body.tnode.dims))
    strides: dict[AnySymbol, int] = {}
    for c, sym in terms:
        strides[sym] = strides.get(sym, 0) + c
    if strides.keys() != by_symbol.keys() or min(strides.values()) <= 0:
        return None
    order = sorted(chain, key=lambda f: -strides[f.symbol])
    span = 0
    for f in reversed(order):  # innermost first: each stride beyond what the inner loops reach
        if strides[f.symbol] <= span:
            return None
        span += strides[f.symbol] * (f.extent - 1)
    if not _reads_only_its_cell(body):
        return None
    if all(a is b for a, b in zip(order, chain)):
        return loop
    nest: Stmt = body
    for f in reversed(order):
        nest = replace(f, body=nest)
    return nest


# ---------------------------------------------------------------------------------------------
# Nest plans: everything the C-family walk prints a nest by, decided before it prints


VECTOR_TILE_COLUMNS = 4
"""Columns of a register tile (cells at consecutive offsets) from which its selects print
without branches (:attr:`NestPlan.branchless`): four floats, the narrowest vector. The CNN step
of bench/cpu_steps.py (tiles of 8 columns) gains from it; the transformer step's 2 x 1 tiles of a
maximum over a row lose 8% to it."""


@dataclass(frozen=True)
class TileSpan:
    """The tiles of a :class:`TileNest` along one axis: tiles of ``size`` cells covering
    ``start ..< stop``, in a loop over ``0, size, ... < stop`` when ``looped`` (``start`` is then
    0), else the one tile at ``start``. An axis the plan does not tile is one tile of one cell."""

    looped: bool
    start: int
    stop: int
    size: int

    @property
    def cells(self) -> int:
        return self.stop - self.start


def tile_spans(axis: tuple[Symbol, int] | None, size: int) -> tuple[TileSpan, ...]:
    """The tiles along one axis of ``size``-cell tiles: the full tiles (a loop when there are
    several), then one narrower tile for the remainder."""
    if axis is None:
        return (TileSpan(False, 0, 1, 1),)
    n = axis[1]
    full = n - n % size
    spans: list[TileSpan] = []
    if full:
        spans.append(TileSpan(True, 0, full, size) if full > size else TileSpan(False, 0, size, size))
    if n % size:
        spans.append(TileSpan(False, full, n, n % size))
    return tuple(spans)


@dataclass(frozen=True)
class TileNest:
    """One nest of equal register tiles of a :class:`ContractionPlan`: its ``rows`` by ``cols``
    tiles, the cells of a row one vector holds (``lanes``, :func:`tile_lanes`; ``None``: scalar
    registers) and whether its loops run on threads (``parallel``, :data:`TILE_PARALLEL_MIN_WORK`)."""

    rows: TileSpan
    cols: TileSpan
    lanes: int | None
    parallel: bool


@dataclass(frozen=True)
class NestPlan:
    """How the C-family walk (``ocannl/backends/codegen.py``) prints a loop nest it reaches outside
    local scopes and tiles (:func:`plan_nest`); the printer decides nothing of it.

    ``nest``: the loops as printed (reordered into store order where that helps,
    :func:`store_ordered_nest`). ``parallel``: its outermost loop runs on threads
    (:data:`PARALLEL_MIN_WORK`). ``branchless``: no chain runs from one value to the next here (a
    register tile of at least :data:`VECTOR_TILE_COLUMNS` columns, a nest in store order), so
    selects here and in everything nested print without branches, which the C compiler
    vectorizes; elsewhere a branch serves the serial chains better. ``contraction``: the nest runs
    as register tiles, or as a packed GEMM where ``contraction.gemm`` is set (its ``parallel``
    then says whether it runs on threads). ``tile_nests``: the nests of register tiles, one group
    per loop the printer puts around them (each top-level statement of a reduction in blocks not
    held in registers, :attr:`ContractionPlan.blocks`), else one group. ``simd``: the loop is
    the innermost of a nest in store order (its iterations independent) that the C compiler's
    ``-O2`` would leave scalar, and asks for a vector loop (``#pragma omp simd``): one whose trip
    count is not a whole number of vectors (``-O2`` vectorizes only loops needing no scalar
    remainder), or any inside a parallel region (OpenMP moves the region into a function that
    reads the buffers' addresses from a structure, their ``restrict`` lost, and ``-O2`` adds no
    run-time alias check; a parallel loop that is innermost asks for both at once). The loss's
    softmax over 54 classes, whose exponential is a vectorizable helper, took 255 us scalar and
    72 us so; the GPT's relu over 16x64x512, a parallel nest, 300 us and 45 us (Zen 4, one
    thread)."""

    nest: For
    parallel: bool = False
    branchless: bool = False
    simd: bool = False
    contraction: ContractionPlan | None = None
    tile_nests: tuple[tuple[TileNest, ...], ...] = ()


def plan_nest(loop: For, vector_bytes: int | None, threads: bool, tiles: bool = True,
              in_parallel: bool = False) -> NestPlan:
    """The plan of the nest headed by ``loop``, which the walk reaches outside local scopes and
    tiles: register tiles or a packed GEMM where :func:`plan_contraction` finds a contraction
    (``vector_bytes`` as there; ``tiles``: the target prints contractions, as C does), else the
    nest in store order where that differs (:func:`store_ordered_nest`), else the loop as it is
    (:func:`plan_loop`). ``threads``: a parallel region may open here (the target has threads,
    and none is open around ``loop``); ``in_parallel``: ``loop`` is inside one."""
    contraction = plan_contraction(loop, vector_bytes) if tiles else None
    if contraction is None:
        ordered = store_ordered_nest(loop)
        nest = loop if ordered is None else ordered
        plan = plan_loop(nest, threads)
        return replace(plan, branchless=ordered is not None,
                       simd=_scalar_vector_loop(nest, vector_bytes, in_parallel or plan.parallel))
    branchless = contraction.nr >= VECTOR_TILE_COLUMNS
    if contraction.gemm is not None:
        gemm = replace(contraction.gemm, parallel=contraction.gemm.parallel and threads)
        return NestPlan(loop, branchless=branchless, contraction=replace(contraction, gemm=gemm))
    return NestPlan(loop, branchless=branchless, contraction=contraction,
                    tile_nests=_tile_nests(contraction, vector_bytes, threads))


def _reads_only_its_cell(store: Store) -> bool:
    """Whether ``store``'s value reads its own node at the stored cell only, and nothing by a
    dynamic position or in a local scope: each iteration of the loops around it computes its cell
    from values no other iteration writes."""
    return not any(isinstance(e, (LoadDynamic, LocalScope))
                   or (isinstance(e, Load) and e.tnode is store.tnode and e.indices != store.indices)
                   for e in iter_exprs(store.value))


def _scalar_vector_loop(loop: For, vector_bytes: int | None, in_parallel: bool) -> bool:
    """Whether ``loop`` is an innermost loop whose iterations are independent, each storing a
    cell of its own, consecutive ones adjacent, and computing it from nothing another writes (the
    stored node read only at that cell), and either inside a parallel region or with a trip count
    not a whole number of the target's vectors of the stored type (:attr:`NestPlan.simd`)."""
    body = loop.body
    if not vector_bytes or not isinstance(body, Store):
        return False
    if not in_parallel and loop.extent % max(1, vector_bytes // body.tnode.dtype.itemsize) == 0:
        return False
    terms, _ = affine_form(row_major_offset(body.indices, body.tnode.dims))
    return sum(c for c, s in terms if s == loop.symbol) == 1 and _reads_only_its_cell(body)


def plan_loop(loop: For, threads: bool) -> NestPlan:
    """``loop`` printed as it is, on threads where ``threads`` allows, its iterations may run
    concurrently (:func:`parallel_safe`) and its work is worth it (:data:`PARALLEL_MIN_WORK`)."""
    return NestPlan(loop, parallel=threads and work(loop) >= PARALLEL_MIN_WORK and parallel_safe(loop))


def _tile_nests(plan: ContractionPlan, vector_bytes: int | None, threads: bool) -> tuple[tuple[TileNest, ...], ...]:
    """The groups of :attr:`NestPlan.tile_nests`. Each group's tiles share the terms of the loop
    around them: the cache blocks of a sum in loop order, a top-level loop of the blocks."""
    if plan.blocks is None:
        first_extent = plan.reductions[0][1]
        around = -(-first_extent // plan.block) if plan.block is not None else 1
        return (_tile_group(plan, None, around, vector_bytes, threads),)
    if plan.scope is not None:  # the sum lives in the tiles' registers: no loop around them
        return (_tile_group(plan, plan.blocks, 1, vector_bytes, threads),)
    tops = plan.blocks.stmts if isinstance(plan.blocks, Seq) else (plan.blocks,)
    return tuple(_tile_group(plan, top.body, top.extent, vector_bytes, threads) if isinstance(top, For)
                 else _tile_group(plan, top, 1, vector_bytes, threads) for top in tops)


def _tile_group(plan: ContractionPlan, blocks: Stmt | None, around: int, vector_bytes: int | None,
                threads: bool) -> tuple[TileNest, ...]:
    """The nests of equal tiles of one group: ``blocks`` is the part of the blocks each tile runs
    (``None``: the sum in loop order), ``around`` the iterations of the loop around the group.
    A nest runs on threads when its own share of the work, per iteration of that loop, reaches
    :data:`TILE_PARALLEL_MIN_WORK` and it has loops to share."""
    terms = plan.work // math.prod(n for _, n in plan.parallel)
    outer_cells = math.prod(n for _, n in plan.outer)
    nests = []
    for rows in tile_spans(plan.rows, plan.mr):
        for cols in tile_spans(plan.cols, plan.nr):
            tiled = [span for axis, span in ((plan.rows, rows), (plan.cols, cols)) if axis is not None]
            looped = bool(plan.outer) or any(span.looped for span in tiled)
            cells = outer_cells * math.prod(span.cells for span in tiled)
            parallel = threads and looped and cells * terms >= TILE_PARALLEL_MIN_WORK * around
            nests.append(TileNest(rows, cols, tile_lanes(plan, cols.size, blocks, vector_bytes), parallel))
    return tuple(nests)


def tile_lanes(plan: ContractionPlan, nr: int, blocks: Stmt | None, vector_bytes: int | None) -> int | None:
    """The cells of a row of ``nr``-column tiles that one vector holds, when the tiles run in the
    target's vector registers of ``vector_bytes`` (``None`` or 0: it has none the walk writes),
    else ``None``; ``blocks``: the part of the blocks each tile runs (``None``: the sum in loop order).

    A compiler's own vectorizer misses many tiles (a stride between the columns of an operand, a
    ``where`` around the term): the walk then writes the vectors itself. Each step of a row is
    ``acc = acc + x * y`` on vectors: ``x`` a value of the row (read once, broadcast), ``y`` a
    vector of the row's columns (one load where they are adjacent, else built lane by lane), and,
    for a term ``where(c, x * y, k)`` whose test ``c`` reads no column, ``acc + (c ? x * y : k)``
    (:func:`vector_factors`). Every lane adds its cell's own terms, each product and sum rounded
    once as the interpreter rounds them (``-ffp-contract=off``), in the same order: the bits do
    not change. Float32 cells and terms, a sum, ``nr`` a multiple of a vector of at least 4 lanes."""
    if not vector_bytes or plan.cols is None or plan.op is not Binop.ADD:
        return None
    if plan.accumulator_dtype is not dtypes.float32 or plan.store.tnode.dtype is not dtypes.float32:
        return None
    lanes = vector_bytes // 4
    while lanes > nr or nr % lanes:
        lanes //= 2
    if lanes < 4:
        return None
    terms = [plan.term] if blocks is None else leaf_terms(blocks)
    row = plan.rows[0] if plan.rows is not None else None
    if not terms or any(vector_factors(t, row, plan.cols[0]) is None for t in terms):
        return None
    return lanes


def vector_factors(term: Expr, row: Symbol | None, col: Symbol) -> tuple[Expr | None, Expr, Expr, bool, float] | None:
    """``(test, x, y, x_first, other)`` of a term ``x * y`` (``x_first``) or ``y * x``, or
    ``where(test, that, other)`` for a constant ``other``, where ``x`` and ``test`` read no
    column and ``y`` no row: float32 values, ``x`` a function of one load (broadcast to the
    row's vectors: an inlined gradient's copy ``0.0 + g``, :func:`_factor_load`), ``y`` a load or
    arithmetic of one with constants (:func:`vector_chain_load`, computed on the loaded vector),
    a test free of locals. ``None`` otherwise."""
    test, other = None, 0.0
    if isinstance(term, Ternary) and term.op is Ternop.WHERE and isinstance(term.c, Const):
        test, other, term = term.a, term.c.value, term.b
        if any(isinstance(e, (LocalScope, GetLocal, LoadDynamic)) for e in iter_exprs(test)):
            return None
        if col in expr_symbols(test):
            return None
    if not (isinstance(term, Binary) and term.op is Binop.MUL and term.dtype is dtypes.float32):
        return None
    for x, y, x_first in ((term.a, term.b, True), (term.b, term.a, False)):
        if not (x.dtype is dtypes.float32 and _factor_load(x) is not None and vector_chain_load(y) is not None):
            continue
        if col not in expr_symbols(x) and col in expr_symbols(y) and (row is None or row not in expr_symbols(y)):
            return test, x, y, x_first, other
    return None


_VECTOR_CHAIN_OPS = frozenset({Binop.ADD, Binop.SUB, Binop.MUL, Binop.DIV})


def vector_chain_load(factor: Expr) -> Load | None:
    """The float32 load under ``factor`` when ``factor`` is that load, or ``+ - * /`` of it with
    constants and negations (a gradient's copy ``0.0 + g``): what a vector tile computes on the
    loaded vector of columns, the constants broadcast; ``None`` for any other factor."""
    load = under_constant_arithmetic(factor, _VECTOR_CHAIN_OPS, casts=False)
    return load if isinstance(load, Load) and load.tnode.dtype is dtypes.float32 else None


def gemm_with_epilogue(loop: For, vector_bytes: int,
                       plan: ContractionPlan | None = None) -> tuple[For, For | None] | None:
    """A GEMM-class product inlined into its consumer, ``for P: out[I] := f(v { v := init; <the
    sum> })`` (a bias added to ``w @ x``, a gate applied to a gradient's product), as two nests
    when the sum then runs as a packed GEMM: the sum stored into ``out`` itself, ``v`` being
    ``out[I]`` throughout, then ``for P: out[I] := f(out[I])``, the epilogue (``None`` when ``f``
    is the sum itself). ``None`` when the nest is not such a product.

    The inlined form runs as a GEMM only while its terms fit one ``kc`` panel (:func:`plan_gemm`),
    and even then the split measured faster (a transformer's feed-forward products with their
    bias, the benchmark's MLP steps: ``python -m bench.cpu_steps``): the extra pass over the
    result costs less than the epilogue inside the micro-kernel's stores.

    Each cell's sum adds the same terms in the same order into a cell of the local's own type, so
    storing it loses nothing, and ``f`` reads it back: the bits of the inlined form. Hence the
    requirements: ``out`` stores the local's type exactly (float32 into float32), each cell is
    owned by one iteration of ``P``, and neither ``f`` nor the sum reads ``out`` otherwise."""
    plan = plan or plan_contraction(loop, vector_bytes)  # ``plan``: the caller's, already made
    if plan is None or plan.scope is None:
        return None
    split = _sum_then_epilogue(loop, plan.store, plan.scope, plan.parallel)
    if split is None:
        return None
    reduction_plan = plan_contraction(split[0], vector_bytes)
    return split if reduction_plan is not None and reduction_plan.gemm is not None else None


def small_sum_with_epilogue(loop: For, vector_bytes: int | None) -> tuple[For, For | None] | None:
    """A sum inlined into its consumer that is too small for register tiles (below
    :data:`TILE_MIN_WORK`), as the two nests of :func:`gemm_with_epilogue`: the sum into the
    consumer's cells, then the consumer over them. Inlined, each cell's sum runs in a local inside
    the loops over the cells, which the C compiler leaves scalar; as a nest of its own it
    vectorizes across the cells, as a product stored in its own node did before the optimizer
    inlined it. In the moons demo's step (10 x 16 x 16 products), relu's input gradient (the
    product of the next layer's weight and gradient, under relu's gate) took 1.54 us inlined,
    0.14-0.18 us split, and the step 1.50 us rather than 3.0 (Zen 4)."""
    found = reduction_of(loop)
    if found is None or found.scope is None or not found.separable or found.parallel != found.around:
        return None
    split = _sum_then_epilogue(loop, found.store, found.scope, tuple((f.symbol, f.extent) for f in found.parallel))
    return split if split is not None and plan_contraction(split[0], vector_bytes) is None else None


def _sum_then_epilogue(loop: For, store: Store, scope: LocalScope, parallel: Loops) -> tuple[For, For | None] | None:
    """The two nests of :func:`gemm_with_epilogue` for the sum ``scope`` inlined into ``store``
    inside ``loop`` (``parallel``: the loops owning the cells), when the split keeps the bits."""
    out, v = store.tnode, scope.local
    if out.dtype is not v.dtype or parallel != tuple((f.symbol, f.extent) for f in loop_chain(loop)[0]):
        return None
    if any(isinstance(e, (Load, LoadDynamic)) and e.tnode is out for s in iter_stmts(loop) for top in stmt_exprs(s)
           for e in iter_exprs(top)):
        return None
    cell = Load(out, store.indices)
    first = (scope.body.stmts if isinstance(scope.body, Seq) else (scope.body,))[0]
    starts_from_constant = isinstance(first, SetLocal) and first.local is v and isinstance(first.value, Const)
    start = () if starts_from_constant else (Store(out, store.indices, Const(0.0, v.dtype)),)  # the scope's 0
    sum_into_cell = seq(*start, _LocalAsCell(v, cell).stmt(scope.body))
    chain, _ = loop_chain(loop)
    reduction = _nest(chain, sum_into_cell)
    if not isinstance(reduction, For):
        return None
    if store.value is scope:
        return reduction, None
    epilogue = FreshCopy({}).stmt(_nest(chain, Store(out, store.indices, _ScopeAsCell(scope, cell).expr(store.value))))
    return reduction, epilogue


def _nest(chain: list[For], body: Stmt) -> Stmt:
    """``body`` inside copies of the loops of ``chain``, outermost first."""
    for f in reversed(chain):
        body = replace(f, body=body)
    return body


class _LocalAsCell(Rewriter):
    """The statements of a local scope with its variable ``local`` held in ``cell`` instead."""

    def __init__(self, local: Local, cell: Load):
        self.local, self.cell = local, cell

    def stmt(self, s: Stmt) -> Stmt:
        if isinstance(s, SetLocal) and s.local is self.local:
            return Store(self.cell.tnode, self.cell.indices, self.expr(s.value))
        return self.rebuild_stmt(s)

    def expr(self, e: Expr) -> Expr:
        if isinstance(e, GetLocal) and e.local is self.local:
            return self.cell
        return self.rebuild_expr(e)


class _ScopeAsCell(Rewriter):
    """An expression with the local scope ``scope`` replaced by a read of ``cell``."""

    def __init__(self, scope: LocalScope, cell: Load):
        self.scope, self.cell = scope, cell

    def expr(self, e: Expr) -> Expr:
        return self.cell if e is self.scope else self.rebuild_expr(e)


@dataclass(frozen=True)
class TopLevelPlan:
    """How the C walk prints one top-level statement ``stmt`` of a routine
    (``CTarget.statements``, ``ocannl/backends/c/target.py``), decided by :func:`plan_top_level`.

    ``kind``: ``"split"``, a GEMM-class product inlined into its consumer, printed as the plans
    ``parts`` (the product as a packed GEMM, then its consumer, :func:`gemm_with_epilogue`);
    ``"function"``, a loop nest that uses no local of the code around it, printed as a helper
    function of its own (the C compiler optimizes many short functions faster than one long one);
    ``"inline"``, printed in place (a contraction prints its own function). ``nest``: the plan of a
    loop nest printed in place or as a function (``None``: a split, or a statement that is no
    loop)."""

    stmt: Stmt
    kind: Literal["split", "function", "inline"]
    nest: NestPlan | None = None
    parts: tuple[TopLevelPlan, ...] = ()


def plan_top_level(stmt: Stmt, vector_bytes: int | None, threads: bool) -> TopLevelPlan:
    """The :class:`TopLevelPlan` of ``stmt``; ``vector_bytes`` and ``threads`` as for
    :func:`plan_nest` (``vector_bytes`` not ``None``: products may run as packed GEMMs)."""
    if not isinstance(stmt, For):
        return TopLevelPlan(stmt, "inline")
    nest = plan_nest(stmt, vector_bytes, threads)
    contraction = nest.contraction
    if vector_bytes is None:
        split = None
    elif contraction is not None:
        split = gemm_with_epilogue(stmt, vector_bytes, contraction)
    else:
        split = small_sum_with_epilogue(stmt, vector_bytes)
    if split is not None:
        parts = tuple(plan_top_level(part, vector_bytes, threads) for part in split if part is not None)
        return TopLevelPlan(stmt, "split", parts=parts)
    if contraction is None and _self_contained(stmt):
        return TopLevelPlan(stmt, "function", nest)
    return TopLevelPlan(stmt, "inline", nest)


PART_CUT_RADIUS = 8
"""A long routine's parts (:func:`plan_parts`) end after a statement whose fingerprint is the
smallest of the statements within this many of it on each side: about one statement in 9 to 17
of a routine of distinct statements."""

PART_STATEMENTS_MIN, PART_STATEMENTS_MAX = 4, 48
"""The fewest statements a part ends at a fingerprint with, and the most it holds: bounds on the
calls of parts (each is a function the C compiler optimizes alone, and a call the routine's
function makes) and on the length of one."""


def plan_parts(fingerprints: Sequence[int]) -> tuple[range, ...]:
    """Where a long routine's parts begin and end (``CTarget.body``, ``ocannl/backends/c/target.py``),
    given each top-level statement's fingerprint (``ocannl/lowlevel/structure.py``): a part ends
    after a statement whose fingerprint is smaller than those of the :data:`PART_CUT_RADIUS`
    statements before it and no larger than those of as many after it (a local minimum, the
    first of equal ones), once the part holds :data:`PART_STATEMENTS_MIN` statements; and at
    :data:`PART_STATEMENTS_MAX` statements.

    Whether a statement ends a part depends on the statements around it only, not on where the
    routine starts nor where the last part ended: every repetition of a deep network's block is
    cut at the same statements (all but those within the radius of its ends), so its parts have
    the same structure and the C target prints each of them once. Parts of a fixed length would
    start in another place of each block whenever the block's length is no multiple of it, and
    no two would be alike; cuts at fingerprints of a fixed residue miss a whole block often
    enough (a block of 15 distinct statements has none that is a multiple of 16 once in three),
    and its parts are then cut by length, in another place each time."""
    radius = PART_CUT_RADIUS
    parts: list[range] = []
    start = 0
    for k, fp in enumerate(fingerprints):
        length = k + 1 - start
        ends = length >= PART_STATEMENTS_MIN and _local_minimum(fingerprints, k, radius)
        if ends or length >= PART_STATEMENTS_MAX:
            parts.append(range(start, k + 1))
            start = k + 1
    if start < len(fingerprints):
        parts.append(range(start, len(fingerprints)))
    return tuple(parts)


def _local_minimum(values: Sequence[int], k: int, radius: int) -> bool:
    """Whether ``values[k]`` is below the ``radius`` values before it and not above as many after."""
    v = values[k]
    return (all(v < x for x in values[max(0, k - radius):k])
            and all(v <= x for x in values[k + 1:k + 1 + radius]))


def _self_contained(stmt: Stmt) -> bool:
    """Whether every local ``stmt`` uses is declared inside it (it can move into a function)."""
    return locals_read(stmt) | locals_written(stmt) <= locals_bound(stmt)
