"""Session counters (ocannl/session.py): every numbering restarts at 1 when the session resets, so
labels and printed IR do not depend on the tests that ran before."""

import ocannl.session
from ocannl.lowlevel.indexing import Symbol
from ocannl.lowlevel.tnode import TNode
from ocannl.shape.shape import DimVar, RowVar


def fresh_ids() -> tuple[int, ...]:
    return DimVar().id, RowVar("r").id, Symbol().id, Symbol().id, TNode("a", (2,)).id


def test_counters_restart_with_the_session():
    first = fresh_ids()
    assert first == (1, 2, 1, 2, 1)  # dim and row variables share one numbering
    assert fresh_ids() != first
    ocannl.session.reset()
    assert fresh_ids() == first
    assert repr(DimVar("k")) == "?k3" and repr(RowVar()) == "..r4.."
