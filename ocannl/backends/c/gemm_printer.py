"""The loops of the C backend's packed GEMM around its micro-kernels (``gemm.py``): a
:class:`~ocannl.lowlevel.cpu_schedule.GemmPlan` printed as BLIS's loop nest cut into units of
work (docs/codegen.md, "Packed GEMM"). The C target (``target.py``) calls :func:`print_gemm`
through :class:`~ocannl.backends.c.gemm.CGemm` for a contraction its
:class:`~ocannl.lowlevel.cpu_schedule.NestPlan` runs packed; every size and the thread decision
come from the plan.

A unit of work is ``nc`` columns by a share of the rows (all of them on one thread), for each
iteration of the loops around the GEMM (a batch). A unit packs the panel of B of each ``kc``
panel of the reduction, in order, then for each ``mc`` of its rows the block of A, and runs the
micro-kernel over the block's tiles. Threads take units as they finish others and never wait for
each other (a core that another process slows down does fewer units); a cell is computed by one
unit, its panels in order, so the result does not depend on the threads. Operands are read
through their loads as the loop IR writes them (any strides: a transposed operand is packed as
it is read). Each thread takes its packing buffers from the heap (up to hundreds of KiB: a
caller's thread may have a small stack); when that fails the routine reports it as a failed
check, and the thread computes no unit. A reset of the cells is the micro-kernel's start on the
first panel (``fresh``, ``gemm.py``). On that panel the cells of each block's next tile are
asked for (``__builtin_prefetch``, for writing) while the micro-kernel computes the current one.

A product the plan runs in shared loops (:attr:`~ocannl.lowlevel.cpu_schedule.GemmPlan.shared`)
prints as a call of the loops its tile shape shares with the source's other such products
(``gemm.shared_loops``, which do the same in C with the sizes and strides the call names).
"""

from __future__ import annotations

import math

from typing import TYPE_CHECKING, Callable

from ocannl.backends.c.cells import cell_start, reset_value
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.cpu_schedule import ContractionPlan, GemmPlan, Loops, Packing, Strides
from ocannl.lowlevel.identifiers import comment_text
from ocannl.lowlevel.ir import Binary, Load, format_expr, format_stmt
from ocannl.lowlevel.scalar_ops import Binop

if TYPE_CHECKING:
    from ocannl.backends.c.gemm import CGemm
    from ocannl.backends.codegen import Emitter


def print_gemm(emitter: Emitter, target: CGemm, plan: ContractionPlan) -> None:
    """Prints ``plan`` (its :attr:`~ContractionPlan.gemm` set) through ``emitter``: a comment
    naming the product, then the parallel region (or block) of its units of work."""
    _GemmPrinter(emitter, target, plan).print()


def gemm_comment(emitter: Emitter, plan: ContractionPlan) -> str:
    """The comment before a packed GEMM: the product it computes, its tiles and blocks."""
    g, store, namer = plan.gemm, plan.store, emitter.namer
    term = format_expr(Binary(Binop.MUL, *((g.a, g.b) if g.a_first else (g.b, g.a))), namer)
    terms = ", ".join(f"{namer.symbol(s)} < {n}" for s, n in g.k)
    cell = format_expr(Load(store.tnode, store.indices), namer)
    what = f"{cell} := {cell} + sum of {term} over {terms}"
    if plan.scope is not None:
        consumer = format_stmt(store, namer).rstrip(";")
        what = f"{consumer}, where {namer.local(plan.scope.local)} sums {term} over {terms}"
    order = (f"each block of {g.block} terms sums from zero, then adds to the cell */" if g.block
             else "each cell sums in loop order */")
    return (f"/* {comment_text(what)}, as a packed GEMM: {g.mr}x{g.nr} micro-kernel, "
            f"cache blocks mc x kc x nc = {g.mc} x {g.kc} x {g.nc}; " + order)


def _minimum(a: str, b: str) -> str:
    return f"{a} < {b} ? {a} : {b}"


def _order(packing: Packing) -> str:
    """How a strip is packed, for its comment."""
    return "k after k" if packing.k_block is None else f"{packing.k_block} terms of each at a time"


