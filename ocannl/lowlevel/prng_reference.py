"""Standard Threefry-4x32 in plain numpy: the oracle for the PRNG built from IR.

ocannl initializes parameters with a counter-based PRNG so that every backend produces the same
bits for the same seed. The generator is the *standard* Threefry-4x32 of
Random123 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), not the
original OCANNL's variant (other rotation constants, a
different injection schedule and a 2-round "light" mode). Being standard lets us check it against
the published Random123 known-answer vectors, which this module's tests do; ``prng.py`` (threefry
as IR building blocks) and every backend are then checked bit for bit against this module.

Everything here is vectorized over leading axes and depends on numpy only. All arithmetic is on
``uint32`` arrays, where numpy wraps modulo 2**32 exactly as the C, Triton and Metal emitters'
unsigned 32-bit arithmetic does.

The algorithm, for ``key = (k0, k1, k2, k3)`` and ``counter = (x0, x1, x2, x3)``:

* key schedule: ``ks = (k0, k1, k2, k3, k0 ^ k1 ^ k2 ^ k3 ^ 0x1BD11BDA)``;
* start with ``x = counter + key`` lane-wise;
* round ``r`` (0-based) mixes two lane pairs with the rotation constants ``ROTATIONS[r % 8]``:
  on even rounds the pairs are (x0, x1) and (x2, x3), on odd rounds (x0, x3) and (x2, x1); mixing
  a pair (a, b) with rotation ``c`` is ``a += b; b = rotl(b, c) ^ a``;
* after every 4th round (rounds 4, 8, ... counted from 1), injection number ``s = 1, 2, ...`` adds
  ``(ks[s % 5], ks[(s+1) % 5], ks[(s+2) % 5], ks[(s+3) % 5] + s)`` to the four lanes.

So 20 rounds end with the 5th injection and 13 rounds with 3 injections and one bare round.
"""

from __future__ import annotations

import numpy as np

ROTATIONS: tuple[tuple[int, int], ...] = (
    (10, 26),
    (11, 21),
    (13, 27),
    (23, 5),
    (6, 20),
    (17, 11),
    (25, 10),
    (18, 20),
)
"""Random123's ``R_32x4`` rotation constants: round ``r`` uses ``ROTATIONS[r % 8]``."""

KEY_SCHEDULE_PARITY = 0x1BD11BDA
"""Random123's ``SKEIN_KS_PARITY32``: the fifth key word is the XOR of the key and this constant."""

DEFAULT_ROUNDS = 20
"""Threefry-4x32-20, the round count Random123 recommends and ocannl uses everywhere."""

_U32 = np.uint32


def _as_words(name: str, value) -> np.ndarray:
    """``value`` as uint32 words, 4 on the last axis, or a ValueError saying what is wrong.

    Python ints and signed arrays are accepted when every value fits in 32 unsigned bits, so the
    known-answer vectors can be written as hex literals.
    """
    arr = np.asarray(value)
    if arr.dtype != np.uint32:
        if arr.dtype.kind not in "iu":
            raise ValueError(
                f"threefry4x32: {name} must hold unsigned 32-bit words, got dtype {arr.dtype}"
            )
        if arr.size and (arr.min() < 0 or arr.max() > 0xFFFFFFFF):
            raise ValueError(
                f"threefry4x32: {name} has values outside [0, 2**32); pass uint32 words"
            )
        arr = arr.astype(np.uint32)
    if arr.ndim == 0 or arr.shape[-1] != 4:
        raise ValueError(
            f"threefry4x32: {name} must have 4 words on its last axis (a uint4x32), "
            f"got shape {arr.shape}"
        )
    return arr


def _rotl(x: np.ndarray, bits: int) -> np.ndarray:
    """Rotate every 32-bit word of ``x`` left by ``bits`` (0 < bits < 32)."""
    return (x << _U32(bits)) | (x >> _U32(32 - bits))


