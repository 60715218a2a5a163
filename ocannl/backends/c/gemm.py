"""The micro-kernels of the C backend's packed GEMM (ocannl/lowlevel/cpu_schedule.py,
:class:`~ocannl.lowlevel.cpu_schedule.GemmPlan`; the loops around them are printed by
``gemm_printer.py``).

A micro-kernel computes an ``mr x nr`` tile of cells from two packed strips: ``a``, ``kc`` rows
of ``mr`` values (the tile's rows of the left operand, ``k`` after ``k``), and ``b``, ``kc`` rows
of ``nr`` values (its columns of the right operand), adding into the tile ``c`` (row stride
``ldc``, columns contiguous). A small operand may be read in place instead of from a strip
(:attr:`~ocannl.lowlevel.cpu_schedule.Packing.in_place`): the kernel is then compiled with the
operand's strides, and its name says them. Its accumulators are ``mr`` rows of ``nr / lanes`` vectors written
with GCC/Clang vector extensions (``vector_size``), so the compiler maps them onto the target's
registers without intrinsics of one instruction set; with ``lanes == 1`` they are scalars and
the kernel is plain C.

Each accumulator lane is one cell, and every step is a separate multiply and add (the library is
built with ``-ffp-contract=off``), rounded as the interpreter rounds the term and the running sum:
lanes never mix, so a cell's value does not depend on which lane or which tile computes it. Two
kernels per shape follow the two summation orders (docs/semantics.md, "Summation order"):

- ``blocks<B>``: every ``B`` consecutive terms are summed from zero in the registers and the sum
  is then added to the cell (``kc`` is a multiple of ``B``, so every block is whole in one call);
  where the target has the registers (``totals_in_registers``), the cells' running totals stay in
  registers beside the block sums and the tile is written once, at the end of the call;
- ``inorder``: the registers start from the cells and add the terms one by one.

A contraction that resets its cells first (``c[I] := 0.0`` before the sum) does not store the
reset: on the first ``kc`` panel the caller passes ``fresh`` and the reset value ``start``, and
the kernel uses ``start`` where it would read a cell, the first block sum added to it (``start +
sum``, rounded as the interpreter's ``0.0 + sum``: ``-0.0`` sums still become ``+0.0``) or the
registers starting from it. The cells of the tile are then written once, not zeroed by a loop
nest of their own and read back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ocannl.backends.c.gemm_printer import print_gemm
from ocannl.lowlevel.cpu_schedule import ContractionPlan, MicroKernel

if TYPE_CHECKING:
    from ocannl.backends.codegen import Emitter


KERNEL_LINKAGE = "static __attribute__((noinline))"
"""A micro-kernel is compiled once and called, not inlined into each of its callers: a driver
calls it twice (whole tiles, edge tiles through a buffer), and inlined, each of its unrolled
copies was compiled again in every driver. A call costs nothing next to a call's ``kc`` steps of
``mr x nr`` multiply-adds: the GPT step of ``bench/cpu_steps.py`` took 38.9 ms a step rather than
39.6, the 784-1024-1024 MLP's 16.1 ms as before (best rounds, both builds in one process taking
turns, one thread, Zen 4), and the GPT's cold build's compiler time went from 4.3 to 3.9 s."""


def kernel_name(shape: MicroKernel) -> str:
    """The C name of a micro-kernel: ``ocannl_gemm_6x16_f32x8_blocks64_ab``."""
    order = f"blocks{shape.block}" if shape.block else "inorder"
    vector = f"f32x{shape.lanes}" if shape.lanes > 1 else "f32"
    read_in_place = (("a", shape.a_in_place), ("b", shape.b_in_place))
    in_place = "".join(f"_{side}{strides[0]}x{strides[1]}" for side, strides in read_in_place if strides is not None)
    return f"ocannl_gemm_{shape.mr}x{shape.nr}_{vector}_{order}_{'ab' if shape.a_first else 'ba'}{in_place}"


def vector_type(lanes: int, aligned: bool = True) -> str:
    """The name of the vector type of ``lanes`` floats (:func:`vector_types`); ``aligned=False``:
    the one that reads and writes at any float address."""
    return f"ocannl_f32x{lanes}" + ("" if aligned else "u")


def vector_types(lanes: int) -> list[str]:
    """The typedefs a kernel of ``lanes`` floats per vector uses: one aligned (the packed strips
    are aligned to 64 bytes), one of float alignment for the cells of the result."""
    if lanes == 1:
        return []
    size = 4 * lanes
    return [
        f"/* {lanes} floats in one vector register; the second type reads and writes them at any float address. */",
        f"typedef float {vector_type(lanes)} __attribute__((vector_size({size})));",
        f"typedef float {vector_type(lanes, aligned=False)} __attribute__((vector_size({size}), aligned(4)));",
    ]


def kernel(shape: MicroKernel) -> list[str]:
    """The lines of the micro-kernel function :func:`kernel_name` names (module docstring)."""
    mr, nr, lanes = shape.mr, shape.nr, shape.lanes
    nv = nr // lanes
    vector = f"ocannl_f32x{lanes}" if lanes > 1 else "float"
    cells = [(r, v) for r in range(mr) for v in range(nv)]

    def c_cell(r: int, v: int) -> str:
        offset = " + ".join(p for p in (f"{r}*ldc" if r else "", str(v * lanes) if v else "") if p) or "0"
        if lanes == 1:
            return f"c[{offset}]"
        return f"*({vector}u *)(c + {offset})"

    def step(indent: str) -> list[str]:
        return [indent + line for line in _step(shape, vector)]

    splat = f"{{{', '.join(['start'] * lanes)}}}" if lanes > 1 else "start"
    lines = [
        *_comment(shape),
        f"{KERNEL_LINKAGE} void {kernel_name(shape)}(",
        "    int64_t kc, const float *restrict a, const float *restrict b, float *restrict c, int64_t ldc,",
        "    int fresh, float start) {",
        f"  const {vector} _s = {splat};",
    ]
    zero = "{0}" if lanes > 1 else "0.0f"
    if shape.block and shape.totals_in_registers:
        lines += [
            *(f"  {vector} _t{r}_{v} = fresh ? _s : {c_cell(r, v)};" for r, v in cells),
            f"  for (int64_t k0 = 0; k0 < kc; k0 += {shape.block}) {{",
            f"    const int64_t k1 = k0 + {shape.block} < kc ? k0 + {shape.block} : kc;",
            *(f"    {vector} _c{r}_{v} = {zero};" for r, v in cells),
            "    for (int64_t k = k0; k < k1; ++k) {",
            *step("      "),
            "    }",
            *(f"    _t{r}_{v} = _t{r}_{v} + _c{r}_{v};" for r, v in cells),
            "  }",
            *(f"  {c_cell(r, v)} = _t{r}_{v};" for r, v in cells),
        ]
    elif shape.block:
        lines += [
            f"  for (int64_t k0 = 0; k0 < kc; k0 += {shape.block}) {{",
            f"    const int64_t k1 = k0 + {shape.block} < kc ? k0 + {shape.block} : kc;",
            *(f"    {vector} _c{r}_{v} = {zero};" for r, v in cells),
            "    for (int64_t k = k0; k < k1; ++k) {",
            *step("      "),
            "    }",
            "    if (fresh && k0 == 0) {",
            *(f"      {c_cell(r, v)} = _s + _c{r}_{v};" for r, v in cells),
            "    } else {",
            *(f"      {c_cell(r, v)} = {c_cell(r, v)} + _c{r}_{v};" for r, v in cells),
            "    }",
            "  }",
        ]
    else:
        lines += [
            *(f"  {vector} _c{r}_{v} = fresh ? _s : {c_cell(r, v)};" for r, v in cells),
            "  for (int64_t k = 0; k < kc; ++k) {",
            *step("    "),
            "  }",
            *(f"  {c_cell(r, v)} = _c{r}_{v};" for r, v in cells),
        ]
    return lines + ["}"]


def _step(shape: MicroKernel, vector: str) -> list[str]:
    """One term of every cell of the tile: the right strip's vectors, then each left value
    broadcast, multiplied and added; an operand read in place at its strides, else from its
    packed strip (``k`` after ``k``)."""
    mr, nr, lanes = shape.mr, shape.nr, shape.lanes
    b_along, b_k = shape.b_in_place or (1, nr)
    a_along, a_k = shape.a_in_place or (1, mr)
    b_vector = vector if shape.b_in_place is None else vector_type(lanes, aligned=False)
    lines = []
    for v in range(nr // lanes):
        load = f"b[{b_k}*k + {v * b_along}]" if lanes == 1 else f"*(const {b_vector} *)(b + {b_k}*k + {v * lanes})"
        lines.append(f"const {vector} _b{v} = {load};")
    for r in range(mr):
        lines.append(f"const float _a{r} = a[{a_k}*k + {r * a_along}];")
        lines += [f"_c{r}_{v} = _c{r}_{v} + {f'_a{r} * _b{v}' if shape.a_first else f'_b{v} * _a{r}'};"
                  for v in range(nr // lanes)]
    return lines


def _comment(shape: MicroKernel) -> list[str]:
    """The comment before a micro-kernel: its tile, how it reads its operands, its summation
    order."""
    mr, nr, lanes = shape.mr, shape.nr, shape.lanes

    def operand(side: str, width: int, strides: tuple[int, int] | None) -> str:
        return (f"{side}[kc x {width}]" if strides is None
                else f"{side} read in place ({strides[0]} apart across, {strides[1]} along k)")

    what = (f"each block of {shape.block} terms summed from zero, then added to c" if shape.block
            else "added to c one term after the other")
    packed = ", packed strips" if shape.a_in_place is None and shape.b_in_place is None else ""
    return [
        f"/* c[{mr} x {nr}] (row stride ldc) += {operand('a', mr, shape.a_in_place)} * "
        f"{operand('b', nr, shape.b_in_place)}{packed}, {what};",
        f"   {mr * (nr // lanes)} accumulators of {lanes} float{'s' if lanes > 1 else ''}, one lane per cell; fresh: "
        "c holds no value yet,",
        "   its cells start from start (their reset). */",
    ]


class CGemm:
    """What the C target (``target.py``) needs to print packed GEMMs: the target's vector width,
    the micro-kernels, the printer of the loops around them (``gemm_printer.py``) and the OpenMP
    spellings that printer uses."""

    parallel_region = "#pragma omp parallel"

    def __init__(self, vector_bytes: int):
        self.vector_bytes = vector_bytes

    kernel = staticmethod(kernel)
    kernel_name = staticmethod(kernel_name)
    vector_type = staticmethod(vector_type)
    vector_types = staticmethod(vector_types)

    def print_gemm(self, emitter: Emitter, plan: ContractionPlan) -> None:
        print_gemm(emitter, self, plan)

    @staticmethod
    def declarations() -> list[str]:
        """File-scope lines the first GEMM of a source needs: the heap allocator (the packing
        buffers) and OpenMP (for its thread count)."""
        return ["#include <stdlib.h>", "#ifdef _OPENMP", "#include <omp.h>", "#endif"]

    @staticmethod
    def work_shared_for(collapse: int) -> str:
        return "#pragma omp for schedule(dynamic)" + (f" collapse({collapse})" if collapse > 1 else "")

    @staticmethod
    def allocate(name: str, size: int) -> str:
        """``name``, ``size`` floats from the heap, aligned to 64 bytes (a null pointer when the
        allocation fails)."""
        return f"float *const {name} = (float *)aligned_alloc(64, {-(-size * 4 // 64) * 64});"

    @staticmethod
    def release(name: str) -> str:
        return f"free({name});"

    @staticmethod
    def report(site: int) -> str:
        """A statement recording the failed check ``site`` in ``_status``, from any thread."""
        return f"__atomic_store_n(_status, {site}, __ATOMIC_RELAXED);"

    @staticmethod
    def thread_count(name: str) -> list[str]:
        """Lines declaring ``name``, the number of threads of the enclosing parallel region."""
        return [
            "#ifdef _OPENMP",
            f"const int64_t {name} = omp_get_num_threads();",
            "#else",
            f"const int64_t {name} = 1;",
            "#endif",
        ]
