"""Projections: the loops of one operation, and how each operand axis is indexed by them.

Once shapes are concrete, every operation describes its slots (result first, then operands) as
lists of *axis terms*, one per axis in memory order (batch, output, input):

* :class:`Loop` ``key``: iterated by the loop named ``key``; axes with equal keys share the loop
  (the same einsum label, or a result axis and the operand axis broadcast into it);
* :class:`At`: a fixed position (a fixed index in a spec, or 0 where a size-1 operand axis
  broadcasts);
* :class:`Static`: the value of an index symbol bound at run time (batch slicing);
* :class:`Conv`: ``stride*over + dilation*kernel + offset - left_pad`` (convolution and strided
  axes);
* :class:`Strided`: ``offset + sum(stride * loop)`` (static slices and reshapes).

:func:`derive_projections` turns such a layout into :class:`~ocannl.lowlevel.indexing.Projections`:
one product-space loop per distinct key whose size is not 1, in order of first occurrence
(result slot first), so a key absent from the result is a reduction (docs/shapes.md, "Projections"). A
size-1 axis is the fixed index 0; a size-0 axis is a loop that runs no iteration, so a sum over it
is 0 and a result with it has no cells (docs/semantics.md, "Numerics").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Union

from ocannl.errors import ShapeError
from ocannl.lowlevel.analysis import provably_within
from ocannl.lowlevel.indexing import Affine, AxisIndex, Fixed, IndexSymbol, Iter, Projections, Symbol


@dataclass(frozen=True)
class Loop:
    key: Hashable
    size: int


@dataclass(frozen=True)
class At:
    index: int


@dataclass(frozen=True)
class Static:
    symbol: IndexSymbol


@dataclass(frozen=True)
class Conv:
    """``stride*over + dilation*kernel + offset - left_pad`` over the loops of ``over`` and
    ``kernel`` (``kernel`` is None for a pure strided axis)."""

    over: Loop
    stride: int
    kernel: Loop | None
    dilation: int
    offset: int
    left_pad: int


@dataclass(frozen=True)
class Strided:
    """``offset + sum(stride * loop)``: one axis indexed by several loops at once, as a reshape
    reads a run of axes as one (``logic.Regroup``), or by one loop with a step and a start, as a
    slice ``t[1::2]`` reads its axis (``logic.StaticIndex``)."""

    loops: tuple[tuple[int, Loop], ...]
    offset: int = 0


Term = Union[Loop, At, Static, Conv, Strided]


def padding_left(kernel_size: int, dilation: int) -> int:
    """Left padding of a padded (``=+``) convolution: ``(span - 1) // 2`` with
    ``span = dilation*(kernel-1) + 1``, the centred "same" convolution of PyTorch for odd kernels.

    The original pads by the undilated kernel size and one cell more than needed (which
    looks unintended); we pad by what the dilated window needs, so the output size is exactly
    ``input / stride``. Reads falling in the margin see the operation's neutral element."""
    span = dilation * (kernel_size - 1) + 1
    return (span - 1) // 2


def derive_projections(slots: list[list[Term]], dims: list[tuple[int, ...]], debug: str = "") -> Projections:
    """``slots[0]`` is the result, ``slots[1:]`` the operands, ``dims[i]`` the dims of slot ``i``;
    see the module docstring."""
    iterators: dict[Hashable, Symbol] = {}
    sizes: dict[Hashable, int] = {}
    order: list[Hashable] = []

    def loop_index(loop: Loop) -> Symbol | None:
        known = sizes.get(loop.key)
        if known is not None and known != loop.size:
            raise ShapeError(f"{debug}: conflicting sizes {known} and {loop.size} for the same loop")
        if loop.size == 1:
            sizes[loop.key] = loop.size
            return None
        if loop.key not in iterators:
            iterators[loop.key] = Symbol()
            sizes[loop.key] = loop.size
            order.append(loop.key)
        return iterators[loop.key]

    def index(term: Term, dim: int | None) -> AxisIndex:
        if isinstance(term, At):
            return Fixed(term.index)
        if isinstance(term, Static):
            return Iter(term.symbol)
        if isinstance(term, Loop):
            sym = loop_index(term)
            return Fixed(0) if sym is None else Iter(sym)
        if isinstance(term, Strided):
            loops, offset = term.loops, term.offset
        else:
            loops = ((term.stride, term.over),) + (((term.dilation, term.kernel),) if term.kernel is not None else ())
            offset = term.offset - term.left_pad
        parts: list[tuple[int, Symbol]] = []
        extents: dict[Symbol, int] = {}
        for coefficient, loop in loops:
            sym = loop_index(loop)
            if sym is not None:
                parts.append((coefficient, sym))
                extents[sym] = loop.size
        # A plain loop index or a constant only where it provably stays inside the axis: an
        # index that may leave it (a padded window over a size-1 axis) stays affine, so that
        # lowering reads the neutral element there.
        inside = dim is None or provably_within(Affine(tuple(parts), offset), dim, extents)
        if inside and len(parts) == 1 and parts[0][0] == 1 and offset == 0:
            return Iter(parts[0][1])
        if inside and not parts:
            return Fixed(offset)
        return Affine(tuple(parts), offset)

    def slot_indices(j: int) -> tuple[AxisIndex, ...]:
        slot = slots[j]
        slot_dims = dims[j] if j < len(dims) else ()
        axis_dims = slot_dims if len(slot_dims) == len(slot) else (None,) * len(slot)
        return tuple(index(t, d) for t, d in zip(slot, axis_dims))

    project = [slot_indices(j) for j in range(len(slots))]
    return Projections(
        product_space=tuple(sizes[k] for k in order),
        product_iterators=tuple(iterators[k] for k in order),
        lhs_dims=dims[0],
        rhs_dims=tuple(dims[1:]),
        project_lhs=project[0],
        project_rhs=tuple(project[1:]),
        debug=debug,
    )




def identity_projections(dims: tuple[int, ...], operand_dims: list[tuple[int, ...]],
                         debug: str = "") -> Projections:
    """Every operand indexed like the result, axis by axis (e.g. ``v =* 0.1`` over all of ``v``);
    an operand of dims ``()`` (a constant) gets no indices."""
    terms = [Loop(("axis", p), d) for p, d in enumerate(dims)]
    slots = [terms] + [terms if od else [] for od in operand_dims]
    return derive_projections(slots, [dims, *operand_dims], debug)


def retarget(proj: Projections, lhs_slot: int, rhs_slots: list[int], debug: str = "") -> Projections:
    """The same loops with other slots as result and operands (slot 0 is the original result,
    slot ``j`` its ``j``-th operand): a gradient ``g1 =+ g * v2`` writes operand 1's slot and
    reads the result's and operand 2's, over the forward op's product space, so a
    reduction of the forward pass becomes a broadcast backward, and a broadcast a reduction."""
    indices = (proj.project_lhs, *proj.project_rhs)
    dims = (proj.lhs_dims, *proj.rhs_dims)
    return Projections(
        product_space=proj.product_space,
        product_iterators=proj.product_iterators,
        lhs_dims=dims[lhs_slot],
        rhs_dims=tuple(dims[k] for k in rhs_slots),
        project_lhs=indices[lhs_slot],
        project_rhs=tuple(indices[k] for k in rhs_slots),
        debug=debug or proj.debug,
    )
