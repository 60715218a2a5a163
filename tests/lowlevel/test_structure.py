"""Statement structures (ocannl/lowlevel/structure.py): equal for the same code on other
buffers, composed over a sequence as one walk would tell, and fingerprinted alike in every
process."""

import os
import subprocess
import sys

from ocannl.lowlevel import dtypes
from ocannl.lowlevel.indexing import Iter, Symbol
from ocannl.lowlevel.ir import Binary, Const, Load, Store, loop, seq
from ocannl.lowlevel.scalar_ops import Binop
from ocannl.lowlevel.structure import fingerprint, sequence_structure, structure
from ocannl.lowlevel.tnode import TNode


def _scale(src: TNode, dst: TNode, factor: float = 2.0):
    i = Symbol()
    value = Binary(Binop.MUL, Load(src, (Iter(i),)), Const(factor, dtypes.float32))
    return loop(i, 8, Store(dst, (Iter(i),), value))


def _nodes(*names):
    return [TNode(n, (8,)) for n in names]


def test_the_same_code_on_other_buffers_has_the_same_structure():
    a, b, c, d = _nodes("a", "b", "c", "d")
    first, second = structure(_scale(a, b)), structure(_scale(c, d))
    assert first.key == second.key and first.nodes == (b, a) and second.nodes == (d, c)  # the store first
    assert structure(_scale(a, b, 3.0)).key != first.key  # constants are part of it


def test_a_sequence_structure_tells_which_buffers_its_statements_share():
    a, b, c, d, e, f = _nodes("a", "b", "c", "d", "e", "f")
    chained = sequence_structure([structure(_scale(a, b)), structure(_scale(b, c))])  # b: out, then in
    also_chained = sequence_structure([structure(_scale(d, e)), structure(_scale(e, f))])
    apart = sequence_structure([structure(_scale(a, b)), structure(_scale(c, d))])
    assert chained.key == also_chained.key and chained.nodes == (b, a, c)
    assert apart.key != chained.key and apart.nodes == (b, a, d, c)
    # As a walk over the sequence would tell: the same statements, the same sharing.
    assert (structure(seq(_scale(a, b), _scale(b, c))).key == structure(seq(_scale(d, e), _scale(e, f))).key)


def test_a_fingerprint_is_the_same_in_every_process():
    a, b = _nodes("a", "b")
    here = fingerprint(structure(_scale(a, b)).key)
    script = ("from tests.lowlevel.test_structure import _nodes, _scale\n"
              "from ocannl.lowlevel.structure import fingerprint, structure\n"
              "print(fingerprint(structure(_scale(*_nodes('a', 'b'))).key))\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=root)
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        assert int(done.stdout) == here
