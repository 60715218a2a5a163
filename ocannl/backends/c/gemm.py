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


GEMM_FN = "OCANNL_GEMM_FN"
GEMM_FN_DEFINITION = (
    "/* A GEMM's micro-kernel, or loops shared by the GEMMs of a tile shape: compiled once, in one\n"
    "   translation unit, and called. */\n"
    "#if defined(__GNUC__)\n#define OCANNL_GEMM_FN __attribute__((noinline))\n"
    "#else\n#define OCANNL_GEMM_FN\n#endif"
)
KERNEL_LINKAGE = f"static {GEMM_FN}"
"""A micro-kernel is compiled once and called, not inlined into each of its callers: a driver
calls it twice (whole tiles, edge tiles through a buffer), and inlined, each of its unrolled
copies was compiled again in every driver; a long source's translation units
(``emit.translation_units``) compile it in one of them. A call costs nothing next to a call's ``kc`` steps of
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


def loops_name(mr: int, nr: int) -> str:
    """The C name of the loops shared by the packed GEMMs of ``mr x nr`` tiles (:func:`shared_loops`)."""
    return f"ocannl_gemm_loops_{mr}x{nr}"


ARGS = "ocannl_gemm_args"
"""The C type of what a call of shared GEMM loops passes (:func:`shared_declarations`)."""


def shared_declarations() -> list[str]:
    """The types the shared loops of any tile shape take: the micro-kernel's, and the product's
    addresses, strides and sizes (``cpu_schedule.SharedLoops``; a call names each field)."""
    return [
        "/* A micro-kernel, and a packed GEMM as the shared loops of its tile shape take it: its",
        "   operands at their first row (column) and term, its result at its first cell, each with",
        "   its strides in floats along the loops around the products (outer: their extents), along",
        "   its rows (columns) and along the terms (the result: its rows and columns). A packed value",
        "   is the operand's plus a_plus or b_plus: -0.0f changes none, 0.0f makes a -0.0 positive",
        "   (a factor 0.0 + x). k_block: packed 16 terms of a row at a time (contiguous along k);",
        "   in_place: not packed, read where it lies. fresh: on the first panel the cells start from",
        "   start (their reset). site: the check a failed allocation of packing buffers reports. */",
        "typedef void (*ocannl_gemm_kernel)(int64_t, const float *restrict, const float *restrict, float *restrict,",
        "                                   int64_t, int, float);",
        "typedef struct {",
        "  const float *a, *b;",
        "  float *c;",
        "  int64_t outer[3], a_outer[3], b_outer[3], c_outer[3];",
        "  int64_t a_along, a_k, b_along, b_k, c_rows, c_cols;",
        "  float a_plus, b_plus;",
        "  int a_k_block, b_k_block, a_in_place, b_in_place;",
        "  int64_t m, n, depth, mc, kc, nc;",
        "  int fresh;",
        "  float start;",
        "  int parallel, site;",
        f"}} {ARGS};",
    ]


SHARES = "ocannl_gemm_shares"


def shares() -> list[str]:
    """The function that cuts a packed GEMM into units of work for ``nt`` threads, which the
    loops of every GEMM call (why this cut: ``gemm_printer._GemmPrinter.thread_shares``)."""
    return [
        "/* The units of a packed GEMM of `products` products of m x n cells on nt threads: two units of",
        "   work per thread (a thread another process slows down leaves its units to the others), of each",
        "   product a product a unit when there are enough, as ru shares of the rows by cu of the columns,",
        "   the split that packs the least (cu*m + ru*n values a term); *mu rows (whole tiles of mr) by *nb",
        "   columns (whole strips of nr, at most nc) a unit. One thread: a unit of all rows by nc columns. */",
        f"static {GEMM_FN} void {SHARES}(int64_t m, int64_t n, int64_t products, int64_t nt, int64_t mr,",
        "    int64_t nr, int64_t nc, int64_t *mu, int64_t *nb) {",
        "  *mu = m;",
        "  *nb = nc;",
        "  if (nt <= 1) return;",
        "  const int64_t u = products == 1 ? 2*nt : (2*nt + products - 1) / products;",
        "  int64_t ru = 1;",
        "  for (int64_t r = 2; r <= u; ++r)",
        "    if (((u + r - 1) / r) * m + r * n < ((u + ru - 1) / ru) * m + ru * n) ru = r;",
        "  const int64_t cu = (u + ru - 1) / ru, cols = ((n + cu - 1) / cu + nr - 1) / nr * nr;",
        "  *mu = ((m + ru - 1) / ru + mr - 1) / mr * mr;",
        "  *nb = cols > nc ? nc : cols;",
        "}",
    ]


def pack_name(width: int) -> str:
    return f"ocannl_gemm_pack_{width}"


def pack(width: int, k_block: int) -> list[str]:
    """The function packing one strip ``width`` rows (or columns) wide for the shared loops:
    ``w`` of them read from ``src`` (at the strip's first row and the panel's first term,
    ``along`` and ``k_stride`` floats apart), the others zero, ``kc`` terms, each value plus
    ``plus``; ``k_block`` terms of a row at a time for an operand contiguous along the terms
    (``cpu_schedule.Packing.k_block``). Each form's inner loop has a constant trip count, which
    the compiler unrolls or vectorizes: a row of ``width`` adjacent values, a block of terms."""
    w = width
    return [
        f"/* A strip of {w} rows (or columns) of an operand, packed k after k (or {k_block} terms of each at a",
        "   time where it is contiguous along k), w of them read and the others zero. */",
        f"static {GEMM_FN} void {pack_name(w)}(float *restrict strip, const float *restrict src, int64_t along,",
        "    int64_t k_stride, int64_t w, int64_t kc, int k_block, float plus) {",
        f"  if (w == {w} && along == 1) {{",
        "    for (int64_t k = 0; k < kc; ++k)",
        f"      for (int64_t q = 0; q < {w}; ++q) strip[{w}*k + q] = src[k_stride*k + q] + plus;",
        f"  }} else if (w == {w} && k_block) {{  /* k_stride is 1 */",
        f"    for (int64_t k0 = 0; k0 < kc; k0 += {k_block})",
        f"      for (int64_t q = 0; q < {w}; ++q)",
        f"        for (int64_t k = k0; k < k0 + {k_block}; ++k) strip[{w}*k + q] = src[along*q + k] + plus;",
        f"  }} else if (w == {w}) {{",
        "    for (int64_t k = 0; k < kc; ++k)",
        f"      for (int64_t q = 0; q < {w}; ++q) strip[{w}*k + q] = src[along*q + k_stride*k] + plus;",
        "  } else {",
        "    for (int64_t k = 0; k < kc; ++k) {",
        f"      for (int64_t q = 0; q < w; ++q) strip[{w}*k + q] = src[along*q + k_stride*k] + plus;",
        f"      for (int64_t q = w; q < {w}; ++q) strip[{w}*k + q] = 0.0f;",
        "    }",
        "  }",
        "}",
    ]


_B_PANEL = "(g->b_in_place ? 0 : (g->kc*g->nc + 15) / 16 * 16)"
"""The floats of a thread's packed panel of B in the shared loops (none where B is read in place)."""


