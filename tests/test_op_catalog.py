"""The operator catalog (ocannl/ops.py): each operation is one ``OpDef``, a tensor keeps the
definition of its op, and the frontend modules import one another in one direction only.

The values and gradients of the catalog's ops are checked in test_forward_ops.py and
test_gradients.py; here, the structure they rely on, and an operation defined outside the catalog
module run through the whole pipeline on every backend.
"""

from __future__ import annotations

import ast
import dataclasses
import graphlib
from pathlib import Path

import numpy as np
import pytest

from backend_params import default_context
import ocannl as oc
from ocannl import ops, train
from ocannl.errors import SessionError
from ocannl.lowlevel.assignments import Accum, Apply, Arg
from ocannl.lowlevel.scalar_ops import Binop, Unop
from ocannl.shape.logic import Pointwise

PACKAGE = Path(ops.__file__).parent
FRONTEND = tuple(sorted(p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("__")))
"""The modules of the package's top level: the frontend and its helpers."""
BACKENDS = ("interp", "c", "metal", "triton")


def _runtime_imports(module: str) -> set[str]:
    """The frontend modules ``ocannl/<module>.py`` imports when it runs, at its top or inside a
    function (imports under ``if TYPE_CHECKING:`` are for annotations and never run)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    typing_only = {id(n) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
                   for n in ast.walk(node)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "ocannl":
                found |= {a.name for a in node.names}
            elif node.module.startswith("ocannl."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("ocannl.")}
    return found & set(FRONTEND) - {module}


def test_frontend_modules_import_one_way():
    """No import cycle among the frontend modules, deferred imports included: init.py below
    tensor.py, tensor.py below ops.py, and the blocks, draws and optimizers above the catalog."""
    graph = {m: _runtime_imports(m) for m in FRONTEND}
    order = list(graphlib.TopologicalSorter(graph).static_order())  # raises CycleError on a cycle
    assert {"tensor", "ops", "init", "nn", "train", "random"} <= set(FRONTEND)
    assert not graph["init"] & {"tensor", "ops", "nn", "train", "random"}
    assert "init" in graph["tensor"] and not graph["tensor"] & {"ops", "nn", "train", "random"}
    assert "ops" not in graph["train"]  # a tensor's own definition gives its backprop code
    assert order.index("init") < order.index("tensor") < order.index("ops") < order.index("nn")


def test_an_op_name_is_defined_once():
    with pytest.raises(SessionError, match="'mean' is defined twice"):
        ops.define(dataclasses.replace(ops.OPS["mean"]))
    assert ops.OPS["mean"] is ops.MEAN


def test_each_pointwise_row_is_an_op_and_a_public_function():
    public = {"not": "not_", "max": "maximum", "min": "minimum"}
    x, y, z = oc.tensor(np.ones(3)), oc.tensor(np.ones(3)), oc.tensor(np.ones(3))
    for name, fn, gradient in ops.POINTWISE:
        op = ops.OPS[name]
        args = (x, y, z)[:{Unop: 1, Binop: 2}.get(type(fn), 3)]
        t = getattr(oc, public.get(name, name))(*args)
        assert t.definition is op and t.op == name
        assert (op.gradient is None) == (gradient is None)
    assert ops.UNARY_OPS[:3] == ("relu", "sat01", "exp") and "not" in ops.UNARY_OPS
    assert ops.BINARY_OPS[-2:] == ("max", "min")


def test_operators_and_methods_dispatch_to_the_catalog():
    a, b = oc.param("a", output=3), oc.param("b", output=3)
    sym = oc.IndexSymbol("i", 2)
    xs = oc.tensor(np.ones((2, 3)), batch=1)
    assert (a + b).definition is ops.OPS["add"]
    reflected = 1 - a
    assert reflected.definition is ops.OPS["sub"] and reflected.operands[1] is a
    assert reflected.operands[0].is_constant
    assert (a @ b).definition is ops.COMPOSE
    assert (a <= b).definition is ops.OPS["not"] and (a <= b).operands[0].op == "gt"
    assert xs[sym].definition is ops.SLICE
    assert a.mean().definition is ops.MEAN and a.relu().op == "relu"
    with pytest.raises(AttributeError, match="no attribute 'compose'"):
        a.compose(b)  # an operator's function is not a method


def test_a_result_takes_no_gradient_without_its_ops_gradient():
    p = oc.param("p", output=3, init=1.0)
    assert (p * 2).requires_grad
    assert not (p < 2).requires_grad and (p < 2).backward_code() == []
    with pytest.raises(SessionError, match="not differentiable"):
        (p < 2).grad  # noqa: B018


def test_leaves_have_no_definition():
    data = oc.tensor(np.ones(2))
    assert data.definition is None
    with pytest.raises(SessionError, match="is a leaf"):
        data.forward_code()


# ---------------------------------------------------------------------------------------------
# An operation defined outside the catalog module: ``cube``, with its own forward and gradient.


def _cube_forward(t: oc.Tensor):
    (x,) = t.operands
    cube = Apply(Binop.MUL, (Apply(Binop.MUL, (Arg(0), Arg(0))), Arg(0)))
    return Accum(t.value, None, cube, (x.value,), t.projections, spec=".")


CUBE = ops.OpDef("cube", shape=lambda operands: Pointwise(), forward=_cube_forward,
                 gradient=ops.rules({1: (Binop.ADD, (Binop.MUL, "g", (Binop.MUL, 3.0, (Binop.MUL, "v1", "v1"))))}))


@pytest.fixture(params=BACKENDS)
def ctx(request) -> oc.Context:
    return default_context(request.param)


def test_an_op_defined_outside_the_catalog_runs_forward_and_backward(ctx):
    values = np.array([[1.5, -2.0, 0.5], [3.0, -0.25, 2.0]])
    w = oc.param("w", output=3, input=(), init=np.array([0.5, -1.0, 2.0]))
    x = oc.tensor(values, batch=1)
    y = CUBE(w * x, label="cube")
    assert y.definition is CUBE and "cube" not in ops.OPS
    loss = (y * oc.tensor(np.arange(1.0, 7.0).reshape(2, 3), batch=1)).sum()
    routine = ctx.compile(train.grad_update(loss))
    routine.run()
    h = np.array([0.5, -1.0, 2.0]) * values
    weights = np.arange(1.0, 7.0).reshape(2, 3)
    np.testing.assert_allclose(y.numpy(), h ** 3, rtol=1e-6)
    np.testing.assert_allclose(w.grad.numpy(), (weights * 3 * h ** 2 * values).sum(axis=0), rtol=1e-5)
