"""The runtime: contexts, routines, bindings, initializers, debug files, backend selection."""

import numpy as np
import pytest

from handbuilt import accum, matvec
from ocannl import config, session
from ocannl.backends import registry
from ocannl.backends.context import Context, default_context
from ocannl.backends.registry import register_backend
from ocannl.errors import BackendUnavailable, IndexBindingError, OcannlError, SessionError, ShapeError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.assignments import Block, Computation, Constant, Fetch, Slice, Values
from ocannl.lowlevel.indexing import IndexSymbol, Iter, Symbol
from ocannl.lowlevel.scalar_ops import Binop
from ocannl.lowlevel.tnode import TNode


@pytest.fixture(autouse=True)
def no_settings(monkeypatch, tmp_path):
    """Tests start with no OCANNL_* variables and no config file."""
    for key in ("OCANNL_BACKEND", "OCANNL_DEBUG_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)


def scaled_slice():
    """``x = xs[batch_n]; y = x * w`` with ``w`` initialized to 2 by an init."""
    batch_n = IndexSymbol("batch_n", 3)
    xs, x, w, y = TNode("xs", (3, 2)), TNode("x", (2,)), TNode("w", (2,)), TNode("y", (2,))
    i = Symbol()
    body = Block((
        Fetch(x, Slice(xs, batch_n)),
        accum(y, None, Binop.MUL, (x, w), [(i, 2)], (Iter(i),), ((Iter(i),), (Iter(i),))),
    ), "forward")
    return Computation("scaled slice", body, ((w, Fetch(w, Constant(2.0))),)), xs, w, y


def test_compile_run_get_set():
    comp, xs, w, y = scaled_slice()
    ctx = Context("interp")
    ctx.set(xs, [[1, 2], [3, 4], [5, 6]])
    routine = ctx.compile(comp)
    assert routine.name == "scaled_slice" and ctx.backend_name == "interp"
    routine.run(batch_n=1)
    assert ctx.get(y).tolist() == [6.0, 8.0]
    routine.run()  # the binding persists
    assert ctx.get(y).tolist() == [6.0, 8.0]
    ctx.set(w, [10, 10])
    routine.run(batch_n=2)
    assert ctx.get(y).tolist() == [50.0, 60.0]
    assert (ctx.stats.compilations, ctx.stats.runs) == (1, 4)  # the init routine ran once


def test_get_returns_a_copy():
    node = TNode("n", (2,))
    ctx = Context("interp")
    ctx.set(node, [1, 2])
    ctx.get(node)[0] = 99
    assert ctx.get(node).tolist() == [1, 2]


def test_set_checks_dims_and_get_needs_a_value():
    node = TNode("n", (2, 3))
    ctx = Context("interp")
    with pytest.raises(ShapeError, match=r"cannot set n \(dims \(2, 3\)\) from an array of shape \(3, 2\)"):
        ctx.set(node, np.zeros((3, 2)))
    assert not ctx.has_value(node)
    with pytest.raises(SessionError, match="n has no value on this context"):
        ctx.get(node)


def test_bfloat16_and_uint4x32_buffers():
    b, u = TNode("b", (2,), dtypes.bfloat16), TNode("u", (1,), dtypes.uint4x32)
    ctx = Context("interp")
    ctx.set(b, [1 + 2**-8, 3.0])
    assert ctx.get(b).dtype == np.float32 and ctx.get(b).tolist() == [1.0, 3.0]
    ctx.set(u, [[1, 2, 3, 4]])
    assert ctx.get(u).dtype == np.uint32 and ctx.get(u).shape == (1, 4)


def test_inits_run_once_per_context_and_skip_set_nodes():
    comp, xs, w, y = scaled_slice()
    ctx = Context("interp")
    ctx.set(xs, np.ones((3, 2)))
    ctx.compile(comp).run(batch_n=0)
    assert ctx.get(w).tolist() == [2.0, 2.0]
    ctx.set(w, [5.0, 5.0])
    ctx.compile(comp).run(batch_n=0)  # w has a value: not re-initialized
    assert ctx.get(y).tolist() == [5.0, 5.0]
    other = Context("interp")
    other.set(w, [7.0, 7.0])
    other.set(xs, np.ones((3, 2)))
    other.compile(comp).run(batch_n=0)
    assert other.get(y).tolist() == [7.0, 7.0]
    fresh = Context("interp")
    fresh.compile(comp)
    assert fresh.get(w).tolist() == [2.0, 2.0]  # compiling alone initializes


def test_inits_may_be_host_data():
    a, v, c = TNode("a", (2, 2)), TNode("v", (2,)), TNode("c", (2,))
    comp = Computation("with data", matvec(a, v, c), ((a, np.eye(2)), (v, [3.0, 4.0])))
    ctx = Context("interp")
    ctx.set(v, [1.0, 1.0])  # already has a value: the data does not replace it
    ctx.compile(comp).run()
    assert ctx.get(c).tolist() == [1.0, 1.0]
    assert ctx.stats.runs == 1  # no init routine was needed


def test_compile_accepts_objects_with_to_computation():
    a, v, c = TNode("a", (2, 2)), TNode("v", (2,)), TNode("c", (2,))

    class FakeTensor:
        def to_computation(self):
            return Computation("c fwd", matvec(a, v, c), ((a, Fetch(a, Values((1.0, 2.0, 3.0, 4.0)))),))

    ctx = Context("interp")
    ctx.set(v, [1, 1])
    comp, _, _, _ = scaled_slice()
    routine = ctx.compile(FakeTensor(), comp)
    assert routine.name == "c_fwd_then_scaled_slice"
    routine.run(batch_n=0)
    assert ctx.get(c).tolist() == [3.0, 7.0]
    with pytest.raises(OcannlError, match="at least one"):
        ctx.compile()
    with pytest.raises(SessionError, match=r"Context.compile takes tensors and computations, got 42 \(int\) as item 1"):
        ctx.compile(comp, 42)


def test_set_refuses_a_tensor_and_values_that_are_not_numbers():
    import ocannl as oc

    x = oc.tensor(np.zeros(3, np.float32))
    ctx = Context("interp")
    with pytest.raises(SessionError, match=r"takes values .*, got a tensor: to copy a tensor's value, pass ctx.get"):
        ctx.set(x, oc.tensor(np.ones(3, np.float32)))
    with pytest.raises(SessionError, match=r"takes numbers, got 'abc' \(str\)"):
        ctx.set(x, "abc")
    with pytest.raises(SessionError, match=r"takes numbers, got \[1, None, 2\]"):
        ctx.set(x, [1, None, 2])
    ctx.set(x, [1, 2, 3])
    assert ctx.get(x).tolist() == [1.0, 2.0, 3.0]


def test_binding_errors_name_the_symbol():
    comp, xs, _, _ = scaled_slice()
    ctx = Context("interp")
    routine = ctx.compile(comp)
    with pytest.raises(IndexBindingError, match=r"reads index symbol\(s\) batch_n that have no value"):
        routine.run()
    with pytest.raises(IndexBindingError, match=r"batch_n = 3 is outside \[0, 3\)"):
        routine.run(batch_n=3)
    with pytest.raises(IndexBindingError, match=r"batch_n = -1 is outside"):
        routine.run(batch_n=-1)
    with pytest.raises(IndexBindingError, match="has no index symbol 'batch' \\(it reads: batch_n\\)"):
        routine.run(batch=0)
    with pytest.raises(IndexBindingError, match="must be bound to an int"):
        routine.run(batch_n=1.5)
    routine.run(batch_n=np.int64(2))


def test_two_symbols_with_one_name_are_rejected():
    s1, s2 = IndexSymbol("k", 2), IndexSymbol("k", 2)
    xs, a, b = TNode("xs", (2, 1)), TNode("a", (1,)), TNode("b", (1,))
    with pytest.raises(IndexBindingError, match="two different index symbols of the same name"):
        body = Block((Fetch(a, Slice(xs, s1)), Fetch(b, Slice(xs, s2))))
        Context("interp").compile(Computation("dup", body))


def test_debug_dir_writes_three_files_per_routine(tmp_path):
    comp, _, _, _ = scaled_slice()
    ctx = Context("interp")
    ctx.debug_dir = tmp_path / "debug"
    ctx.compile(comp)
    files = sorted(p.name for p in (tmp_path / "debug").iterdir())
    assert files == [
        "scaled_slice-unoptimized.ll", "scaled_slice.cd", "scaled_slice.ll",
        "scaled_slice_init-unoptimized.ll", "scaled_slice_init.cd", "scaled_slice_init.ll",
    ]
    debug = tmp_path / "debug"
    assert (debug / "scaled_slice.ll").read_text() == (debug / "scaled_slice-unoptimized.ll").read_text()
    assert (debug / "scaled_slice.cd").read_text() == (
        "scaled_slice (batch_n : [0..2]):\n"
        '  # "forward";\n'
        "  x =: xs @| batch_n;\n"
        "  y =: x * w;\n"
    )
    assert (debug / "scaled_slice.ll").read_text() == (
        "scaled_slice (batch_n : [0..2]):\n"
        "  /* forward */\n"
        "  for i0 = 0 to 1 { x[i0] := xs[batch_n, i0]; }\n"
        "  for i1 = 0 to 1 { y[i1] := (x[i1] * w[i1]); }\n"
    )


def test_debug_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("OCANNL_DEBUG_DIR", str(tmp_path / "env_debug"))
    comp, _, _, _ = scaled_slice()
    Context("interp").compile(comp)
    assert (tmp_path / "env_debug" / "scaled_slice.cd").exists()


def test_config_precedence(monkeypatch, tmp_path):
    assert config.get("backend", default="interp") == "interp"
    (tmp_path / "ocannl_config").write_text("# settings\nOCANNL_BACKEND = from_file\ninterp_mode=\n")
    assert config.get("backend", default="interp") == "from_file"
    assert config.get("interp_mode", default="dflt") == "dflt"  # empty means unset
    monkeypatch.setenv("OCANNL_BACKEND", "from_env")
    assert config.get("backend") == "from_env"
    assert config.get("backend", argument="from_arg") == "from_arg"
    (tmp_path / "ocannl_config").write_text("backend=a\nbackend=b\n")
    with pytest.raises(OcannlError, match="backend is set twice"):
        config.read_config_file()


def test_backend_selection(monkeypatch):
    with pytest.raises(BackendUnavailable, match="unknown backend 'nope'; known backends: .*interp"):
        Context("nope")

    class Broken:
        name = "broken"

        def available(self):
            return False, "it is a test double"

        def compile(self, routine):
            raise AssertionError("never compiled")

    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    register_backend("broken", Broken, preference=100)
    assert registry.registered_backends()[0] == "broken" and "interp" in registry.registered_backends()
    assert Context.auto().backend_name == registry.best_available() != "broken"  # the preferred one is unavailable
    with pytest.raises(BackendUnavailable, match="backend 'broken' cannot run here: it is a test double"):
        Context("broken")
    monkeypatch.setenv("OCANNL_BACKEND", "interp")
    assert Context().backend_name == "interp"


def test_default_context():
    ctx = Context.auto()
    assert default_context() is ctx
    session.reset()
    fresh = default_context()
    assert fresh is not ctx and default_context() is fresh


def test_get_set_and_has_value_take_a_tensor():
    import numpy as np
    import ocannl as oc

    x = oc.tensor(np.arange(3, dtype=np.float32))
    y = x * 2
    ctx = oc.Context("interp")
    ctx.compile(y).run()
    assert ctx.has_value(y)
    np.testing.assert_array_equal(ctx.get(y), [0, 2, 4])
    ctx.set(x, np.ones(3, np.float32))
    np.testing.assert_array_equal(ctx.get(x), [1, 1, 1])
    with pytest.raises(TypeError, match="expected a tensor"):
        ctx.get("y")