def shared_loops(mr: int, nr: int) -> list[str]:
    """The loops of every packed GEMM of ``mr x nr`` tiles that runs in shared loops
    (``cpu_schedule.SharedLoops``), as three functions: one unit of work (:func:`_unit`), the
    units of one thread (:func:`_units`), and the entry (:func:`_entry`), which runs them on the
    threads of a parallel region of its own where the product asks for it. They do what
    ``gemm_printer.py`` prints for a GEMM of its own (its module docstring), with the sizes and
    strides read from the call's arguments and the micro-kernel called through its address; the
    packing is :func:`pack`'s."""
    return [*_unit(mr, nr), "", *_units(mr, nr), "", *_entry(mr, nr)]


def _unit(mr: int, nr: int) -> list[str]:
    """One unit of work: ``nb`` columns by ``mu`` rows of one product, its panels in order."""
    name, tile = loops_name(mr, nr), f"{mr}x{nr}"
    return [
        f"/* One unit of work of a packed GEMM of {tile} tiles: the product bi of the loops around the",
        "   products, nb columns from jc by mu rows from iu; pb: this thread's packing buffers, the panel",
        "   of B first. */",
        f"static {GEMM_FN} void {name}_unit(ocannl_gemm_kernel kernel, const {ARGS} *restrict g, float *restrict pb,",
        "    int64_t bi, int64_t jc, int64_t iu, int64_t mu, int64_t nb) {",
        "  const int64_t o0 = bi / (g->outer[1]*g->outer[2]), o1 = bi / g->outer[2] % g->outer[1],",
        "                o2 = bi % g->outer[2];",
        "  const float *const a = g->a + g->a_outer[0]*o0 + g->a_outer[1]*o1 + g->a_outer[2]*o2;",
        "  const float *const b = g->b + g->b_outer[0]*o0 + g->b_outer[1]*o1 + g->b_outer[2]*o2;",
        "  float *const c = g->c + g->c_outer[0]*o0 + g->c_outer[1]*o1 + g->c_outer[2]*o2;",
        f"  float *const pa = pb + {_B_PANEL};",
        "  const int64_t nc = g->n - jc < nb ? g->n - jc : nb, mend = iu + mu < g->m ? iu + mu : g->m;",
        "  for (int64_t pc = 0; pc < g->depth; pc += g->kc) {",
        "    const int64_t kc = g->depth - pc < g->kc ? g->depth - pc : g->kc;",
        "    const int fresh = g->fresh && pc == 0;",
        f"    if (!g->b_in_place)  /* pack B: the panel's columns in strips of {nr} */",
        f"      for (int64_t jr = 0; jr < nc; jr += {nr})",
        f"        {pack_name(nr)}(pb + jr*kc, b + g->b_along*(jc + jr) + g->b_k*pc, g->b_along, g->b_k,",
        f"            nc - jr < {nr} ? nc - jr : {nr}, kc, g->b_k_block, g->b_plus);",
        "    for (int64_t ic = iu; ic < mend; ic += g->mc) {",
        "      const int64_t mcc = mend - ic < g->mc ? mend - ic : g->mc;",
        f"      if (!g->a_in_place)  /* pack A: the block's rows in strips of {mr} */",
        f"        for (int64_t ir = 0; ir < mcc; ir += {mr})",
        f"          {pack_name(mr)}(pa + ir*kc, a + g->a_along*(ic + ir) + g->a_k*pc, g->a_along, g->a_k,",
        f"              mcc - ir < {mr} ? mcc - ir : {mr}, kc, g->a_k_block, g->a_plus);",
        f"      /* the micro-kernel over the block's {tile} tiles */",
        f"      for (int64_t jr = 0; jr < nc; jr += {nr}) {{",
        f"        for (int64_t ir = 0; ir < mcc; ir += {mr}) {{",
        "          const float *const ap = g->a_in_place ? a + g->a_along*(ic + ir) + g->a_k*pc : pa + ir*kc;",
        "          const float *const bp = g->b_in_place ? b + g->b_along*(jc + jr) + g->b_k*pc : pb + jr*kc;",
        f"          const int64_t h = mcc - ir < {mr} ? mcc - ir : {mr}, w = nc - jr < {nr} ? nc - jr : {nr};",
        "          float *const corner = c + g->c_rows*(ic + ir) + g->c_cols*(jc + jr);",
        "          if (pc == 0 && g->c_cols == 1) {  /* the next tile's cells, while this one computes */",
        f"            const int64_t ni = ir + {mr} < mcc ? ir + {mr} : 0, nj = ir + {mr} < mcc ? jr : jr + {nr};",
        "            if (nj < nc)",
        f"              for (int64_t r = 0; r < {mr} && ni + r < mcc; ++r)",
        "                __builtin_prefetch(c + g->c_rows*(ic + ni + r) + (jc + nj), 1, 3);",
        "          }",
        f"          if (h == {mr} && w == {nr} && g->c_cols == 1) {{",
        "            kernel(kc, ap, bp, corner, g->c_rows, fresh, g->start);",
        "            continue;",
        "          }",
        "          /* an edge tile, or a result whose columns are apart: its cells through a buffer */",
        f"          float t[{mr * nr}] = {{0}};",
        "          for (int64_t r = 0; r < h; ++r)",
        "            for (int64_t q = 0; q < w; ++q)",
        f"              t[{nr}*r + q] = fresh ? g->start : corner[g->c_rows*r + g->c_cols*q];",
        f"          kernel(kc, ap, bp, t, {nr}, 0, 0.0f);",
        "          for (int64_t r = 0; r < h; ++r)",
        f"            for (int64_t q = 0; q < w; ++q) corner[g->c_rows*r + g->c_cols*q] = t[{nr}*r + q];",
        "        }",
        "      }",
        "    }",
        "  }",
        "}",
    ]


