"""Small two-class datasets made on the fly, and batching.

The moons demo (docs/training.md, "The moons demo") trains on two interleaved half moons;
:func:`circles` is the same kind of toy problem with a boundary an MLP must close. Both return
numpy arrays ready for ``oc.tensor(..., batch=1)``: points ``float32 (n, 2)``, labels
``float32 (n, 1)`` holding +1 or -1 (the hinge loss ``relu(1 - y * score)`` wants signed labels).
Rows alternate between the two classes (row ``2i`` of the first, ``2i + 1`` of the second), so
every batch of an even size is balanced without shuffling, as in the original.

Noise is uniform in ``[-noise, noise]`` per coordinate, drawn from
``numpy.random.default_rng(seed)``: the same seed gives the same bits on every run and machine.
The original drew its noise from its own xorshift generator; any seeded uniform noise is
acceptable, since what is asserted of the demo is convergence (last epoch's loss < 0.1), never
particular values.
"""

from __future__ import annotations

import numpy as np


def _two_classes(first: np.ndarray, second: np.ndarray, noise: float, seed: int):
    """Interleave two ``(k, 2)`` clouds (rows 2i, 2i+1), add seeded uniform noise, label +1 / -1."""
    if noise < 0:
        raise ValueError(f"noise must be >= 0 (the half-width of the uniform noise), got {noise}")
    k = first.shape[0]
    points = np.empty((2 * k, 2), dtype=np.float64)
    points[0::2] = first
    points[1::2] = second
    rng = np.random.default_rng(seed)
    points += rng.uniform(-noise, noise, size=points.shape)
    labels = np.empty((2 * k, 1), dtype=np.float32)
    labels[0::2] = 1.0
    labels[1::2] = -1.0
    return points.astype(np.float32), labels


def _check_even(name: str, n: int) -> None:
    """``n`` counts both classes, half each, so it must be a positive even int."""
    if isinstance(n, (int, np.integer)) and n > 0 and n % 2 == 0:
        return
    hint = f" (try n={n + 1})" if isinstance(n, (int, np.integer)) and n > 0 else ""
    raise ValueError(
        f"{name}: n is the total number of points, half per class, so it must be a "
        f"positive even int; got {n!r}{hint}"
    )


def moons(n: int = 800, noise: float = 0.1, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two interleaved half moons: ``n`` points, ``n/2`` per class.

    For ``i < n/2`` and ``v = i * pi / (n/2)``: row ``2i`` is moon A at ``(cos v, sin v)``, label
    +1; row ``2i+1`` is moon B at ``(1 - cos v, 0.5 - sin v)``, label -1; each coordinate then
    gets uniform noise in ``[-noise, noise]``. The defaults are the demo's data: 800 points, noise
    0.1. Returns ``(points float32 (n, 2), labels float32 (n, 1))``.
    """
    _check_even("moons", n)
    v = np.arange(n // 2) * (np.pi / (n // 2))
    moon_a = np.stack([np.cos(v), np.sin(v)], axis=1)
    moon_b = np.stack([1.0 - np.cos(v), 0.5 - np.sin(v)], axis=1)
    return _two_classes(moon_a, moon_b, noise, seed)


def circles(
    n: int = 800, noise: float = 0.1, factor: float = 0.5, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Two concentric circles: ``n`` points, the inner circle labelled +1, the outer one -1.

    For ``i < n/2`` and ``v = i * 2pi / (n/2)``: row ``2i`` is ``factor * (cos v, sin v)`` (the
    inner circle, radius ``factor``), row ``2i+1`` is ``(cos v, sin v)`` (radius 1); then uniform
    noise in ``[-noise, noise]`` per coordinate. A linear model cannot separate them, which is
    the point. Returns ``(points float32 (n, 2), labels float32 (n, 1))``.
    """
    _check_even("circles", n)
    if not 0 < factor < 1:
        raise ValueError(
            f"circles: factor is the inner radius over the outer one, in (0, 1); got {factor}"
        )
    v = np.arange(n // 2) * (2 * np.pi / (n // 2))
    outer = np.stack([np.cos(v), np.sin(v)], axis=1)
    return _two_classes(factor * outer, outer, noise, seed)


def batches(array: np.ndarray, batch_size: int) -> np.ndarray:
    """Split the leading axis in two: ``(n, ...)`` -> ``(n / batch_size, batch_size, ...)``.

    The result is a reshape (a view when ``array`` is contiguous), so batch ``b`` is rows
    ``b * batch_size`` to ``(b + 1) * batch_size - 1`` in order. Its leading axis is the one an
    index symbol slices: ``oc.tensor(batches(x, 10), batch=2)[batch_n]`` with
    ``batch_n = oc.IndexSymbol("batch_n", n_batches)``. Rows are never dropped silently: a
    batch size that does not divide ``n`` is an error that says how to fix it.
    """
    array = np.asarray(array)
    if not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
        raise ValueError(f"batches: batch_size must be a positive int, got {batch_size!r}")
    if array.ndim == 0:
        raise ValueError("batches: expected an array with a leading axis of examples, got a scalar")
    n = array.shape[0]
    if n % batch_size:
        divisors = [d for d in range(1, min(n, 4 * batch_size) + 1) if n % d == 0]
        nearest = min(divisors, key=lambda d: abs(d - batch_size)) if divisors else 1
        keep = n - n % batch_size
        trim = (
            f", or drop the last rows first: batches(array[:{keep}], {batch_size})" if keep else ""
        )
        raise ValueError(
            f"batches: {n} rows do not split into batches of {batch_size} "
            f"({n} % {batch_size} = {n % batch_size}). Use a batch size that divides {n} "
            f"(e.g. {nearest}){trim}"
        )
    return array.reshape((n // batch_size, batch_size) + array.shape[1:])