def _digits(loops: Loops, flat: str, linear: bool = False) -> dict:
    """The walk's texts of ``loops`` as the row-major digits of the flat index ``flat``;
    ``linear``: for an access whose offset is linear in that flat index (:class:`Packing`), the
    last loop as the flat index and the others as nothing."""
    if linear:
        return {s: (flat, 0) if position == len(loops) - 1 else (None, 0) for position, (s, _) in enumerate(loops)}
    texts = {}
    stride = 1
    for position, (s, n) in reversed(list(enumerate(loops))):
        if len(loops) == 1:
            text = flat
        elif stride == 1:
            text = f"({flat} % {n})"
        elif position == 0:
            text = f"({flat} / {stride})"
        else:
            text = f"({flat} / {stride} % {n})"
        texts[s] = (text, 0)
        stride *= n
    return texts


class _GemmPrinter:
    """The sizes of one packed GEMM, clipped to its product, and the printing of its loops."""

    def __init__(self, emitter: Emitter, target: CGemm, plan: ContractionPlan):
        g: GemmPlan = plan.gemm
        self.e, self.target, self.plan, self.g = emitter, target, plan, g
        self.it = emitter.syntax.index_type
        self.m, self.n, self.n_k = g.m, g.n, g.depth
        self.kc, self.nc = min(g.kc, self.n_k), min(g.nc, -(-self.n // g.nr) * g.nr)
        self.mc = min(g.mc, -(-self.m // g.mr) * g.mr)
        self.kernel = target.kernel_name(g.kernel)
        syn = emitter.syntax
        self.zero, self.real = syn.literal(0.0, dtypes.float32), syn.compute_type(dtypes.float32)
        self.resets = plan.reset is not None and plan.scope is None
        # The micro-kernel's fresh and start arguments: the cells' reset on the first panel.
        self.fresh, self.start = ("_pc == 0", reset_value(emitter, plan)) if self.resets else ("0", self.zero)
        # The packed panel of B, then the block of A, which starts 64-byte aligned; nothing for an
        # operand the micro-kernel reads in place.
        self.panel_b = 0 if g.b_packing.in_place else -(-self.kc * self.nc // 16) * 16
        self.block_a = 0 if g.a_packing.in_place else self.mc * self.kc
        self.buffers = self.panel_b + self.block_a > 0
        self.loops = [f"for ({self.it} {s} = 0; {s} < {extent}; ++{s})"
                      for s, extent in ((emitter.namer.symbol(s), extent) for s, extent in g.outer)]
        self.loops += [f"for ({self.it} _jc = 0; _jc < {self.n}; _jc += _nb)",
                       f"for ({self.it} _iu = 0; _iu < {self.m}; _iu += _mu)"]

    def print(self) -> None:
        g, e = self.g, self.e
        e.line(gemm_comment(e, self.plan))
        # The message names the product by its sizes, not by its statement: the products of a
        # deep network's repeated blocks then share one check, and the C target prints the
        # parts of the routine holding them once (``target.py``, ``helper``).
        site = e.site("memory", f"no memory for a thread's packing buffers ({(self.panel_b + self.block_a) * 4} "
                                f"bytes) of a {self.m}x{self.n_k} by {self.n_k}x{self.n} product") if self.buffers else None
        if g.shared is not None:
            self.shared_call(site)
            return
        with e.known_extents(dict((*g.rows, *g.cols, *g.k, *g.outer))):
            self.block("", lambda: self.region(site), self.target.parallel_region if g.parallel else None)

    def shared_call(self, site: int | None) -> None:
        """The call of the loops the product's tile shape shares (``cpu_schedule.SharedLoops``),
        naming each of its addresses, strides and sizes."""
        g, e, shared = self.g, self.e, self.g.shared
        places = (("a", shared.a, shared.a_plus_zero, g.a_packing), ("b", shared.b, shared.b_plus_zero, g.b_packing))

        def triple(values, pad: int = 0) -> str:  # one value per loop around the products
            return "{" + ", ".join(str(v) for v in (*values, *(pad,) * (3 - len(values)))) + "}"

        def address(strides: Strides) -> str:
            return e.nodes[strides.node] + (f" + {strides.offset}" if strides.offset else "")

        minus_zero, plus_zero = e.syntax.literal(-0.0, dtypes.float32), self.zero
        fields = [f".{side} = {address(strides)}, .{side}_outer = {triple(strides.outer)}, "
                  f".{side}_along = {strides.along}, .{side}_k = {strides.k}, "
                  f".{side}_plus = {plus_zero if zero else minus_zero}, "
                  f".{side}_k_block = {int(packing.k_block is not None)}, "
                  f".{side}_in_place = {int(packing.in_place is not None)},"
                  for side, strides, zero, packing in places]
        fields += [
            f".c = {address(shared.c)}, .c_outer = {triple(shared.c.outer)}, "
            f".c_rows = {shared.c.along}, .c_cols = {shared.c.k},",
            f".outer = {triple([n for _, n in g.outer], pad=1)}, .m = {self.m}, .n = {self.n}, "
            f".depth = {self.n_k}, .mc = {self.mc}, .kc = {self.kc}, .nc = {self.nc},",
            f".fresh = {int(self.resets)}, .start = {self.start}, .parallel = {int(g.parallel)}, "
            f".site = {site or 0}}}, _status);",
        ]
        e.line(f"{self.target.loops_name(g.mr, g.nr)}({self.kernel}, &(const {self.target.args_type}){{")
        with e.indented():
            with e.indented():
                for line in fields:
                    e.line(line)

    def block(self, header: str, body: Callable[[], None], pragma: str | None = None) -> None:
        if pragma:
            self.e.line(pragma)
        self.e.line(f"{header} {{" if header else "{")
        with self.e.indented():
            body()
        self.e.line("}")

    def region(self, site: int | None) -> None:
        """What every thread runs: its buffers (none when both operands are read in place), its
        share of the units, their loops."""
        e, it = self.e, self.it
        if self.buffers:
            e.line(f"/* this thread's {', then its '.join(self.packed())} */")
            e.line(self.target.allocate("_pb", self.panel_b + self.block_a))
            e.line(f"if (!_pb) {self.target.report(site)}")
        if self.g.parallel:
            self.thread_shares()
        else:
            e.line(f"const {it} _mu = {self.m}, _nb = {self.nc};")
        self.units()
        if self.buffers:
            e.line(self.target.release("_pb"))

    def packed(self) -> list[str]:
        """The packing buffers a thread needs, for their comment."""
        buffers = (("packed panel of B", self.panel_b), ("packed block of A", self.block_a))
        return [what for what, size in buffers if size]

    def thread_shares(self) -> None:
        """The units, ``_mu`` rows by ``_nb`` columns, as ``ocannl_gemm_shares`` (``gemm.shares``,
        which the shared loops call too) cuts them: two per thread, row shares by column shares. A unit packs
        the rows of the left operand in its share and the columns of the right one in its, so
        the operands are packed ``_cu * m + _ru * n`` values per term in all: the split that packs
        least (all columns to a unit when the rows are few, as in a batch of 64 against 256
        columns; halves of each for a square). A batch of products shares its units out by
        product first: attention's 64 products of 64 x 64 cells, split in four units each on two
        threads, packed every operand twice, and ran slower than on one (the scores of a 16 x 4
        batch of heads: 0.45 ms on one thread, 0.67 on two)."""
        e, it, g = self.e, self.it, self.g
        for line in self.target.thread_count("_nt"):
            e.line(line, indent=not line.startswith("#"))  # preprocessor lines start in the first column
        products = math.prod(extent for _, extent in g.outer)
        e.line(f"{it} _mu, _nb;")
        sizes = f"{self.m}, {self.n}, {products}, _nt, {g.mr}, {g.nr}, {self.nc}"
        e.line(f"{self.target.shares_name}({sizes}, &_mu, &_nb);")
        e.line("/* units of columns and rows, each packing its own panels; no thread waits for another */")
        e.line(self.target.work_shared_for(len(self.loops)))

    def units(self, depth: int = 0) -> None:
        if depth < len(self.loops):
            self.block(self.loops[depth], lambda: self.units(depth + 1))
            return
        e, it = self.e, self.it
        if self.buffers:
            e.line("if (!_pb) continue;  /* no buffers: the failure is reported */")
        if self.block_a:
            e.line(f"{self.real} *const _pa = _pb + {self.panel_b};")
        e.line(f"const {it} _nc = {_minimum(f'{self.n} - _jc', '_nb')}, _mend = {_minimum('_iu + _mu', str(self.m))};")
        self.block(f"for ({it} _pc = 0; _pc < {self.n_k}; _pc += {self.kc})", self.panel)

    def panel(self) -> None:
        """One ``kc`` panel of the reduction: its panel of B packed, then each block of rows."""
        e, it, nr = self.e, self.it, self.g.nr
        e.line(f"const {it} _kc = {_minimum(f'{self.n_k} - _pc', str(self.kc))};")
        if self.panel_b:
            e.line(f"/* pack B: the panel's columns in strips of {nr}, {_order(self.g.b_packing)} */")
            self.strips("_pb", "_jr", "_jc", "_nc", "_w", self.g.b, nr, self.g.cols, self.g.b_packing)
        self.block(f"for ({it} _ic = _iu; _ic < _mend; _ic += {self.mc})", self.tiles)

    def tiles(self) -> None:
        """One ``mc`` block of rows: its block of A packed, then the micro-kernel over its tiles."""
        e, it, mr, nr = self.e, self.it, self.g.mr, self.g.nr
        e.line(f"const {it} _mcc = {_minimum('_mend - _ic', str(self.mc))};")
        if self.block_a:
            e.line(f"/* pack A: the block's rows in strips of {mr}, {_order(self.g.a_packing)} */")
            self.strips("_pa", "_ir", "_ic", "_mcc", "_h", self.g.a, mr, self.g.rows, self.g.a_packing)
        e.line(f"/* the micro-kernel over the block's {mr}x{nr} tiles */")
        self.block(f"for ({it} _jr = 0; _jr < _nc; _jr += {nr})",
                   lambda: self.block(f"for ({it} _ir = 0; _ir < _mcc; _ir += {mr})", self.tile))

    def strips(self, buffer: str, offset: str, first: str, count: str, span: str, factor: Load, width: int,
               along: Loops, packing: Packing) -> None:
        """Packs ``count`` rows or columns of ``factor`` from ``first`` on (the flat index of the
        loops ``along``) into ``buffer``, in strips of ``width`` (the loop variable ``offset``;
        ``span``: the strip's rows or columns, fewer at the edge), as ``packing`` says."""
        e, it = self.e, self.it

        def strip() -> None:
            e.line(f"{self.real} *_strip = {buffer} + {offset}*_kc;")
            e.line(f"const {it} _start = {first} + {offset}, {span} = {_minimum(f'{count} - {offset}', str(width))};")
            self.pack("_strip", factor, width, span, along, packing)

        self.block(f"for ({it} {offset} = 0; {offset} < {count}; {offset} += {width})", strip)

    def pack(self, buffer: str, factor: Load, width: int, span: str, along: Loops, packing: Packing) -> None:
        """``buffer[k*width + q] = factor`` at the flat index ``start + q`` of the loops
        ``along`` for ``q < span`` and the ``k`` of the panel, zero for ``span <= q < width``: one
        packed strip. Written in order (``k`` outside, ``q`` inside), or, for an operand
        contiguous along ``k`` (``packing.k_block``), a block of ``k`` at a time and each of the
        strip's rows or columns along it inside. The inner loop has a constant trip count, which
        the compiler unrolls or vectorizes."""
        e, it = self.e, self.it
        texts = {**_digits(along, "_at", packing.flat_along), **_digits(self.g.k, "_kk", packing.flat_k)}
        with e.symbol_texts(texts):
            def cell() -> None:
                e.line(f"const {it} _at = _start + _q, _kk = _pc + _k;")
                e.line(f"{buffer}[{width}*_k + _q] = {e.expr(factor)};")

            def strip(count: str) -> None:
                if packing.k_block is None:
                    self.block(f"for ({it} _k = 0; _k < _kc; ++_k)",
                               lambda: self.block(f"for ({it} _q = 0; _q < {count}; ++_q)", cell))
                    return
                block = packing.k_block
                self.block(f"for ({it} _k0 = 0; _k0 < _kc; _k0 += {block})", lambda: self.block(
                    f"for ({it} _q = 0; _q < {count}; ++_q)",
                    lambda: self.block(f"for ({it} _k = _k0; _k < _k0 + {block}; ++_k)", cell)))

            e.line(f"if ({span} == {width}) {{")
            with e.indented():
                strip(str(width))
            e.line("} else {")
            with e.indented():
                strip(span)
                padding = f"for ({it} _q = {span}; _q < {width}; ++_q) {buffer}[{width}*_k + _q] = {self.zero};"
                self.block(f"for ({it} _k = 0; _k < _kc; ++_k)", lambda: e.line(padding))
            e.line("}")

    def tile(self) -> None:
        """One micro-kernel call: into the result where the tile is whole and the result's
        columns are contiguous, else into a buffer whose cells are then stored one by one."""
        e, g, plan, it = self.e, self.g, self.plan, self.it
        out, idx = plan.store.tnode, plan.store.indices
        a = self.in_place(g.a, g.rows, "(_ic + _ir)") if g.a_packing.in_place else "_pa + _ir*_kc"
        b = self.in_place(g.b, g.cols, "(_jc + _jr)") if g.b_packing.in_place else "_pb + _jr*_kc"
        e.line(f"const {self.real} *_ap = {a}, *_bp = {b};")
        e.line(f"const {it} _h = {_minimum('_mcc - _ir', str(g.mr))}, _w = {_minimum('_nc - _jr', str(g.nr))};")
        direct = plan.scope is None and g.c_strides is not None and g.c_strides[1] == 1
        if direct:
            with e.symbol_texts({**_digits(g.rows, "(_ic + _ir)"), **_digits(g.cols, "(_jc + _jr)")}):
                corner = e.access(out, idx)
            self.prefetch_next_tile(f"&{corner}", g.c_strides[0])
            e.line(f"if (_h == {g.mr} && _w == {g.nr}) {{")
            with e.indented():
                e.line(f"{self.kernel}(_kc, _ap, _bp, &{corner}, {g.c_strides[0]}, {self.fresh}, {self.start});")
                e.line("continue;")
            e.line("}")
        e.line(f"/* {'an edge tile: its cells' if direct else 'the tile'} through a buffer */")
        e.line(f"{self.real} _t[{g.mr * g.nr}] = {{0}};")
        with e.symbol_texts({**_digits(g.rows, "(_ic + _ir + _r)"), **_digits(g.cols, "(_jc + _jr + _q)")}):
            self.tile_through_buffer()

    def prefetch_next_tile(self, corner: str, row_stride: int) -> None:
        """On the first panel, asks for the cells of the block's next tile (the next ``mr`` rows,
        else the next ``nr`` columns) while the micro-kernel computes this one: a result written
        fresh would otherwise wait on its lines one tile at a time (docs/codegen.md, "Packed
        GEMM"). ``corner``: the address of this tile's first cell."""
        e, it, mr, nr = self.e, self.it, self.g.mr, self.g.nr
        e.line("if (_pc == 0) {  /* the next tile's cells, while this one computes */")
        with e.indented():
            e.line(f"const {it} _ni = _ir + {mr} < _mcc ? _ir + {mr} : 0, _nj = _ir + {mr} < _mcc ? _jr : _jr + {nr};")
            e.line("if (_nj < _nc)")
            e.line(f"  for ({it} _r = 0; _r < {mr} && _ni + _r < _mcc; ++_r)")
            e.line(f"    __builtin_prefetch({corner} + {row_stride}*(_ni - _ir + _r) + (_nj - _jr), 1, 3);")
        e.line("}")

    def in_place(self, factor: Load, along: Loops, first: str) -> str:
        """The address of ``factor`` at the flat index ``first`` of the loops ``along`` and the
        panel's first term, where the micro-kernel reads an operand left unpacked."""
        texts = {**_digits(along, first, linear=True), **_digits(self.g.k, "_pc", linear=True)}
        with self.e.symbol_texts(texts):
            return f"&{self.e.access(factor.tnode, factor.indices)}"

    def tile_through_buffer(self) -> None:
        e, g, plan, it = self.e, self.g, self.plan, self.it
        out, idx, nr = plan.store.tnode, plan.store.indices, g.nr
        if plan.scope is not None:
            first = e.syntax.literal(plan.init.value if plan.init is not None else 0.0, dtypes.float32)
        else:
            first = cell_start(e, plan, "_pc == 0" if self.resets else None)
        cells = f"for ({it} _r = 0; _r < _h; ++_r) for ({it} _q = 0; _q < _w; ++_q)"
        e.line(f"{cells} _t[{nr}*_r + _q] = {first};")
        e.line(f"{self.kernel}(_kc, _ap, _bp, _t, {nr}, 0, {self.zero});")
        if plan.scope is None:
            e.line(f"{cells} {e.access(out, idx)} = {e.syntax.to_storage(out.dtype, f'_t[{nr}*_r + _q]')};")
            return
        with e.scope_value(plan.scope, f"_t[{nr}*_r + _q]"):
            self.block(cells, lambda: e.with_prelude(lambda: f"{e.access(out, idx)} = {e.stored(out, plan.store.value)};"))
