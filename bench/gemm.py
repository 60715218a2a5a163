"""fp32 GEMM on the C backend against numpy's matmul, measured in the same run.

For n = 256, 512, 1024: ``c = a @ b`` with ``a``, ``b`` of dims ``(n, n)`` (output and input
axes), compiled once on a ``c`` context, then timed over repeated runs (best of ``--repeat``;
each run is one call of the compiled kernel on the context's buffers). numpy's ``a @ b`` is
timed the same way. Prints GFLOP/s (2 n^3 flops per product) and the ratio ocannl / numpy, and
checks that the C result equals the interpreter's bit for bit at 1024 and at ragged sizes (``m x
k x n``; one batched product).

The C kernel is a packed GEMM (docs/codegen.md, "Packed GEMM") that computes each cell's sum in
the interpreter's order (blocks of 64 ``k`` steps, each summed from zero and added to the cell:
docs/semantics.md, "Summation order"; no reassociation, no FMA in the default, deterministic
setting), on all cores through OpenMP, built for this CPU's vector unit (``-march=native``;
``OCANNL_C_ISA=portable`` for the compiler's baseline target and scalar micro-kernels, to
measure what the vector ISA brings); ``OCANNL_C_FAST=1`` adds ``-ffp-contract=fast``.

``--threads N`` limits both sides to N threads (OpenMP and numpy's BLAS), for a per-core
comparison; by default both use every core.

    python -m bench.gemm [--repeat R] [--sizes 256,512,1024] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable

if "--threads" in sys.argv:  # thread pools read these when they start: before numpy loads BLAS
    _n = sys.argv[sys.argv.index("--threads") + 1]
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = _n

QUIET_BLAS_THREADS = "4"
"""``OPENBLAS_THREAD_TIMEOUT`` set before numpy loads OpenBLAS: its idle threads then sleep after
2^4 cycles instead of spinning for 2^28 (about 0.1 s). Left spinning, numpy's threads took a core
from the C backend's next round on a 2-core machine (its two-thread 1024 product measured 16.2-16.6
ms after numpy's rounds, 13.3 ms with them asleep; numpy's own time did not change, 10.8-10.9 ms).
The C backend's threads spin a tenth of a millisecond at most (ocannl/backends/c/compiler.py)."""
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", QUIET_BLAS_THREADS)

import numpy as np

import ocannl as oc
import ocannl.session
from ocannl.backends.context import Context


def best_time(fn, repeat: int) -> float:
    fn()  # warm up: caches, threads
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def gemm(n: int, repeat: int) -> tuple[float, float, float]:
    """(compile seconds, ocannl seconds, numpy seconds) for one n x n x n product."""
    compile_s, run, a_np, b_np = build_gemm(n)
    return compile_s, best_time(run, repeat), best_time(lambda: a_np @ b_np, repeat)


def build_gemm(n: int) -> tuple[float, Callable[[], None], np.ndarray, np.ndarray]:
    """(compile seconds, the compiled ``a @ b``'s run, ``a``, ``b``) for one n x n x n product,
    its result checked against numpy's."""
    ocannl.session.reset()
    rng = np.random.default_rng(n)
    a_np = rng.standard_normal((n, n)).astype(np.float32)
    b_np = rng.standard_normal((n, n)).astype(np.float32)
    a, b = oc.tensor(a_np, input=1), oc.tensor(b_np, input=1)
    c = a @ b
    ctx = Context("c")
    start = time.perf_counter()
    routine = ctx.compile(c)
    compile_s = time.perf_counter() - start
    routine.run()
    got = ctx.get(c.value)
    assert np.allclose(got, a_np @ b_np, rtol=1e-3, atol=1e-3 * n), "the C GEMM is wrong"
    return compile_s, routine.run, a_np, b_np


BIT_CHECKS = ((1024, 1024, 1024, 0), (96, 99, 91, 0), (1, 1, 1, 0), (7, 300, 5, 0), (65, 129, 63, 0),
              (40, 300, 33, 3))
"""``(m, k, n, batch)`` of the products checked bit for bit (batch 0: a plain matmul)."""


def check_bits(m: int, k: int, n: int, batch: int) -> bool:
    """The C product of an ``m x k`` and a ``k x n`` matrix (``batch`` of each when not 0) equals
    the interpreter's bit for bit."""
    results = []
    for backend in ("interp", "c"):
        ocannl.session.reset()
        rng = np.random.default_rng(1)
        lead = (batch,) if batch else ()
        a = oc.tensor(rng.standard_normal((*lead, m, k)).astype(np.float32), batch=len(lead), input=1)
        b = oc.tensor(rng.standard_normal((*lead, k, n)).astype(np.float32), batch=len(lead), input=1)
        c = oc.einsum("b|i->o; b|j->i => b|j->o", a, b) if batch else a @ b
        ctx = Context(backend)
        ctx.compile(c).run()
        results.append(ctx.get(c.value).view(np.uint32))
    return bool(np.array_equal(*results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--sizes", default="256,512,1024")
    parser.add_argument("--threads", type=int, default=None, help="threads for both sides (default: all cores)")
    args = parser.parse_args()
    backend = Context("c").backend
    print(f"C backend: {backend.available()[1]}")
    print(f"threads: {args.threads or 'all'} of {os.cpu_count()} cpus")
    for m, k, n, batch in BIT_CHECKS:
        size = f"{batch} x " * bool(batch) + f"{m}x{k}x{n}"
        print(f"bit-identical to the interpreter ({size}): {check_bits(m, k, n, batch)}")
    print(f"{'n':>6} {'compile s':>10} {'ocannl GFLOP/s':>15} {'numpy GFLOP/s':>14} {'ratio':>7}")
    for n in (int(s) for s in args.sizes.split(",")):
        compile_s, ours, theirs = gemm(n, args.repeat)
        flops = 2.0 * n**3
        print(f"{n:>6} {compile_s:>10.2f} {flops / ours / 1e9:>15.1f} {flops / theirs / 1e9:>14.1f} {theirs / ours:>7.2f}")


if __name__ == "__main__":
    main()
