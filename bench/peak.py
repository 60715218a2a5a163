"""The float32 arithmetic peak of one core, as the C backend's compiler builds for it: the bound
no training step on one thread can beat.

A step of ``F`` floating-point operations cannot run in less than ``F / peak`` seconds on one
core, whatever the framework: ``routine.profile`` prints a step's ``F`` (its ``all`` row), and
comparing that bound with a peer's time tells whether a target ratio is reachable at all
(README, "At the sizes people train").

The kernel keeps ``CHAINS`` independent accumulators of the target's vector width (``c_isa``,
as the micro-kernels: 16 floats with AVX-512, 8 with AVX2, 4 with SSE or NEON, 1 when
``portable``) and updates each ``acc = acc * x + y`` per iteration, with no memory access: enough
chains to hide the latency of each operation, so only the core's arithmetic pipes bound it. It
is built twice: as the library builds every routine (``-ffp-contract=off``: a multiply, then an
add, each rounded, as the interpreter computes), and with ``-ffp-contract=fast`` (fused
multiply-adds, as BLAS libraries and XLA use them). Each is timed on the calling thread, best of
``--repeat`` runs.

    python -m bench.peak [--repeat R] [--quick]
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses

from bench.gemm import best_time
from ocannl.backends.c import compiler

CHAINS = 24
"""Independent accumulators: a multiply and an add of 3-4 cycles each, two pipes of each kind,
so at least 16 in flight keep every pipe busy."""


def source(lanes: int) -> str:
    """The C kernel: ``ocannl_peak(n, seed)`` runs ``n`` iterations of every chain and returns
    their sum (so the compiler keeps them); ``seed`` comes at run time, so no value is known."""
    scalar = "float" if lanes == 1 else "ocannl_peak_v"
    lines = ["#include <stdint.h>"]
    if lanes > 1:
        lines.append(f"typedef float ocannl_peak_v __attribute__((vector_size({4 * lanes})));")
    lines.append("float ocannl_peak(int64_t n, float seed) {")
    lines.append(f"  {scalar} x, y, {', '.join(f'a{j}' for j in range(CHAINS))};")
    lines.append("  x = y = " + ("seed;" if lanes == 1 else "(ocannl_peak_v){0} + seed;"))
    lines.append("  y = y * 1e-7f;")
    lines += [f"  a{j} = x * {j + 1}.0f;" for j in range(CHAINS)]
    lines.append("  for (int64_t i = 0; i < n; ++i) {")
    lines += [f"    a{j} = a{j} * x + y;" for j in range(CHAINS)]
    lines.append("  }")
    total = " + ".join(f"a{j}" for j in range(CHAINS))
    lines.append(f"  {scalar} s = {total};")
    lines.append("  return " + ("s;" if lanes == 1 else f"{' + '.join(f's[{q}]' for q in range(lanes))};"))
    lines.append("}")
    return "\n".join(lines) + "\n"


@dataclasses.dataclass
class Peak:
    lanes: int
    separate: float
    """GFLOP/s with a multiply and an add (the library's build)."""
    fused: float
    """GFLOP/s with fused multiply-adds."""


def measure(repeat: int = 7, iterations: int = 4_000_000) -> Peak:
    tc = compiler.toolchain()
    lanes = max(1, tc.vector_bytes // 4)
    text = source(lanes)
    rates = []
    for contract in ("off", "fast"):
        built = dataclasses.replace(tc, flags=(*tc.flags, f"-ffp-contract={contract}"))
        kernel = ctypes.CDLL(str(compiler.compile_shared(text, built))).ocannl_peak
        kernel.argtypes, kernel.restype = (ctypes.c_int64, ctypes.c_float), ctypes.c_float
        best = best_time(lambda: kernel(iterations, 1.0000001), repeat)
        rates.append(2 * lanes * CHAINS * iterations / best / 1e9)
    return Peak(lanes, *rates)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="timed runs of each build (the best is shown)")
    parser.add_argument("--quick", action="store_true", help="short runs: a smoke test")
    args = parser.parse_args(argv)
    peak = measure(args.repeat, 20_000 if args.quick else 4_000_000)
    vector = f"{peak.lanes} floats a vector" if peak.lanes > 1 else "scalar"
    print(f"float32 peak of one core ({vector}): {peak.separate:.1f} GFLOP/s with a multiply "
          f"and an add (as ocannl builds), {peak.fused:.1f} GFLOP/s fused")


if __name__ == "__main__":
    main()
