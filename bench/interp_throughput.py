"""Interpreter throughput: scalar operations per second on a 64x64x64 float32 matmul.

Each innermost iteration of ``c[i, j] := c[i, j] + a[i, k] * b[k, j]`` counts two scalar
operations (one multiply, one add), so the matmul performs 2 * 64**3 of them. Run:
``python bench/interp_throughput.py``.
"""

from __future__ import annotations

import time

import numpy as np

from ocannl.backends.base import Context
from ocannl.lowlevel.assignments import Accum, Computation
from ocannl.lowlevel.indexing import Iter, Projections, Symbol
from ocannl.lowlevel.scalar_ops import Binop
from ocannl.lowlevel.tnode import TNode

N = 64


def matmul_ops_per_second(n: int = N) -> float:
    a, b, c = TNode("a", (n, n)), TNode("b", (n, n)), TNode("c", (n, n))
    i, j, k = Symbol(), Symbol(), Symbol()
    proj = Projections(
        product_space=(n, n, n),
        product_iterators=(i, j, k),
        lhs_dims=(n, n),
        rhs_dims=((n, n), (n, n)),
        project_lhs=(Iter(i), Iter(j)),
        project_rhs=((Iter(i), Iter(k)), (Iter(k), Iter(j))),
    )
    matmul = Accum(c, Binop.ADD, Binop.MUL, (a, b), lambda: proj, initialize_neutral=True, spec="@")
    ctx = Context("interp")
    rng = np.random.default_rng(0)
    ctx.set(a, rng.standard_normal((n, n)))
    ctx.set(b, rng.standard_normal((n, n)))
    routine = ctx.compile(Computation("matmul", matmul))
    start = time.perf_counter()
    routine.run()
    elapsed = time.perf_counter() - start
    expected = ctx.get(a).astype(np.float64) @ ctx.get(b).astype(np.float64)
    assert np.allclose(ctx.get(c), expected, rtol=1e-4, atol=1e-4)
    return 2 * n**3 / elapsed


if __name__ == "__main__":
    rate = matmul_ops_per_second()
    print(f"interp: {rate / 1e6:.2f} M scalar ops/s ({N}x{N}x{N} float32 matmul, {2 * N**3} ops)")
