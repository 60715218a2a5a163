"""``oc.explain_shapes(t)``: why each inferred dim is what it is, where the solver chose it."""

from __future__ import annotations

from ocannl.shape.projections import At
from ocannl.shape.logic import Compose, Pointwise
from ocannl.shape.shape import KINDS
from ocannl.shape import solver as solver_mod
from ocannl.tensor import Tensor, finish_inference


def _subgraph(t: Tensor) -> list[Tensor]:
    seen: dict[int, Tensor] = {}
    stack = [t]
    while stack:
        u = stack.pop()
        if u.id in seen:
            continue
        seen[u.id] = u
        stack.extend(u.operands)
    return sorted(seen.values(), key=lambda u: u.id)


def explain_shapes(t: Tensor) -> str:
    """Finalize inference, then list, for ``t`` and every tensor it is computed from, each dim the
    solver fixed by closing (learned from a use, or a default) and each operand axis that
    broadcasts (size 1 against a larger result axis), with the reason. Returns the text (also
    usable with ``print``)."""
    finish_inference()
    lines: list[str] = []
    s = solver_mod.current()
    for u in _subgraph(t):
        notes = list(u._shape.explanations)
        if isinstance(u.logic, (Pointwise, Compose)):
            slots = u.logic.layout(u._shape, [o._shape for o in u.operands], s)
            for j, (o, terms) in enumerate(zip(u.operands, slots[1:])):
                pos = 0
                for kind in KINDS:
                    for i, _ in enumerate(o._shape.row(kind).dims):
                        if isinstance(terms[pos], At):
                            notes.append(f"operand {j + 1} ({o.label}) {kind} axis {i} of size 1 broadcasts")
                        pos += 1
        header = f"#{u.id} {u.label} ({u.op}): {u.shape}"
        lines.append(header)
        lines.extend(f"    {n}" for n in notes)
    return "\n".join(lines)
