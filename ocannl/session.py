"""Process-wide session state and its reset.

Id counters, the default context and the PRNG seed are global to a session; they feed labels,
golden files and PRNG keys, so tests reset them (``tests/conftest.py``) to stay independent.
Each module that owns such state registers a reset function here, so this module imports none of
them.
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterator

_resetters: list[Callable[[], None]] = []


def on_reset(fn: Callable[[], None]) -> Callable[[], None]:
    """Register ``fn`` to run on :func:`reset` (usable as a decorator)."""
    _resetters.append(fn)
    return fn


def reset() -> None:
    """Forget every tensor, counter, default context and seed: a fresh session."""
    for fn in _resetters:
        fn()


class Counter(Iterator[int]):
    """Ids ``1, 2, 3, ...`` that start again at 1 when the session is reset (``next(counter)``
    draws one). Tensors, nodes, loop symbols and shape variables are numbered this way, and the
    numbers show in labels, printed IR and golden files, so two tests number alike."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        on_reset(self._restart)

    def _restart(self) -> None:
        self._ids = itertools.count(1)

    def __next__(self) -> int:
        return next(self._ids)
