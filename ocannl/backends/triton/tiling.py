"""Block sizes: a small heuristic table, in the spirit of Inductor's defaults (spec/peers.md §2.2,
§2.3): no search, one configuration per kernel shape.

* Pointwise kernels tile their flattened grid by ``XBLOCK`` (up to 1024 points a program).
* Kernels with inner loops (reductions, rows of a softmax) tile the inner points by ``RBLOCK``:
  the whole inner extent when it fits in 1024 (a *persistent* tile: one load of each row, no
  loop), else chunks of 512 looped over; ``XBLOCK`` then keeps a tile near 4096 elements.
* Contractions (``tl.dot``) tile rows x columns x reduction by ``BLOCK_M x BLOCK_N x BLOCK_K``:
  up to 128 x 128 x 32 (x 64 for 16-bit operands), at least 16 each (``tl.dot``'s minimum), and
  group ``GROUP_M`` row tiles per column sweep so that operand tiles stay in L2.
"""

from __future__ import annotations

from dataclasses import dataclass

PERSISTENT_MAX = 1024
"""The longest inner extent held in one tile (Inductor: 1024 for contiguous reductions)."""
LOOPED_RBLOCK = 512
TILE_ELEMENTS = 4096


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


def dot_blocks(m: int, n: int, k: int, sixteen_bit: bool) -> DotBlocks:
    def clamp(v: int, hi: int) -> int:
        return max(16, min(hi, next_power_of_2(v)))

    bm, bn = clamp(m, 128), clamp(n, 128)
    bk = clamp(k, 64 if sixteen_bit else 32)
    warps = 8 if bm * bn >= 128 * 128 else 4
    return DotBlocks(bm, bn, bk, 8, warps, 3 if sixteen_bit else 2)
