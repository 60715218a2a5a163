"""Process-wide session state and its reset.

Id counters, the default context and the PRNG seed are global to a session; they feed labels,
golden files and PRNG keys, so tests reset them (``tests/conftest.py``) to stay independent.
Each module that owns such state registers a reset function here, so this module imports none of
them.
"""

from __future__ import annotations

from typing import Callable

_resetters: list[Callable[[], None]] = []


def on_reset(fn: Callable[[], None]) -> Callable[[], None]:
    """Register ``fn`` to run on :func:`reset` (usable as a decorator)."""
    _resetters.append(fn)
    return fn


def reset() -> None:
    """Forget every tensor, counter, default context and seed: a fresh session."""
    for fn in _resetters:
        fn()
