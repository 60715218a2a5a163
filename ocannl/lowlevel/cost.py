"""The arithmetic and memory traffic of loop IR, counted from the program alone: what a profile
divides its measured times by to give GFLOP/s and GB/s (README, "Profiling").

* **FLOPs**: every floating-point operator one execution of a statement evaluates, once for
  each value it takes: times the extents of the loops its operands read, not of the loops that
  only repeat it (``0.0 + g[i, k]`` in loops ``i, j, k`` counts ``|i| * |k|``: a compiled
  backend computes it once a value, as a packed GEMM does packing its operand; the term ``a[i, k]
  * b[k, j]`` counts ``|i| * |j| * |k|``). An operator reading a local (a running sum) counts
  each time it runs. ``fma`` and ``mul3`` count two; casts, loads, comparisons of integers and
  index arithmetic count nothing. Local scopes (a reduction computed inside an expression) count
  each time their expression runs.
* **Bytes**: for each node a statement reads or writes, the cells its accesses reach over the
  loops around them (an access ``a[i, k]`` in loops ``i, j, k`` reaches ``|i| * |k|`` cells,
  not ``|i| * |j| * |k|``: the repeats stay in cache), at most the node's size, times the cell's
  size; a node both read and written counts twice. This is the traffic of an ideal cache, the
  figure a roofline compares against, not a count of load instructions.

The counts depend on the loop IR only: the interpreter and every compiled backend report the same
figures for the same routine, so their GFLOP/s compare.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from ocannl.lowlevel.indexing import AnySymbol, AxisIndex, IndexSymbol, index_symbols
from ocannl.lowlevel.analysis import affine_form, expr_symbols
from ocannl.lowlevel.ir import (
    Binary,
    Comment,
    DeclareLocal,
    Expr,
    Fill,
    For,
    GetLocal,
    Load,
    LoadDynamic,
    LocalScope,
    Seq,
    Stmt,
    Store,
    StoreDynamic,
    Ternary,
    Unary,
    iter_exprs,
    stmt_exprs,
)
from ocannl.lowlevel.scalar_ops import Ternop, Unop
from ocannl.lowlevel.tnode import TNode


@dataclass(frozen=True)
class Work:
    """What one run of a statement computes and moves (module docstring)."""

    flops: int
    bytes: int


def timed_statements(body: Stmt) -> list[Stmt]:
    """The top-level statements of a routine's ``body`` that do work (not comments nor local
    declarations): the rows of its profile, in program order. A profiling build times each."""
    top = body.stmts if isinstance(body, Seq) else (body,)
    return [s for s in top if not isinstance(s, (Comment, DeclareLocal))]


def work(stmt: Stmt) -> Work:
    """The floating-point operations and the bytes of memory traffic of one run of ``stmt``."""
    counter = _Counter()
    counter.stmt(stmt, {}, 1)
    traffic = 0
    for node, (cells, read, written) in counter.footprints.items():
        traffic += min(cells, node.size) * node.dtype.itemsize * (int(read) + int(written))
    return Work(counter.flops, traffic)


class _Counter:
    """One walk over a statement, loops' extents passed down (``extents``, ``times``: how often
    the current statement runs)."""

    def __init__(self) -> None:
        self.flops = 0
        self.footprints: dict[TNode, tuple[int, bool, bool]] = {}
        """Per node: the most cells one access reaches, whether it is read, whether written."""

    def stmt(self, s: Stmt, extents: Mapping[AnySymbol, int], times: int) -> None:
        match s:
            case For(symbol=symbol, extent=n, body=body):
                self.stmt(body, {**extents, symbol: n}, times * n)
            case Seq(stmts=stmts):
                for sub in stmts:
                    self.stmt(sub, extents, times)
            case Fill(tnode=node):
                self.touch(node, node.size, write=True)
            case _:
                for e in stmt_exprs(s):
                    self.expr(e, extents, times)
                if isinstance(s, (Store, StoreDynamic)):
                    self.touch(s.tnode, _cells(s.indices, extents, dynamic=_dynamic_dim(s)), write=True)

    def expr(self, e: Expr, extents: Mapping[AnySymbol, int], times: int) -> None:
        for sub in iter_exprs(e):
            flops = _flops(sub)
            if flops:
                self.flops += flops * _evaluations(sub, extents, times)
            if isinstance(sub, (Load, LoadDynamic)):
                self.touch(sub.tnode, _cells(sub.indices, extents, dynamic=_dynamic_dim(sub)), write=False)
            elif isinstance(sub, LocalScope):
                self.stmt(sub.body, extents, times)

    def touch(self, node: TNode, cells: int, *, write: bool) -> None:
        before, read, written = self.footprints.get(node, (0, False, False))
        self.footprints[node] = (max(before, cells), read or not write, written or write)


def _evaluations(e: Expr, extents: Mapping[AnySymbol, int], times: int) -> int:
    """How many values ``e`` takes while its statement runs ``times`` times in the loops
    ``extents``: ``times`` over the extents of the loops it does not read (module docstring); all
    ``times`` when it reads a local or a data-dependent index."""
    subs = list(iter_exprs(e))
    if any(isinstance(x, (GetLocal, LocalScope, LoadDynamic)) for x in subs):
        return times
    read = expr_symbols(e)
    return times // math.prod(n for s, n in extents.items() if s not in read)


def _flops(e: Expr) -> int:
    """The floating-point operations of ``e`` itself (not of its operands)."""
    match e:
        case Unary(op=op, x=x) if op not in (Unop.ID, Unop.UNIFORM1, Unop.UINT4X32_OF) and x.dtype.is_float:
            return 1
        case Binary(a=a) if a.dtype.is_float:
            return 1
        case Ternary(op=op, b=b) if b.dtype.is_float:
            return 2 if op in (Ternop.FMA, Ternop.MUL3) else 1
    return 0


def _dynamic_dim(access: Load | LoadDynamic | Store | StoreDynamic) -> int | None:
    """The size of a data-dependent axis (any of its cells may be reached), else ``None``."""
    if isinstance(access, (LoadDynamic, StoreDynamic)):
        return access.tnode.dims[access.axis]
    return None


def _cells(indices: tuple[AxisIndex, ...], extents: Mapping[AnySymbol, int], *, dynamic: int | None) -> int:
    """How many cells an access at ``indices`` reaches over the loops ``extents``: the product
    over its axes of how many values each index takes, at most one cell per combination of the
    loops it reads. A data-dependent axis (``dynamic``, its size) may reach any of its cells."""
    loops = {s for idx in indices for s in index_symbols(idx) if s in extents}
    per_axis = math.prod(_values(idx, extents) for idx in indices) * (dynamic or 1)
    return min(per_axis, math.prod(extents[s] for s in loops) * (dynamic or 1))


def _values(idx: AxisIndex, extents: Mapping[AnySymbol, int]) -> int:
    """How many values ``idx`` takes as the loops ``extents`` run (index symbols hold one value
    during a run)."""
    terms, _ = affine_form(idx)
    loops = [(c, s) for c, s in terms if not isinstance(s, IndexSymbol) and s in extents]
    if not loops:
        return 1
    span = sum(abs(c) * (extents[s] - 1) for c, s in loops) + 1
    return min(span, math.prod(extents[s] for _, s in loops))