def threefry4x32(key, counter, rounds: int = DEFAULT_ROUNDS) -> np.ndarray:
    """Standard Threefry-4x32 with ``rounds`` rounds: one 128-bit output block per (key, counter).

    ``key`` and ``counter`` are uint32 arrays of shape ``(..., 4)`` (or anything convertible to
    one); their leading axes broadcast numpy-style, so one key can encrypt a whole array of
    counters. Returns a uint32 array of the broadcast shape ``(..., 4)``. Lane ``j`` of the result
    is word ``j`` of Random123's ``threefry4x32_R(rounds, ctr, key)``, so the results compare
    directly with its known-answer vectors.
    """
    if not isinstance(rounds, (int, np.integer)) or rounds < 0:
        raise ValueError(f"threefry4x32: rounds must be a non-negative int, got {rounds!r}")
    key = _as_words("key", key)
    counter = _as_words("counter", counter)
    shape = np.broadcast_shapes(key.shape, counter.shape)
    # Flattening to 2-D keeps every lane a 1-D array even for a single block: numpy's wrapping
    # arithmetic is silent on arrays but warns on the scalars that 0-d operations produce.
    key = np.broadcast_to(key, shape).reshape(-1, 4)
    counter = np.broadcast_to(counter, shape).reshape(-1, 4)

    ks = [key[:, j].copy() for j in range(4)]
    ks.append(ks[0] ^ ks[1] ^ ks[2] ^ ks[3] ^ _U32(KEY_SCHEDULE_PARITY))
    x = [counter[:, j] + ks[j] for j in range(4)]

    for r in range(rounds):
        rot_a, rot_b = ROTATIONS[r % 8]
        # Even rounds mix (x0, x1) and (x2, x3); odd rounds (x0, x3) and (x2, x1): Threefish's
        # word permutation for 4 words, written as a change of pairing instead of a swap.
        lo, hi = (1, 3) if r % 2 == 0 else (3, 1)
        x[0] = x[0] + x[lo]
        x[lo] = _rotl(x[lo], rot_a) ^ x[0]
        x[2] = x[2] + x[hi]
        x[hi] = _rotl(x[hi], rot_b) ^ x[2]
        if r % 4 == 3:
            s = (r + 1) // 4
            for j in range(4):
                x[j] = x[j] + ks[(s + j) % 5]
            x[3] = x[3] + _U32(s)

    return np.stack(x, axis=-1).reshape(shape)


FLOAT32_UNIFORM_SHIFT = 8
"""A float32 uniform keeps the top ``32 - 8 = 24`` bits of a word: exactly float32's precision."""

FLOAT64_UNIFORM_SHIFT = 11
"""A float64 uniform keeps the top ``64 - 11 = 53`` bits of two words: float64's precision."""


def uniform_float32(bits) -> np.ndarray:
    """Four float32 uniforms in [0, 1) from each uint4x32, one per 32-bit word.

    The rule every backend reproduces bit for bit: for each word ``w``,
    ``u = float32(w >> 8) * 2**-24``. The shifted value has 24 significant bits, so converting it
    to float32 and scaling by a power of two are both exact: no rounding mode can make backends
    disagree, and the largest result is ``1 - 2**-24 < 1``. Input shape ``(..., 4)``, output shape
    ``(..., 4)`` float32 (lane ``j`` from word ``j``).
    """
    words = _as_words("bits", bits)
    top = (words >> _U32(FLOAT32_UNIFORM_SHIFT)).astype(np.float32)
    return top * np.float32(2.0**-24)


def uniform_float64(bits) -> np.ndarray:
    """Two float64 uniforms in [0, 1) from each uint4x32, one per pair of words.

    The rule every backend reproduces bit for bit: words (w0, w1) and (w2, w3) each form the
    64-bit integer ``v = (hi << 32) | lo`` with the *odd* word high (``w1``, ``w3``) and the even
    word low, and ``u = float64(v >> 11) * 2**-53``. As for float32 the kept 53 bits are exactly
    float64's significand, so every step is exact and the largest result is ``1 - 2**-53``.
    (The original computed ``v * 2**-64``, which rounds and can return 1.0.) Input shape
    ``(..., 4)``, output shape ``(..., 2)`` float64.
    """
    words = _as_words("bits", bits).astype(np.uint64)
    lo = words[..., 0::2]
    hi = words[..., 1::2]
    combined = (hi << np.uint64(32)) | lo
    top = (combined >> np.uint64(FLOAT64_UNIFORM_SHIFT)).astype(np.float64)
    return top * 2.0**-53


def uniform1_float32(bits) -> np.ndarray:
    """One float32 uniform per uint4x32, from word 0 by :func:`uniform_float32`'s rule.

    This is the pointwise form used when each output cell gets its own 128-bit block (the
    default parameter initialization, ``uniform1``); the other three words are
    unused. Input shape ``(..., 4)``, output shape ``(...)``.
    """
    return uniform_float32(bits)[..., 0]


def uniform1_float64(bits) -> np.ndarray:
    """One float64 uniform per uint4x32: words 0 (low) and 1 (high) by :func:`uniform_float64`.

    The pointwise float64 counterpart of :func:`uniform1_float32`. Input shape ``(..., 4)``,
    output shape ``(...)``.
    """
    return uniform_float64(bits)[..., 0]
