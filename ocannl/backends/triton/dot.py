"""The writer of contraction kernels (plan.py: :class:`~ocannl.backends.triton.plan.DotPlan`);
the statements of the epilogue, stores and expressions are the base writers' (writer.py).

A *dot* kernel tiles a contraction's rows and columns (``rm``, ``rn``), loops over the reduction
in ``BLOCK_K`` steps with ``tl.dot`` (``input_precision="ieee"`` for float32 unless the
``triton_fp32_dot`` setting says ``tf32``/``tf32x3``), and runs the kernel's other statements
(its epilogue) on the ``[BLOCK_M, BLOCK_N]`` accumulator tile. With split-K (tiling.py), each
program sums one slice of the reduction and the last program of each tile adds the slices in
order before the epilogue (``KernelWriter.combine_slices``, writer.py).
"""

from __future__ import annotations

from ocannl.lowlevel import dtypes
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.indexing import Symbol
from ocannl.lowlevel.ir import Expr, For, Load, Store
from ocannl.lowlevel.scalar_ops import Binop
from ocannl.lowlevel.schedule import Contraction

from ocannl.backends.triton.plan import DotPlan
from ocannl.backends.triton.tile_expr import NAME_PATTERN, Val
from ocannl.backends.triton.writer import KernelWriter, Region, decompose


class DotKernelWriter(KernelWriter):
    """Tiles a contraction's rows and columns and sums over ``BLOCK_K`` steps with ``tl.dot``."""

    plan: DotPlan

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

    def is_contraction(self, s: For) -> bool:
        return s == self.kernel.contraction.site

    def loop(self, s: For, region: Region, deferred: tuple | None = None) -> None:
        if self.is_contraction(s):
            self.dot_loop(s, region)
        else:
            super().loop(s, region, deferred)

    def shape_for_axes(self, axes: frozenset[str]) -> str:
        return "[BLOCK_M, BLOCK_N]" if axes == {"m", "n"} else super().shape_for_axes(axes)

    def one_cell_shape(self) -> str:
        return "[1, 1]"

    def dot_loop(self, site: For, region: Region) -> None:
        """The contraction at ``site``: its accumulator's tile, then ``tl.dot`` over K tiles."""
        c: Contraction = self.kernel.contraction
        acc_stmt = c.update
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

    def combine_partials(self, acc: str, combine: Binop, dtype: DType, base: str, at: str, split: int,
                         tile_cells: int) -> None:
        """The slices' partial tiles added one after the other, in slice order."""
        self.line(f'{acc} = tl.load({base}{at}, cache_modifier=".cg")')
        s0 = self.names.word("s0")
        self.line(f"for {s0} in range(1, {split}):  # in slice order: the same result at every run")
        term = Val(f'tl.load({base} + {s0} * {tile_cells}{at}, cache_modifier=".cg")', frozenset({"m", "n"}), dtype)
        self.line(f"    {acc} = {self.apply(combine, Val(acc, term.axes, dtype), term)}")

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
