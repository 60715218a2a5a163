"""The C backend's register tiles: a contraction's
:class:`~ocannl.lowlevel.cpu_schedule.ContractionPlan` and its nests of tiles
(:class:`~ocannl.lowlevel.cpu_schedule.TileNest`) printed through the shared walk
(``ocannl/backends/codegen.py``) as accumulators in scalar variables, or in vectors where a nest's
``lanes`` says so (docs/codegen.md, "Vector tiles"). Every size, lane count and thread decision
comes from the plan; the printer decides nothing of it.

Each cell adds its terms in the interpreter's order, in a register of its own (a lane of a vector
is one cell), and a parallel loop's iterations write disjoint cells, so results do not depend on
the thread count. A reset of the cells (``out[I] := 0.0`` before the sum,
:attr:`~ocannl.lowlevel.cpu_schedule.ContractionPlan.reset`) prints no store: where the cell's
first step would read it back, the accumulator starts from the reset value instead
(``cells.reset_value``), so each cell is written once, at the end of its tile, and its bits are
those of the reset and the sum in their order.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator, Mapping

from ocannl.backends.c.cells import cell_start
from ocannl.backends.c.gemm import vector_type
from ocannl.backends.c_family import INFIX
from ocannl.backends.codegen import zero_value
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.analysis import affine_form, provably_within, row_major_strides
from ocannl.lowlevel.cpu_schedule import NestPlan, TileNest, vector_chain_load, vector_factors
from ocannl.lowlevel.identifiers import comment_text
from ocannl.lowlevel.indexing import Symbol, index_symbols
from ocannl.lowlevel.ir import Binary, Const, Expr, For, Load, LocalScope, Seq, SetLocal, Stmt, Unary, format_stmt
from ocannl.lowlevel.scalar_ops import Binop

if TYPE_CHECKING:
    from ocannl.backends.c.target import CTarget
    from ocannl.backends.codegen import Emitter

CellEnv = Callable[[int, int], Mapping[Symbol, tuple[str | None, int]]]
"""The symbol texts (``Emitter.symbol_texts``) of cell ``(r, q)`` of the tile being printed."""


def _vector_shape(cells: list[tuple[int, int]], lanes: int) -> tuple[int, int]:
    """The rows of a tile's ``cells`` and the vectors of ``lanes`` cells in each row."""
    return max(r for r, _ in cells) + 1, max(q for _, q in cells) // lanes + 1