def _units(mr: int, nr: int) -> list[str]:
    """A thread's units, shared out as ``gemm_printer._GemmPrinter.thread_shares`` says."""
    name, tile = loops_name(mr, nr), f"{mr}x{nr}"
    return [
        f"/* The units of work of a packed GEMM of {tile} tiles that one thread runs (in_team: with the",
        "   other threads of the region it runs in), with its own packing buffers. */",
        f"static {GEMM_FN} void {name}_units(ocannl_gemm_kernel kernel, const {ARGS} *restrict g, int in_team,",
        "    int *_status) {",
        f"  const int64_t bytes = ({_B_PANEL} + (g->a_in_place ? 0 : g->mc*g->kc)) * 4;",
        "  float *const pb = bytes ? (float *)aligned_alloc(64, (bytes + 63) / 64 * 64) : 0;",
        "  if (bytes && !pb) __atomic_store_n(_status, g->site, __ATOMIC_RELAXED);",
        "  const int64_t products = g->outer[0]*g->outer[1]*g->outer[2];",
        "  int64_t nt = 1;",
        "#ifdef _OPENMP",
        "  if (in_team) nt = omp_get_num_threads();",
        "#endif",
        "  int64_t mu, nb;",
        f"  ocannl_gemm_shares(g->m, g->n, products, nt, {mr}, {nr}, g->nc, &mu, &nb);",
        "  if (in_team) {",
        "    /* units of columns and rows, each packing its own panels; no thread waits for another */",
        "    #pragma omp for schedule(dynamic) collapse(3)",
        "    for (int64_t bi = 0; bi < products; ++bi)",
        "      for (int64_t jc = 0; jc < g->n; jc += nb)",
        "        for (int64_t iu = 0; iu < g->m; iu += mu)",
        f"          if (pb || !bytes) {name}_unit(kernel, g, pb, bi, jc, iu, mu, nb);",
        "  } else if (pb || !bytes) {",
        "    /* the same loops, no worksharing: the caller may be a thread of another region */",
        "    for (int64_t bi = 0; bi < products; ++bi)",
        "      for (int64_t jc = 0; jc < g->n; jc += nb)",
        f"        for (int64_t iu = 0; iu < g->m; iu += mu) {name}_unit(kernel, g, pb, bi, jc, iu, mu, nb);",
        "  }",
        "  free(pb);",
        "}",
    ]


