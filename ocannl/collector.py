"""Python's cyclic garbage collector, paused while the framework builds a program.

Building a deep network's training routine makes millions of small objects that live until the
build ends: tensors and their code, the assignments and loop IR trees, plans, printed lines. The
collector counts allocations and, every few hundred thousand of them, walks every object that
survived the earlier walks, so the walks grow with what is alive and come more often the more is
made: building the 12-block GPT of ``bench/cpu_steps.py`` spent 0.45 s of its 2 s of Python in
the collector (0.06 s of 0.5 s at 2 blocks), nearly all of it in full walks that found nothing
to free. The IR is made of frozen dataclasses that reference no object that references them
back, so reference counting frees whatever a build drops; cycles are rare and wait for the next
collection after the build.

:func:`paused` pauses the collector for a build (``Context.compile``, ``train.grad_update``) and
restores it after. Pauses nest and may come from several threads: the collector runs again once
the last one ends, and only if it ran before the first began (a user who turned it off keeps it
off). When it runs again, every object then tracked moves to the oldest generation
(``gc.freeze`` then ``gc.unfreeze``) instead of waiting in the youngest: the first collection
after a build would otherwise walk all that the build made, and a cycle that became garbage
during the build is freed at the next full collection instead. (Not where the user froze
objects with ``gc.freeze``, as a server does before it forks: unfreezing would undo that.)
Building the 12-block GPT took 1.96 s of Python with the collector running, 1.83-1.94 paused,
1.57-1.72 paused and its objects moved (one core, processes taking turns).
"""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator

_lock = threading.Lock()
_pauses = 0
_was_enabled = False


@contextmanager
def paused() -> Iterator[None]:
    """Inside, the cyclic garbage collector does not run (module docstring)."""
    global _pauses, _was_enabled
    with _lock:
        if _pauses == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _lock:
            _pauses -= 1
            if _pauses == 0 and _was_enabled:
                if gc.get_freeze_count() == 0:  # a user's frozen objects stay frozen
                    gc.freeze()  # what the build made joins the oldest generation, unwalked (docstring)
                    gc.unfreeze()
                gc.enable()