class TilePrinter:
    """Prints one contraction that runs as register tiles (``nest.contraction``, its
    :attr:`~ocannl.lowlevel.cpu_schedule.ContractionPlan.gemm` unset) through ``emitter``;
    ``target`` declares the vector types its vector tiles use."""

    def __init__(self, emitter: Emitter, target: CTarget, nest: NestPlan):
        self.e, self.target, self.nest, self.plan = emitter, target, nest, nest.contraction
        self.it = emitter.syntax.index_type

    def print(self) -> None:
        plan = self.plan
        self.e.line(
            f"/* {comment_text(format_stmt(plan.store, self.e.namer))} in {plan.mr}x{plan.nr} register tiles; "
            + ("each block of terms sums from zero, then adds to the cell */" if plan.blocks is not None
               else "each cell sums in loop order */")
        )
        if plan.blocks is not None:
            self._block_contraction(self.nest.tile_nests)
        else:
            self._loop_order_contraction(self.nest.tile_nests[0])

    @contextmanager
    def _blocks(self, headers: list[str], extents: Mapping[Symbol, int] | None = None) -> Iterator[None]:
        """Prints ``headers``, each opening a block inside the previous one; lines printed
        inside go in the innermost, where the loop symbols of ``extents`` are known to stay below
        them; then closes the blocks."""
        e = self.e
        depth = e.scope.depth
        for k, header in enumerate(headers):
            e.line("  " * k + header)
        with e.entering(e.scope.replace(depth=depth + len(headers))), e.known_extents(extents or {}):
            yield
        for k in reversed(range(len(headers))):
            e.line("  " * k + "}")

    def _block_contraction(self, groups: tuple[tuple[TileNest, ...], ...]) -> None:
        """The tiles of a reduction in blocks: the outermost loop of each top-level statement
        of ``plan.blocks`` runs around the tiles (a block of operands stays in cache while every
        tile uses it), the rest inside them (:meth:`_tile_blocks`). ``groups``: the nests of
        tiles of each top-level statement (``NestPlan.tile_nests``)."""
        plan = self.plan
        if plan.scope is not None:  # the sum lives in the tile's registers until the cell's store
            for tiles in groups[0]:
                self._tile_nest(tiles, plan.blocks)
            return
        tops = plan.blocks.stmts if isinstance(plan.blocks, Seq) else (plan.blocks,)
        for n_top, (top, group) in enumerate(zip(tops, groups, strict=True)):
            # The conditions under which a leaf adds the cell's first block (None: never).
            fresh: tuple[str, ...] | None = () if n_top == 0 and plan.reset is not None else None
            if not isinstance(top, For):
                for tiles in group:
                    self._tile_nest(tiles, top, fresh)
                continue
            var = self.e.namer.symbol(top.symbol)
            with self._blocks([f"for ({self.it} {var} = 0; {var} < {top.extent}; ++{var}) {{"],
                              {top.symbol: top.extent}):
                for tiles in group:
                    self._tile_nest(tiles, top.body, None if fresh is None else (f"{var} == 0",))

    def _loop_order_contraction(self, group: tuple[TileNest, ...]) -> None:
        """The tiles of a reduction in loop order (the nests of ``group``), its first loop in
        cache blocks of ``plan.block`` steps."""
        plan, it = self.plan, self.it
        first, first_extent = plan.reductions[0]
        k = self.e.namer.symbol(first)
        if plan.block is None:
            for tiles in group:
                self._tile_nest(tiles)
            return
        with self._blocks([f"for ({it} _{k} = 0; _{k} < {first_extent}; _{k} += {plan.block}) {{"]):
            if first_extent % plan.block:
                self.e.line(
                    f"const {it} _end_{k} = _{k} + {plan.block} < {first_extent} ? _{k} + {plan.block} : {first_extent};"
                )
            for tiles in group:
                self._tile_nest(tiles)

    def _tile_nest(self, tiles: TileNest, blocks: Stmt | None = None, fresh: tuple[str, ...] | None = None) -> None:
        """One nest of equal tiles (``tiles``, on threads where it says so); ``blocks``: the part
        of ``plan.blocks`` each tile runs, ``fresh`` the conditions under which its first leaf
        adds the cell's first block (:meth:`_tile_blocks`)."""
        e, plan, it = self.e, self.plan, self.it
        loops: list[str] = []
        env: dict[Symbol, tuple[str | None, int]] = {}
        extents = dict(plan.outer)
        for s, n in plan.parallel:
            if any(s is o for o, _ in plan.outer):
                var = e.namer.symbol(s)
                loops.append(f"for ({it} {var} = 0; {var} < {n}; ++{var}) {{")
        for axis, span in ((plan.rows, tiles.rows), (plan.cols, tiles.cols)):
            if axis is None:
                continue
            s, n = axis
            extents[s] = n
            if span.looped:
                base = f"_{e.namer.symbol(s)}"
                loops.append(f"for ({it} {base} = 0; {base} < {span.stop}; {base} += {span.size}) {{")
                env[s] = (base, 0)
            else:
                env[s] = (None, span.start)
        pragma = e.syntax.parallel_for(len(loops)) if tiles.parallel else None
        if pragma:
            e.line(pragma)
        cells = [(r, q) for r in range(tiles.rows.size) for q in range(tiles.cols.size)]

        def cell_env(r: int, q: int) -> dict[Symbol, tuple[str | None, int]]:
            cell = dict(env)
            for axis, offset in ((plan.rows, r), (plan.cols, q)):
                if axis is not None:
                    base, start = env[axis[0]]
                    cell[axis[0]] = (base, start + offset)
            return cell

        lanes = tiles.lanes
        with self._blocks(loops or ["{"], extents):
            if lanes:
                self.target.declare_vector_type(lanes)
            if blocks is not None and plan.scope is not None:
                dtype = plan.accumulator_dtype
                first = e.syntax.literal(plan.init.value if plan.init else zero_value(dtype), dtype)
                for r, q in cells:
                    e.line(f"{e.syntax.compute_type(dtype)} _c{r}_{q} = {first};")
                self._tile_blocks(blocks, cells, cell_env, lanes=lanes)
                out, idx = plan.store.tnode, plan.store.indices
                for r, q in cells:
                    with e.symbol_texts(cell_env(r, q)), e.scope_value(plan.scope, f"_c{r}_{q}"):
                        e.line(f"{e.access(out, idx)} = {e.stored(out, plan.store.value)};")
            elif blocks is not None:
                self._tile_blocks(blocks, cells, cell_env, fresh, lanes=lanes)
            else:
                self._tile_loop_order(cells, cell_env, lanes)

    def _tile_loop_order(self, cells: list[tuple[int, int]], cell_env: CellEnv, lanes: int | None = None) -> None:
        """A tile's cells accumulated in registers from their first value, in loop order (in
        vectors of ``lanes`` cells of a row when set, ``cpu_schedule.tile_lanes``)."""
        e, plan, it = self.e, self.plan, self.it
        out, idx = plan.store.tnode, plan.store.indices
        acc_dtype = plan.accumulator_dtype
        ctype = e.syntax.compute_type(acc_dtype)

        def acc(r: int, q: int) -> str:
            return f"_c{r}_{q}"

        fresh = None  # the condition under which the cells hold no value yet ("": always)
        if plan.scope is None and plan.reset is not None:
            fresh = "" if plan.block is None else f"_{e.namer.symbol(plan.reductions[0][0])} == 0"
        for r, q in cells:
            with e.symbol_texts(cell_env(r, q)):
                if plan.scope is not None:
                    first = e.syntax.literal(plan.init.value if plan.init else zero_value(acc_dtype), acc_dtype)
                else:
                    first = cell_start(e, plan, fresh)
                e.line(f"{ctype} {acc(r, q)} = {first};")
        if lanes:
            rows, nv = _vector_shape(cells, lanes)
            for r in range(rows):
                for v in range(nv):
                    firsts = ", ".join(acc(r, v * lanes + lane) for lane in range(lanes))
                    e.line(f"{vector_type(lanes)} _vc{r}_{v} = {{{firsts}}};")
        headers = []
        for n_loop, (s, n) in enumerate(plan.reductions):
            var = e.namer.symbol(s)
            if n_loop == 0 and plan.block is not None:
                end = f"_end_{var}" if n % plan.block else f"_{var} + {plan.block}"
                headers.append(f"for ({it} {var} = _{var}; {var} < {end}; ++{var}) {{")
            else:
                headers.append(f"for ({it} {var} = 0; {var} < {n}; ++{var}) {{")
        with self._blocks(headers, dict(plan.reductions)):
            if lanes:
                self._vector_step(plan.term, lambda r, v: f"_vc{r}_{v}", cells, cell_env, lanes)
            else:
                for r, q in cells:
                    with e.symbol_texts(cell_env(r, q)):
                        term = e.expr(plan.term)
                    value = e.syntax.binary(plan.op, acc_dtype, acc(r, q), term, branchless=e.scope.branchless)
                    if plan.scope is None and out.dtype.compute is not out.dtype:  # each step rounds, as a store
                        value = e.syntax.from_storage(out.dtype, e.syntax.to_storage(out.dtype, value))
                    e.line(f"{acc(r, q)} = {value};")
        if lanes:
            for r, q in cells:
                e.line(f"{acc(r, q)} = _vc{r}_{q // lanes}[{q % lanes}];")
        for r, q in cells:
            with e.symbol_texts(cell_env(r, q)):
                if plan.scope is not None:
                    with e.scope_value(plan.scope, acc(r, q)):
                        e.line(f"{e.access(out, idx)} = {e.stored(out, plan.store.value)};")
                else:
                    e.line(f"{e.access(out, idx)} = {e.syntax.to_storage(out.dtype, acc(r, q))};")

    def _tile_blocks(self, blocks: Stmt, cells: list[tuple[int, int]], cell_env: CellEnv,
                     fresh: tuple[str, ...] | None = None, lanes: int | None = None) -> None:
        """A tile's part of a reduction in blocks: loops as loops; at each leaf, every cell sums
        its block from zero in a register, then adds the block sum to the cell. ``fresh``: the
        conditions (all true) under which the leaf adds the cell's first block, which then
        starts from the reset value rather than from the cell (``None``: never)."""
        match blocks:
            case Seq(stmts=stmts):
                for n_stmt, x in enumerate(stmts):
                    self._tile_blocks(x, cells, cell_env, fresh if n_stmt == 0 else None, lanes)
                return
            case For(symbol=symbol, extent=n, body=body):
                inner = None if fresh is None else (*fresh, f"{self.e.namer.symbol(symbol)} == 0")
                self._block_loop(symbol, n, lambda: self._tile_blocks(body, cells, cell_env, inner, lanes))
                return
        block = blocks.value.b  # a leaf: the cell or the tile's accumulator += a block sum
        with self._blocks(["{"]):
            self._tile_leaf(block, cells, cell_env, fresh, lanes)

    def _tile_leaf(self, block: LocalScope, cells: list[tuple[int, int]], cell_env: CellEnv,
                   fresh: tuple[str, ...] | None, lanes: int | None) -> None:
        """A leaf of :meth:`_tile_blocks`: each cell's block ``block`` summed from zero, then added
        to the cell (or to the tile's accumulator of an inlined reduction)."""
        e, plan = self.e, self.plan
        out, idx, dtype = plan.store.tnode, plan.store.indices, block.local.dtype
        for r, q in cells:  # the cell is read before the block's loop: C compilers vectorize that
            with e.symbol_texts(cell_env(r, q)):
                start = f"_c{r}_{q}" if plan.scope is not None else cell_start(
                    e, plan, None if fresh is None else " && ".join(fresh))
            e.line(f"{e.syntax.compute_type(dtype)} _d{r}_{q} = {start};")
        if lanes:
            self._tile_block_sum_vector(block, cells, cell_env, lanes)
        else:
            self._tile_block_sum(block, cells, cell_env, 0)
        for r, q in cells:
            total = e.syntax.binary(Binop.ADD, dtype, f"_d{r}_{q}", f"_b0_{r}_{q}")
            if plan.scope is not None:
                e.line(f"_c{r}_{q} = {total};")
            else:
                with e.symbol_texts(cell_env(r, q)):
                    e.line(f"{e.access(out, idx)} = {e.syntax.to_storage(out.dtype, total)};")

    def _tile_block_sum(self, block: LocalScope, cells: list[tuple[int, int]], cell_env: CellEnv, level: int) -> None:
        """Each cell's sum of ``block`` from zero in the register ``_b<level>_<r>_<q>``: its loops
        as loops, its terms added in order, the sums of its own blocks (one level up) added as
        each is done."""
        e = self.e
        dtype = block.local.dtype
        zero = e.syntax.literal(zero_value(dtype), dtype)
        for r, q in cells:
            e.line(f"{e.syntax.compute_type(dtype)} _b{level}_{r}_{q} = {zero};")

        def walk(stmt: Stmt) -> None:
            match stmt:
                case Seq(stmts=stmts):
                    for x in stmts:
                        walk(x)
                case For(symbol=symbol, extent=n, body=body):
                    self._block_loop(symbol, n, lambda: walk(body))
                case SetLocal(value=Binary(b=LocalScope() as inner)):
                    with self._blocks(["{"]):
                        self._tile_block_sum(inner, cells, cell_env, level + 1)
                        for r, q in cells:
                            total = e.syntax.binary(Binop.ADD, dtype, f"_b{level}_{r}_{q}", f"_b{level + 1}_{r}_{q}")
                            e.line(f"_b{level}_{r}_{q} = {total};")
                case SetLocal(value=Binary(op=op, b=term)):
                    for r, q in cells:
                        with e.symbol_texts(cell_env(r, q)):
                            term_text = e.expr(term)
                        step = e.syntax.binary(op, dtype, f"_b{level}_{r}_{q}", term_text, branchless=e.scope.branchless)
                        e.line(f"_b{level}_{r}_{q} = {step};")

        walk(block.body)

    def _block_loop(self, symbol: Symbol, extent: int, body: Callable[[], None]) -> None:
        """A loop of a block's sum around what ``body`` prints, its extent known inside."""
        var = self.e.namer.symbol(symbol)
        with self._blocks([f"for ({self.it} {var} = 0; {var} < {extent}; ++{var}) {{"], {symbol: extent}):
            body()

    def _tile_block_sum_vector(self, block: LocalScope, cells: list[tuple[int, int]], cell_env: CellEnv,
                               lanes: int) -> None:
        """:meth:`_tile_block_sum` in vectors of ``lanes`` cells of a row (``cpu_schedule.tile_lanes``):
        the same sums lane by lane, each block of blocks summed from zero and added as it is
        done; the block's sums are then the scalars ``_b0_<r>_<q>`` the caller adds to the cells."""
        e = self.e
        rows, nv = _vector_shape(cells, lanes)
        vector = vector_type(lanes)

        def declare(level: int) -> None:
            for r in range(rows):
                for v in range(nv):
                    e.line(f"{vector} _vb{level}_{r}_{v} = {{0}};")

        def walk(stmt: Stmt, level: int) -> None:
            match stmt:
                case Seq(stmts=stmts):
                    for x in stmts:
                        walk(x, level)
                case For(symbol=symbol, extent=n, body=body):
                    self._block_loop(symbol, n, lambda: walk(body, level))
                case SetLocal(value=Binary(b=LocalScope() as inner)):
                    with self._blocks(["{"]):
                        declare(level + 1)
                        walk(inner.body, level + 1)
                        for r in range(rows):
                            for v in range(nv):
                                e.line(f"_vb{level}_{r}_{v} = _vb{level}_{r}_{v} + _vb{level + 1}_{r}_{v};")
                case SetLocal(value=Binary(b=term)):
                    self._vector_step(term, lambda r, v: f"_vb{level}_{r}_{v}", cells, cell_env, lanes)

        declare(0)
        walk(block.body, 0)
        dtype = e.syntax.compute_type(block.local.dtype)
        for r, q in cells:
            e.line(f"{dtype} _b0_{r}_{q} = _vb0_{r}_{q // lanes}[{q % lanes}];")

    def _vector_step(self, term: Expr, acc: Callable[[int, int], str], cells: list[tuple[int, int]],
                     cell_env: CellEnv, lanes: int) -> None:
        """One step of a vector tile (``cpu_schedule.tile_lanes``): each row's accumulators
        ``acc(r, v)`` (vector ``v`` of the row) add the row's term."""
        e, plan = self.e, self.plan
        row = plan.rows[0] if plan.rows is not None else None
        test, x, y, x_first, other = vector_factors(term, row, plan.cols[0])
        vector = vector_type(lanes)
        rows, nv = _vector_shape(cells, lanes)
        for v in range(nv):
            e.line(f"const {vector} _y{v} = {self._vector_load(y, plan.cols[0], v * lanes, lanes, cell_env)};")
        for r in range(rows):
            with e.symbol_texts(cell_env(r, 0)):
                factor = e.expr(x)
                condition = None
                if test is not None:
                    zero = e.syntax.literal(zero_value(test.dtype), test.dtype)
                    condition = f"({e.expr(test)} != {zero})"
            for v in range(nv):
                value = f"{factor} * _y{v}" if x_first else f"_y{v} * {factor}"
                if condition is not None:
                    k = e.syntax.literal(other, dtypes.float32)
                    value = f"({condition} ? {value} : ({vector}){{{', '.join([k] * lanes)}}})"
                e.line(f"{acc(r, v)} = {acc(r, v)} + {value};")

    def _vector_load(self, factor: Expr, col: Symbol, q0: int, lanes: int, cell_env: CellEnv) -> str:
        """The vector of ``factor`` (a load, or arithmetic of one with constants:
        ``cpu_schedule.vector_chain_load``) at the columns ``q0 ..< q0 + lanes`` of the tile: one
        load where the columns are adjacent in memory and no bounds test depends on them, the
        arithmetic done on the vector; else the lanes one by one."""
        e = self.e
        y = vector_chain_load(factor)
        strides = row_major_strides(y.tnode.dims)
        col_stride = sum(stride * c for idx, stride in zip(y.indices, strides)
                         for c, s in affine_form(idx)[0] if s is col)
        tested_cols = any(col in index_symbols(idx) and not provably_within(idx, d, e.scope.extents)
                          for idx, d in zip(y.indices, y.tnode.dims))
        vector = vector_type(lanes)
        if col_stride == 1 and not tested_cols:
            with e.symbol_texts(cell_env(0, q0)):
                address = e.access(y.tnode, y.indices, unchecked=y.oob_value is not None)
                conditions = e.bounds_conditions(y.tnode, y.indices) if y.oob_value is not None else ""
            load = f"*(const {vector_type(lanes, aligned=False)} *)&{address}"
            if conditions:
                outside = e.syntax.literal(y.oob_value, dtypes.float32)
                load = f"(({conditions}) ? {load} : ({vector}){{{', '.join([outside] * lanes)}}})"
            return self._on_vector(factor, y, load)
        return self._lanes(factor, q0, lanes, cell_env)

    def _on_vector(self, factor: Expr, load: Load, vector: str) -> str:
        """``factor`` with its load ``load`` read as the vector ``vector``: GCC's vector
        extensions broadcast the scalar constants."""
        if factor is load:
            return vector
        match factor:
            case Unary(x=x):
                return f"(-{self._on_vector(x, load, vector)})"
            case Binary(op=op, a=Const() as c, b=b):
                return f"({self.e.expr(c)} {INFIX[op]} {self._on_vector(b, load, vector)})"
            case Binary(op=op, a=a, b=c):
                return f"({self._on_vector(a, load, vector)} {INFIX[op]} {self.e.expr(c)})"
        raise AssertionError(f"not a vector chain: {factor}")

    def _lanes(self, y: Expr, q0: int, lanes: int, cell_env: CellEnv) -> str:
        """The vector of ``y`` at the columns ``q0 ..< q0 + lanes``, built lane by lane."""
        e, values = self.e, []
        for lane in range(lanes):
            with e.symbol_texts(cell_env(0, q0 + lane)):
                values.append(e.expr(y))
        return f"({vector_type(lanes)}){{{', '.join(values)}}}"
