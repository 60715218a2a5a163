"""What the contexts and routines of a session share: the default context, the live contexts,
the context that last wrote each node, and the epoch of :meth:`~ocannl.backends.routine.Routine.run`'s
fast path. One object, :data:`session_state`, holds them, and a session reset
(``ocannl/session.py``) forgets them; the tensor frontend reads it to find a tensor's value."""

from __future__ import annotations

import itertools
import weakref
from typing import TYPE_CHECKING

from ocannl import session
from ocannl.lowlevel.tnode import TNode

if TYPE_CHECKING:
    from ocannl.backends.context import Context


class SessionState:
    """The runtime's process-wide state."""

    def __init__(self) -> None:
        self.epoch = 0
        """Advanced by every change to what a full :meth:`Routine.run` checks or records: a buffer
        created or replaced, a node inlined, a routine's writes recorded (:meth:`record_writer`).
        While it stays at the value a routine saw after its last full run, running it again would
        check and record nothing new, so the routine skips straight to the executable."""
        self._epochs = itertools.count(1)
        """The values ``epoch`` takes, each once, across resets too: drawing one is atomic, so
        threads changing contexts at once never leave two changes under one epoch."""
        self.default: Context | None = None
        """The context ``default_context()`` returns (``ocannl/backends/context.py``)."""
        self.contexts: weakref.WeakSet[Context] = weakref.WeakSet()
        """Every live context (``t.set`` updates those holding the tensor)."""
        self._last_writers: dict[int, weakref.ref[Context]] = {}
        """Node id -> the context whose routine last wrote it (``t.numpy()`` reads from there)."""
        session.on_reset(self.reset)

    def advance_epoch(self) -> None:
        self.epoch = next(self._epochs)

    def contexts_holding(self, tnode: TNode) -> list[Context]:
        """Every live context with a buffer for ``tnode``."""
        return [ctx for ctx in list(self.contexts) if ctx.has_value(tnode)]

    def last_writer(self, tnode: TNode) -> Context | None:
        """The context whose routine last computed ``tnode``, if it is still alive."""
        ref = self._last_writers.get(tnode.id)
        return ref() if ref is not None else None

    def record_writer(self, tnode: TNode, context: weakref.ref[Context]) -> bool:
        """Record ``context`` as the last writer of ``tnode``; whether that changed the record."""
        writer = self._last_writers.get(tnode.id)
        if writer is not None and writer() is context():
            return False
        self._last_writers[tnode.id] = context
        return True

    def reset(self) -> None:
        """A fresh session: no default context, no writers; every routine runs its checks again."""
        self.default = None
        self._last_writers.clear()
        self.advance_epoch()


session_state = SessionState()