def _entry(mr: int, nr: int) -> list[str]:
    """The function a product's call names: its units on threads or on the calling thread."""
    name, tile = loops_name(mr, nr), f"{mr}x{nr}"
    return [
        f"/* A packed GEMM of {tile} tiles (cpu_schedule.SharedLoops): on the threads of a parallel region",
        "   of its own where g->parallel says, else on the calling thread. */",
        f"static {GEMM_FN} void {name}(ocannl_gemm_kernel kernel, const {ARGS} *restrict g, int *_status) {{",
        "  if (g->parallel) {",
        "    #pragma omp parallel",
        f"    {name}_units(kernel, g, 1, _status);",
        "  } else {",
        f"    {name}_units(kernel, g, 0, _status);",
        "  }",
        "}",
    ]


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
    args_type = ARGS

    def __init__(self, vector_bytes: int):
        self.vector_bytes = vector_bytes

    kernel = staticmethod(kernel)
    kernel_name = staticmethod(kernel_name)
    loops_name = staticmethod(loops_name)
    shared_loops = staticmethod(shared_loops)
    shared_declarations = staticmethod(shared_declarations)
    shares = staticmethod(shares)
    shares_name = SHARES
    pack = staticmethod(pack)
    pack_name = staticmethod(pack_name)
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
