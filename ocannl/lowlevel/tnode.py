"""Tensor nodes: the buffers the compiler reads and writes (docs/compiler.md).

A tensor has a value node and, when differentiable, a gradient node. The compiler half sees only
nodes: their id, label, dims, precision and memory mode. Dims may be given late (shape inference
runs after the tensor is created): pass a callable, or assign ``tnode.dims`` later.

Every node has a :attr:`TNode.name` that generated code and printed IRs use. User labels never
reach generated source as they are: a name is the label sanitized to ``[A-Za-z0-9_]`` (accents
folded, other runs one ``_``; never a leading digit or underscore), is reserved in no target (no
keyword, builtin, header macro, or name the emitters generate: ocannl/lowlevel/identifiers.py),
and is unique in the session (a collision gets the node id as a suffix). A gradient node's name
is its value's name plus ``_grad``; the printed IRs show it as ``<value name>.grad``
(:attr:`TNode.debug_name`).
"""

from __future__ import annotations

import enum
import operator
from typing import Callable

from ocannl import session
from ocannl.errors import ShapeError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.identifiers import Namespace, sanitize_identifier


class MemoryMode(enum.Enum):
    """Where a node's value lives (docs/compiler.md, "Tensor nodes"). ``None`` on a node means
    undecided, and the node keeps a buffer: only ``VIRTUAL`` nodes may lose theirs (optimize.py).
    """

    VIRTUAL = "virtual"
    """Need not persist: the optimizer may give it no storage and recompute it inline wherever a
    routine reads it (a node it cannot inline keeps a buffer). See :func:`mark_virtual` and
    ocannl/lowlevel/optimize.py; any other mode, and ``None``, keeps the node's buffer."""
    LOCAL = "local"
    """Storage private to one run of one routine; not visible afterwards."""
    ON_DEVICE = "on_device"
    """A buffer of the context that persists across runs."""
    MATERIALIZED = "materialized"
    """Persists across runs and is readable from the host (parameters, outputs, data)."""


_ids = session.Counter()
_names = Namespace()
"""The session's node names: unique across the session, reserved in no target."""


@session.on_reset
def _reset_names() -> None:
    global _names
    _names = Namespace()


def _claim_name(base: str, node_id: int) -> str:
    """A session-unique node name built from ``base`` (``n<id>`` when ``base`` is empty); a
    taken or reserved base gets the node id as a suffix (identifiers.py)."""
    return _names.claim(base or f"n{node_id}", node_id)


DimsSource = tuple[int, ...] | Callable[[], tuple[int, ...]] | None


class TNode:
    """One buffer: a tensor's value or, with ``grad_of``, its gradient.

    ``dims`` is the full shape in memory order (batch, output, input; row-major). Give it as a
    tuple, as a zero-argument callable evaluated when first needed (after shape inference), or
    assign it later; reading it before it is known raises :class:`ShapeError`. A gradient has its
    value's dims unless told otherwise, and its label and name derive from its value's. Nodes
    hash and compare by identity.
    """

    __slots__ = ("id", "label", "dtype", "memory_mode", "grad_of", "name", "_dims")

    def __init__(
        self,
        label: str = "",
        dims: DimsSource = None,
        dtype: DType = dtypes.DEFAULT,
        *,
        memory_mode: MemoryMode | None = None,
        grad_of: TNode | None = None,
    ):
        self.id = next(_ids)
        self.label = label if grad_of is None else f"{grad_of.label}.grad"
        self.dtype = dtype
        self.memory_mode = memory_mode
        self.grad_of = grad_of
        base = sanitize_identifier(label) if grad_of is None else f"{grad_of.name}_grad"
        self.name = _claim_name(base, self.id)
        self._dims: DimsSource = None
        self.dims = dims if dims is not None or grad_of is None else (lambda: grad_of.dims)

    @property
    def is_grad(self) -> bool:
        return self.grad_of is not None

    @property
    def debug_name(self) -> str:
        """The name printed in ``.cd`` and ``.ll`` files: ``w1``, or ``w1.grad`` for a gradient."""
        return f"{self.grad_of.name}.grad" if self.grad_of is not None else self.name

    @property
    def dims_known(self) -> bool:
        return self._dims is not None

    @property
    def dims(self) -> tuple[int, ...]:
        if self._dims is None:
            raise ShapeError(
                f"the dims of {self.debug_name} are not known yet (shape inference has not set them)"
            )
        if callable(self._dims):
            self._dims = _check_dims(self, self._dims())
        return self._dims

    @dims.setter
    def dims(self, dims: DimsSource) -> None:
        if isinstance(self._dims, tuple) and (
            dims is None or callable(dims) or _check_dims(self, dims) != self._dims
        ):
            raise ShapeError(
                f"{self.debug_name}: dims already fixed to {self._dims}, cannot change them to {dims}"
            )
        self._dims = dims if dims is None or callable(dims) else _check_dims(self, dims)

    @property
    def size(self) -> int:
        """The number of cells (1 for a scalar of dims ``()``)."""
        n = 1
        for d in self.dims:
            n *= d
        return n

    def __repr__(self) -> str:
        dims = self._dims if isinstance(self._dims, tuple) else "?"
        return f"TNode({self.debug_name}, dims={dims}, {self.dtype.name})"


def mark_virtual(node: TNode) -> None:
    """Let the optimizer inline ``node`` (an intermediate result nobody reads from the host or
    from a later routine). A mode already set (a request to materialize) wins."""
    if node.memory_mode is None:
        node.memory_mode = MemoryMode.VIRTUAL


def mark_materialized(node: TNode) -> None:
    """Keep ``node`` in a buffer that persists and that the host can read (``ctx.get``), also
    when it was marked virtual. Takes effect for routines compiled afterwards."""
    if node.memory_mode in (None, MemoryMode.VIRTUAL):
        node.memory_mode = MemoryMode.MATERIALIZED


def _check_dims(node: TNode, dims: object) -> tuple[int, ...]:
    try:
        checked = tuple(operator.index(d) for d in dims)  # type: ignore[union-attr]
    except TypeError:
        checked = (-1,)
    if any(d < 0 for d in checked):
        raise ShapeError(f"{node.debug_name}: dims must be a sequence of non-negative ints, got {dims!r}")
    return checked
