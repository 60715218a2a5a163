import re

import pytest

from ocannl import session
from ocannl.errors import ShapeError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.tnode import MemoryMode, TNode, sanitize_identifier

IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")


def test_ids_count_per_session():
    assert [TNode("a").id, TNode("b").id] == [1, 2]
    session.reset()
    assert TNode("c").id == 1


def test_plain_labels_are_names():
    assert TNode("w1").name == "w1"
    assert TNode("moons input").name == "moons_input"
    assert TNode("").name == "n3"


def test_collisions_get_the_id():
    first, second = TNode("w"), TNode("w")
    assert (first.name, second.name) == ("w", "w_2")
    third = TNode("w_2")  # a user label equal to a generated name
    assert third.name not in (first.name, second.name)


@pytest.mark.parametrize(
    "label",
    ['a"; system("rm', "*/", "\n", "ñandú", "return", "float", "exp", "1st", "__init__", "i0", "v3",
     "half", "tl", "class", "x" * 300, "a\x00b", "/* c */", "日本"],
)
def test_hostile_labels_never_reach_code(label):
    node = TNode(label)
    assert IDENTIFIER.match(node.name), node.name
    assert len(node.name) < 70
    assert not re.fullmatch(r"[iv][0-9]+", node.name)


def test_sanitization_details():
    assert sanitize_identifier('a"; system("rm') == "a_system_rm"
    assert sanitize_identifier("*/") == ""
    assert sanitize_identifier("1st") == "n_1st"
    assert TNode("return").name == "return_1"
    assert TNode("ñandú").name == "nandu"  # accents fold to ASCII letters
    assert TNode("*/").name == "n3"
    assert TNode("ⅰ").name == "i" and TNode("i").name == "i_5"  # NFKC-equal names collide


def test_grad_names():
    w = TNode("w1")
    g = TNode(grad_of=w)
    assert g.is_grad and not w.is_grad
    assert (g.name, g.debug_name, w.debug_name) == ("w1_grad", "w1.grad", "w1")
    w.dims = (16, 2)
    assert g.dims == (16, 2)
    assert TNode("w1 grad").name == "w1_grad_3"  # the grad took w1_grad


def test_lazy_dims():
    inferred = []
    node = TNode("h", lambda: tuple(inferred))
    inferred.extend([10, 16])
    assert node.dims == (10, 16) and node.size == 160
    later = TNode("later")
    assert not later.dims_known
    with pytest.raises(ShapeError, match="dims of later are not known"):
        later.dims
    later.dims = [3, 4]
    assert later.dims == (3, 4)
    later.dims = (3, 4)
    with pytest.raises(ShapeError, match="already fixed"):
        later.dims = (4, 3)
    with pytest.raises(ShapeError, match="non-negative"):
        TNode("bad", (2, -1))


def test_defaults():
    node = TNode("x", (2,))
    assert node.dtype is dtypes.float32 and node.memory_mode is None
    assert TNode("p", (), memory_mode=MemoryMode.MATERIALIZED).memory_mode is MemoryMode.MATERIALIZED
    assert repr(node) == "TNode(x, dims=(2,), float32)"
