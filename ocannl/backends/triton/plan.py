"""What a Triton kernel will be, decided before any of its code is written: its tiling, block
sizes, grid and launch settings.

The partitioner (``ocannl/backends/partition.py``) says which statements share a kernel and
which loops are its grid; :func:`plan_kernel` turns one :class:`~ocannl.backends.partition.Kernel`
into a plan, plain data that tests and tools can read (how many programs a launch starts, which
kernels use ``tl.dot``) without generating text; the writers of emit.py render a plan.

* :class:`FillPlan`: whole-buffer fills, one flat tile of ``XBLOCK`` cells a program.
* :class:`FlatPlan`: the grid points flattened into ``XBLOCK`` tiles; inner loops (reductions,
  the rows of a softmax) in ``RBLOCK`` tiles when ``rblock`` is set.
* :class:`DotPlan`: a contraction's rows x columns in ``BLOCK_M x BLOCK_N`` tiles (times the
  batch), summed over ``BLOCK_K`` steps with ``tl.dot``.

Planning is pure: block sizes come from the table in tiling.py unless the caller passes a
contraction's. The autotuner (autotune.py: opt-in, on a GPU) is a pre-pass of
``TritonBackend.compile`` that plans a contraction with each candidate's blocks, measures the
written kernels and keeps the fastest plan; nothing here measures or writes code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterator

from ocannl.lowlevel import dtypes
from ocannl.lowlevel.analysis import loop_chain
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.ir import Expr, Fill, For, Load, Stmt, iter_stmts
from ocannl.lowlevel.tnode import TNode

from ocannl.backends.partition import Kernel
from ocannl.backends.triton import tiling
from ocannl.backends.triton.stages import accumulator_dtype, survey


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class _Launched:
    """What launching a plan's kernel takes from its blocks: ``num_warps``, and ``num_stages``
    (``None``: Triton's default; only a ``tl.dot`` loop is pipelined)."""

    blocks: tiling.FlatBlocks | tiling.DotBlocks

    @property
    def num_warps(self) -> int:
        return self.blocks.num_warps

    num_stages: int | None = None


@dataclass(frozen=True)
class FillPlan(_Launched):
    """Fills: ``fills`` (the last fill of each node), over ``numel`` cells at most."""

    fills: tuple[Fill, ...]
    numel: int
    blocks: tiling.FlatBlocks

    @property
    def grid(self) -> int:
        return _ceil_div(self.numel, self.blocks.xblock)


@dataclass(frozen=True)
class FlatPlan(_Launched):
    """A flat kernel over ``numel`` grid points (``0``: no grid axis, one program).

    With ``split > 1``, the kernel's first reduction over ``split_terms`` points is split into
    that many slices of :attr:`slice_terms` terms, the slices of one tile on neighbouring
    programs (tiling.py, "Split reductions")."""

    numel: int
    has_grid: bool
    blocks: tiling.FlatBlocks
    split: int = 1
    split_terms: int = 0

    @property
    def tiles(self) -> int:
        """Programs before any split: ``XBLOCK`` tiles of the grid, or one."""
        return _ceil_div(self.numel, self.blocks.xblock) if self.has_grid else 1

    @property
    def slice_terms(self) -> int:
        """Terms of the split reduction one program combines: a whole number of ``RBLOCK`` chunks."""
        return _ceil_div(_ceil_div(self.split_terms, self.split), self.blocks.rblock) * self.blocks.rblock

    @property
    def grid(self) -> int:
        return self.tiles * self.split

    @property
    def ragged(self) -> bool:
        """Whether the last program's tile runs past the grid (its lanes are masked)."""
        return self.numel % self.blocks.xblock != 0

    @property
    def rblock(self) -> int | None:
        return self.blocks.rblock


@dataclass(frozen=True)
class DotPlan(_Launched):
    """A contraction: row, column, batch and reduction extents (each a tuple of loop extents,
    flattened row-major), the tile sizes, and the 16-bit storage type both operands share
    (``None``: the operands are float32 tiles)."""

    rows: tuple[int, ...]
    cols: tuple[int, ...]
    batch: tuple[int, ...]
    k: tuple[int, ...]
    sixteen: DType | None
    blocks: tiling.DotBlocks

    @property
    def m(self) -> int:
        return math.prod(self.rows)

    @property
    def n(self) -> int:
        return math.prod(self.cols)

    @property
    def k_total(self) -> int:
        return math.prod(self.k)

    @property
    def row_tiles(self) -> int:
        return _ceil_div(self.m, self.blocks.block_m)

    @property
    def col_tiles(self) -> int:
        return _ceil_div(self.n, self.blocks.block_n)

    @property
    def tiles(self) -> int:
        """Output tiles of one batch entry."""
        return self.row_tiles * self.col_tiles

    @property
    def split_k(self) -> int:
        """Slices the reduction is split into (1: none): ``blocks.split_k`` slices of a whole
        number of ``BLOCK_K`` steps, fewer if rounding up the slices leaves the last ones empty."""
        return 1 if self.blocks.split_k == 1 else _ceil_div(self.k_total, self.k_slice)

    @property
    def k_slice(self) -> int:
        """Reduction terms one program sums: all of them, or one split-K slice's."""
        if self.blocks.split_k == 1:
            return self.k_total
        return _ceil_div(_ceil_div(self.k_total, self.blocks.split_k), self.blocks.block_k) * self.blocks.block_k

    @property
    def grid(self) -> int:
        return math.prod(self.batch) * self.tiles * self.split_k

    @property
    def k_ragged(self) -> bool:
        """Whether the last ``BLOCK_K`` step runs past the reduction (its lanes are masked)."""
        return self.k_total % self.blocks.block_k != 0

    @property
    def num_stages(self) -> int:
        return self.blocks.num_stages


Plan = FillPlan | FlatPlan | DotPlan


def plan_kernel(kernel: Kernel, dot_blocks: tiling.DotBlocks | None = None) -> Plan:
    """The plan of ``kernel``. ``dot_blocks`` are a contraction's blocks in place of the table's
    (a candidate of the autotuner). A flat kernel gets ``RBLOCK`` tiles only when its writer will
    tile an inner loop with them, and a split reduction only when that reduction comes first
    (stages.py, :func:`~ocannl.backends.triton.stages.survey`)."""
    if kernel.tiling == "fill":
        fills: dict[TNode, Fill] = {}
        for f in kernel.fills:
            fills.pop(f.tnode, None)
            fills[f.tnode] = f  # a later fill of the same node wins
        numel = max(cells(f.tnode) for f in fills.values())
        return FillPlan(tuple(fills.values()), numel, tiling.flat_blocks(numel, None))
    if kernel.tiling == "dot":
        c = kernel.contraction
        extent = dict(zip(kernel.parts[0].grid, kernel.extents))
        rows, cols = tuple(extent[s] for s in c.rows), tuple(extent[s] for s in c.cols)
        batch, k = tuple(extent[s] for s in c.batch), tuple(e for _, e in c.k)
        a16, b16 = sixteen_bit_load(c.a), sixteen_bit_load(c.b)
        sixteen = a16 if a16 is not None and a16 is b16 else None
        blocks = dot_blocks or tiling.dot_blocks(math.prod(rows), math.prod(cols), math.prod(k), sixteen is not None,
                                                 math.prod(batch))
        if blocks.split_k > 1 and accumulator_dtype(c.update) is not dtypes.float32:
            blocks = replace(blocks, split_k=1)  # split-K's partial tiles are float32
        return DotPlan(rows, cols, batch, k, sixteen, blocks)
    numel = math.prod(kernel.extents)
    inner = max((math.prod(e) for p in kernel.parts for e in _inner_chains(p.body)), default=None)
    found = survey(kernel, inner) if inner is not None else None
    if found is None or not found.stages:
        return FlatPlan(numel, bool(kernel.extents), tiling.flat_blocks(numel, None))
    plan = FlatPlan(numel, bool(kernel.extents), tiling.flat_blocks(numel, inner))
    slices = tiling.split_reduction(plan.tiles, inner)
    if slices == 1 or not found.splits:
        return plan
    # The blocks of a reduction over one slice (a slice of 1024 terms or fewer is one tile).
    plan = replace(plan, blocks=tiling.flat_blocks(numel, _ceil_div(inner, slices)), split=slices, split_terms=inner)
    return replace(plan, split=_ceil_div(inner, plan.slice_terms))  # no empty last slice


def cells(node: TNode) -> int:
    return math.prod(node.dims)


def sixteen_bit_load(e: Expr) -> DType | None:
    """The storage type of an operand that is a plain float16/bfloat16 load."""
    if isinstance(e, Load) and e.oob_value in (None, 0, 0.0) and e.tnode.dtype in (dtypes.float16, dtypes.bfloat16):
        return e.tnode.dtype
    return None


def _inner_chains(body: Stmt) -> Iterator[tuple[int, ...]]:
    """The extents of every loop chain inside a statement's body (for sizing ``RBLOCK``)."""
    for s in iter_stmts(body):
        if isinstance(s, For):
            chain, _ = loop_chain(s)
            yield tuple(loop.extent for loop in chain)
