"""Block sizes: a small heuristic table in the spirit of PyTorch Inductor's defaults: no search,
one configuration per kernel shape.

* Pointwise kernels tile their flattened grid by ``XBLOCK`` (up to 1024 points a program).
* Kernels with inner loops (reductions, rows of a softmax) tile the inner points by ``RBLOCK``:
  the whole inner extent when it fits in 1024 (a *persistent* tile: one load of each row, no
  loop), else chunks of 512 looped over; ``XBLOCK`` then keeps a tile near
  :data:`TILE_ELEMENTS` elements.
* Contractions (``tl.dot``) tile rows x columns x reduction by ``BLOCK_M x BLOCK_N x BLOCK_K``,
  and group ``GROUP_M`` row tiles per column sweep so that operand tiles stay in L2. The output
  tile is the largest of :data:`DOT_TILES` that still gives every SM of the target GPU a program
  (:data:`SM_COUNT` programs, batch included): a GEMM launching fewer programs than there are
  SMs leaves the rest of the GPU idle, however fast each program is. A contraction too small
  for one wave with the smallest tile takes that tile (``tl.dot``'s minimum is 16): the most
  programs it can have. With 16-bit operands ``BLOCK_M`` stays at least 64, the rows of one
  Hopper tensor-core instruction (``wgmma``): a smaller tile falls back to the older, slower
  ``mma`` instructions. ``BLOCK_K`` is up to 32 (64 for 16-bit operands), at least 16.
  Small tiles also bound the registers a program needs for its accumulator and epilogue, so
  that kernels do not spill (gpu_check.py reports spills).
* **Split-K.** A contraction whose output tiles still give fewer programs than there are SMs
  (a small ``m x n``) and whose reduction is long (at least two slices of :data:`SPLIT_K_SLICE`
  terms) splits the reduction into ``split_k`` slices, a power of two, doubled until the
  programs fill a wave or the slices would get shorter than :data:`SPLIT_K_SLICE`. Each program
  sums one slice of one tile; the last program of a tile to finish adds the slices' partial sums
  in slice order (writer.py): the result does not depend on which program finishes last.

* **Split reductions.** A flat kernel's reduction of at least :data:`SPLIT_REDUCTION` terms
  whose tiles give fewer programs than there are SMs (a loss's mean: one program) is split the
  same way (:func:`split_reduction`): each program combines one slice of one tile's rows into a
  partial result, and the tile's last program combines the partial results by a tree over one
  tile of them (a fixed order).

This table is the autotuner's fallback and starting point (autotune.py): without a GPU, or with
tuning off (the default), it alone decides.
"""

from __future__ import annotations

from dataclasses import dataclass

PERSISTENT_MAX = 1024
"""The longest inner extent held in one tile (Inductor: 1024 for contiguous reductions)."""
LOOPED_RBLOCK = 512
TILE_ELEMENTS = 2048
"""The elements of a flat kernel's tile with inner loops (``XBLOCK x RBLOCK``), 8 per thread of
its 8 warps. A fused backward pass holds a dozen such tiles live at once (a softmax's gradient
with its first-maximum search): at 4096 elements, the transformer block's spilled registers on
sm_90 (Triton 3.9); half as many elements a program, and twice the programs, spill nothing."""


def next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class FlatBlocks:
    xblock: int
    rblock: int | None
    num_warps: int


def flat_blocks(numel: int, inner: int | None) -> FlatBlocks:
    """Blocks of a flat kernel over ``numel`` grid points whose largest inner extent is
    ``inner`` (``None``: no inner loops)."""
    if inner is None:
        x = min(1024, next_power_of_2(numel))
        return FlatBlocks(x, None, 4 if x <= 512 else 8)
    r = next_power_of_2(inner) if inner <= PERSISTENT_MAX else LOOPED_RBLOCK
    x = min(next_power_of_2(numel), max(1, TILE_ELEMENTS // r))
    return FlatBlocks(x, r, 4 if x * r <= 1024 else 8)


@dataclass(frozen=True)
class DotBlocks:
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    split_k: int = 1
    """Slices the reduction is split into (1: no split-K)."""


SM_COUNT = 132
"""Streaming multiprocessors of the GPU the tiles are chosen for (an H100 SXM has 132)."""

DOT_TILES = ((128, 128), (128, 64), (64, 128), (64, 64), (64, 32), (32, 64), (32, 32), (32, 16), (16, 32),
             (16, 16))
"""Output tiles ``BLOCK_M x BLOCK_N`` from the largest (the most reuse of each operand tile) to
the smallest ``tl.dot`` accepts."""


SPLIT_K_SLICE = 256
"""The fewest reduction terms a split-K slice sums: shorter slices would spend more on writing
and adding partial tiles than they gain in parallelism."""


def _clamp(v: int, hi: int) -> int:
    return max(16, min(hi, next_power_of_2(v)))


def dot_tiles(m: int, n: int, sixteen_bit: bool) -> list[tuple[int, int]]:
    """The output tiles a contraction of ``m x n`` may take, largest first: :data:`DOT_TILES`
    clamped to the output, keeping 64-row tiles for 16-bit operands (Hopper's tensor-core
    instruction, ``wgmma``, works on those)."""
    return list(dict.fromkeys((_clamp(m, bm), _clamp(n, bn)) for bm, bn in DOT_TILES if bm >= 64 or not sixteen_bit))


def dot_block_k(k: int, sixteen_bit: bool) -> int:
    return _clamp(k, 64 if sixteen_bit else 32)


def split_k(programs: int, k: int, sm_count: int = SM_COUNT) -> int:
    """The split-K slices of a contraction over ``k`` terms whose tiles make ``programs``
    programs (module docstring)."""
    split = 1
    while programs * split < sm_count and k // (2 * split) >= SPLIT_K_SLICE:
        split *= 2
    return split


SPLIT_REDUCTION = 8192
"""The fewest terms a flat kernel's reduction splits over several programs. One program combines
8192 float32 terms in 16 chunk steps of ``LOOPED_RBLOCK``, a few microseconds; shorter reductions
would gain less from spreading over SMs than the partial results' round trip through memory
and the last program's extra pass cost."""


def split_reduction(programs: int, terms: int, sm_count: int = SM_COUNT) -> int:
    """The slices a reduction of ``terms`` terms per row is split into when its kernel's tiles
    make ``programs`` programs (module docstring): none below :data:`SPLIT_REDUCTION` terms, else
    as :func:`split_k` splits a contraction."""
    return 1 if terms < SPLIT_REDUCTION else split_k(programs, terms, sm_count)


def dot_blocks(m: int, n: int, k: int, sixteen_bit: bool, batch: int = 1, sm_count: int = SM_COUNT) -> DotBlocks:
    """Blocks of a contraction of ``batch`` independent ``m x n`` outputs over ``k`` terms
    (module docstring)."""
    def programs(tile: tuple[int, int]) -> int:
        return batch * -(-m // tile[0]) * -(-n // tile[1])

    tiles = dot_tiles(m, n, sixteen_bit)
    bm, bn = next((t for t in tiles if programs(t) >= sm_count), tiles[-1])
    warps = 8 if bm * bn >= 64 * 64 else 4
    return DotBlocks(bm, bn, dot_block_k(k, sixteen_bit), 8, warps, 3 if sixteen_bit else 2,
                     split_k(programs((bm, bn)), k, sm_count))
