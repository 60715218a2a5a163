"""The C source compiles each family of identical helper functions once (``shared_helpers.py``),
and a long source as several translation units at the same time (``emit.translation_units``,
``compiler.compile_shared``): the results stay the interpreter's, bit for bit."""

from __future__ import annotations

import re

import numpy as np
import pytest

import ocannl as oc
from ocannl.backends.c import CBackend, compiler
from ocannl.backends.c.emit import HIDDEN, emit_c, translation_units
from ocannl.backends.c.shared_helpers import share_identical_helpers
from ocannl.errors import OutOfBoundsError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.indexing import Iter, Symbol
from ocannl.lowlevel.ir import Binary, Load, RoutineIR, Store, loop, seq
from ocannl.lowlevel.scalar_ops import Binop
from ocannl.lowlevel.tnode import TNode
from tests.backends.test_c_build import assert_runs_like_the_interpreter, pointwise_chain

needs_cc = pytest.mark.skipif(not CBackend().available()[0], reason="no working C compiler here")
TABLE = np.arange(12, dtype=np.float32).reshape(4, 3)


def helper_definitions(text: str) -> list[str]:
    return re.findall(r"^static OCANNL_NEST_FN void (\w+)\(", text, flags=re.MULTILINE)


def twin_sums() -> tuple[RoutineIR, list[TNode]]:
    """``c = a - b`` and ``z = x - y``: two nests alike but for their buffers, whose names sort
    in another order (``b < c`` but ``z > x``), so the second call passes its arguments permuted."""
    a, b, c, x, y, z = (TNode(name, (5,), dtypes.float32) for name in "abcxyz")
    i, j = Symbol(), Symbol()
    return RoutineIR("twins", seq(
        loop(i, 5, Store(c, (Iter(i),), Binary(Binop.SUB, Load(a, (Iter(i),)), Load(b, (Iter(i),))))),
        loop(j, 5, Store(x, (Iter(j),), Binary(Binop.SUB, Load(z, (Iter(j),)), Load(y, (Iter(j),))))),
    )), [a, b, y, z]


@needs_cc
def test_nests_alike_but_for_their_names_share_one_function():
    routine, inputs = twin_sums()
    text = emit_c(routine).text
    assert helper_definitions(text) == ["twins_nest0"]
    assert "twins_nest0(a, b, c, _status);" in text and "twins_nest0(z, y, x, _status);" in text
    assert_runs_like_the_interpreter(routine, {n: np.linspace(-1.0, k, 5) for k, n in enumerate(inputs)})


def test_nests_that_compute_differently_keep_their_functions():
    routine, _ = pointwise_chain(3)  # a constant differs per nest
    functions, body = [["int f(void) {", "}"]], ["  g();"]
    assert len(helper_definitions(emit_c(routine).text)) == 3
    assert share_identical_helpers(functions, body) == (functions, body)


def test_a_number_after_a_name_ending_in_status_is_no_check_number():
    """Check numbers are the argument after the status cell ``_status``; the same text after a
    longer name (a buffer ``grad_status``) is a number the helper computes with, so helpers that
    differ there stay apart, while helpers that differ only in their check numbers are one."""

    def helper(name: str, line: str) -> list[str]:
        return [f"static OCANNL_NEST_FN void {name}(", "    float *restrict grad_status,", "    int *_status) {",
                line, "}"]

    def calls(*names: str) -> list[str]:
        return [f"  {n}(g{k}, _status);" for k, n in enumerate(names)]

    constants = [helper("f_nest0", "  scale(grad_status, 3);"), helper("f_nest1", "  scale(grad_status, 4);")]
    assert share_identical_helpers(constants, calls("f_nest0", "f_nest1")) == (constants, calls("f_nest0", "f_nest1"))
    checks = [helper("f_nest0", "  ocannl_fail(_status, 3);"), helper("f_nest1", "  ocannl_fail(_status, 4);")]
    functions, body = share_identical_helpers(checks, calls("f_nest0", "f_nest1"))
    assert len(functions) == 1 and body == ["  f_nest0(g0, 3, _status);", "  f_nest0(g1, 4, _status);"]


def test_gemm_drivers_alike_but_for_their_integers_take_them_as_parameters():
    """Drivers of packed GEMMs (their text calls a micro-kernel) that differ only in integer
    literals are one function taking the literals they differ in, a parameter per column of
    values; literals they agree on, a float's digits, a check number and what a pragma or an
    array's declaration needs constant are no parameters. Other helpers that differ in an integer
    stay apart."""

    def driver(name: str, rows: int, stride: int, collapse: int = 2) -> list[str]:
        return [f"static OCANNL_TILE_FN void {name}(", "    float *restrict c,", "    int *_status) {",
                "  /* 16 rows of 4 */", f"  #pragma omp for collapse({collapse})",
                "  float _t[128] = {0};",
                f"  for (int64_t _i = 0; _i < {rows}; _i += 16) ocannl_gemm_8x16_f32x16_inorder_ab(16, c + {stride}*_i, 0.5f);",
                f"  if (c[{rows}] > 1e-05f) ocannl_fail(_status, 3);", f"  c[{stride} + {rows}] = 0;", "}"]

    def calls(*names: str) -> list[str]:
        return [f"  {n}(g{k}, _status);" for k, n in enumerate(names)]

    drivers = [driver("f_tile0", 64, 128), driver("f_tile1", 32, 128), driver("f_tile2", 96, 64)]
    functions, body = share_identical_helpers(drivers, calls("f_tile0", "f_tile1", "f_tile2"))
    (kept,) = functions
    assert kept[:3] == ["static OCANNL_TILE_FN void f_tile0(", "    float *restrict c,", "    int64_t _n0,"]
    assert kept[3:] == ["    int64_t _n1,", "    int *_status) {", "  /* 16 rows of 4 */", "  #pragma omp for collapse(2)",
                        "  float _t[128] = {0};",
                        "  for (int64_t _i = 0; _i < _n0; _i += 16) ocannl_gemm_8x16_f32x16_inorder_ab(16, c + _n1*_i, 0.5f);",
                        "  if (c[_n0] > 1e-05f) ocannl_fail(_status, 3);", "  c[_n1 + _n0] = 0;", "}"]
    assert body == ["  f_tile0(g0, 64, 128, _status);", "  f_tile0(g1, 32, 128, _status);", "  f_tile0(g2, 96, 64, _status);"]
    apart = [driver("f_tile0", 64, 128), driver("f_tile1", 64, 128, collapse=3)]
    assert len(share_identical_helpers(apart, calls("f_tile0", "f_tile1"))[0]) == 2, "collapse() must stay a constant"
    loops = [[line.replace("ocannl_gemm_8x16_f32x16_inorder_ab", "scale") for line in d] for d in drivers]
    assert share_identical_helpers(loops, calls("f_tile0", "f_tile1", "f_tile2"))[0] == loops


@needs_cc
def test_products_of_other_sizes_share_their_driver_with_the_interpreters_bits():
    """Two products of the same form and other sizes (a 96 x 80 x 64 and a 48 x 96 x 80 matmul,
    both in tiles of 12 rows, every operand packed): one packed GEMM driver, called with each
    product's sizes, each result the interpreter's."""
    rng = np.random.default_rng(11)
    shapes = [(96, 80, 64), (48, 96, 80)]
    operands = [(rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32))
                for m, k, n in shapes]
    values, texts = {}, {}
    for backend in ("interp", "c"):
        oc.session.reset()
        products = [oc.tensor(a, input=1) @ oc.tensor(b, input=1) for a, b in operands]
        ctx = oc.Context(backend)
        routine = ctx.compile(*products)
        routine.run()
        values[backend] = [ctx.get(p.value) for p in products]
        texts[backend] = routine._executable.source.text if backend == "c" else ""
    text = texts["c"]
    assert text.count("as a packed GEMM") == 1 and "int64_t _n0," in text, text
    for got, expected in zip(values["c"], values["interp"]):
        np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


@needs_cc
def test_initializations_alike_but_for_their_keys_share_one_function(monkeypatch):
    """Parameters of one shape initialize by the same nest, each with its own Threefry key (a
    ``uint4x32_t`` literal): the init routine prints it once, taking the key as a parameter, and
    every parameter still gets its own values, the interpreter's bits."""
    import ocannl.backends.c.backend as c_backend

    sources = []
    emit = c_backend.emit_c
    monkeypatch.setattr(c_backend, "emit_c", lambda routine, **kw: sources.append(emit(routine, **kw)) or sources[-1])
    values = {}
    for backend in ("interp", "c"):
        oc.session.reset()
        oc.seed(5)
        ws = [oc.param(f"w{k}", output=8, input=16, init=oc.init.uniform(-0.5, 0.5)) for k in range(3)]
        ctx = oc.Context(backend)
        ctx.compile(oc.cd.assign(oc.tensor(np.zeros((8, 16), np.float32), label="out"), "=:", ws[0] + ws[1] + ws[2]))
        values[backend] = [ctx.get(w) for w in ws]
    init = next(s.text for s in sources if s.name.endswith("_init"))
    assert len(helper_definitions(init)) == 1 and "uint4x32_t _key0," in init
    for got, expected in zip(values["c"], values["interp"]):
        np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
    assert not np.array_equal(values["c"][0], values["c"][1])


@needs_cc
def test_a_shared_function_reports_the_check_of_its_caller():
    ctx = oc.Context("c")
    ids_a, ids_b = oc.tensor(np.array([1, 3]), label="ids_a"), oc.tensor(np.array([0, 2]), label="ids_b")
    rows_a, rows_b = (oc.tensor(np.zeros((2, 3), np.float32), label=f"rows_{s}") for s in "ab")
    routine = ctx.compile(oc.cd.assign(rows_a, "=:", oc.take(oc.tensor(TABLE, label="table_a"), ids_a)),
                          oc.cd.assign(rows_b, "=:", oc.take(oc.tensor(TABLE + 1, label="table_b"), ids_b)))
    assert len(helper_definitions(routine._executable.source.text)) == 1  # the check number a parameter
    routine.run()
    np.testing.assert_array_equal(ctx.get(rows_b), TABLE[[0, 2]] + 1)
    ctx.set(ids_b, np.array([2, 9]))
    with pytest.raises(OutOfBoundsError, match="table_b"):
        routine.run()
    ctx.set(ids_b, np.array([2, 1]))
    ctx.set(ids_a, np.array([7, 1]))
    with pytest.raises(OutOfBoundsError, match="table_a"):
        routine.run()


@pytest.mark.parametrize("nests", [6, 70])  # 70: run in parts, the routine's function taking the arrays
def test_translation_units_spread_the_helpers_and_keep_the_routine_apart(nests):
    routine, _ = pointwise_chain(nests)
    text = emit_c(routine).text
    units = translation_units(text, 3)
    assert len(units) == 3 and translation_units(text, 2) == [text]
    names = helper_definitions(text)
    for k, unit in enumerate(units):
        defined = re.findall(rf"^{re.escape(HIDDEN)} OCANNL_NEST_FN void (\w+)\(.*?\) {{$", unit,
                             flags=re.MULTILINE | re.DOTALL)
        assert bool(re.search(r"^static (OCANNL_CALLS_FN )?int chain\(", unit, re.MULTILINE)) == (k == len(units) - 1)
        assert not helper_definitions(unit) and (defined or k == len(units) - 1)
    assert sorted(d for u in units for d in re.findall(r"^\S.* void (\w+)\([^;]*?\) \{$", u, flags=re.MULTILINE)
                  if d in names) == sorted(names)


@needs_cc
@pytest.mark.parametrize("nests", [6, 70])
def test_a_source_built_as_several_units_computes_the_same(monkeypatch, tmp_path, nests):
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("OCANNL_C_FAST", "0")
    monkeypatch.setattr(compiler, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(compiler.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    built = []
    compile_objects = compiler.compile_objects
    monkeypatch.setattr(compiler, "compile_objects", lambda units, *a: built.append(len(units)) or
                        compile_objects(units, *a))
    routine, first = pointwise_chain(nests)
    assert_runs_like_the_interpreter(routine, {first: np.linspace(-1.0, 1.0, 5)})
    # The helpers spread over up to two units a core (six nests: their four), one for the routine.
    assert built == [{6: 5, 70: 7}[nests]]
    assert len(list((tmp_path / "c").glob("*.so"))) == 1  # one library in the cache


def _numbered_per_function(text: str) -> str:
    """``text`` with loop indices, locals and temporaries renumbered in order of appearance
    within each function: the numbering a helper not printed leaves to those after it."""
    def renumbered(chunk: str) -> str:
        names: dict[str, str] = {}
        return re.sub(r"\b(_?i|v|_w)(\d+)\b", lambda m: names.setdefault(m.group(0), f"{m.group(1)}#{len(names)}"),
                      chunk)

    return "\n}\n".join(map(renumbered, text.split("\n}\n")))


@needs_cc
def test_a_nest_of_a_structure_printed_before_is_not_printed_again(monkeypatch):
    """Statements of one structure (``ocannl/lowlevel/structure.py``: the same code on other
    buffers) print their helper once, the others calling it: the source is the one printing
    them all gives once equal helpers are merged, up to the numbers of loop indices, and the
    walk prints a fraction of the helpers (a 4-layer MLP's training step, its layers equal)."""
    from ocannl import train
    from ocannl.backends.c import target

    def source() -> tuple[str, int]:
        oc.session.reset()
        oc.seed(1)
        x = oc.tensor(np.linspace(-1, 1, 8 * 16, dtype=np.float32).reshape(8, 16), label="x", batch=1)
        h = x
        for k in range(4):
            h = oc.relu(oc.param(f"w{k}", output=16, input=16) @ h + oc.param(f"b{k}", output=16, init=0.0))
        update = train.grad_update((h * h).sum())
        routine = oc.Context("c").compile(update, train.sgd_update(update, lr=0.1))
        return routine._executable.source.text, printed[0]

    printed = [0]
    helper = target.CTarget.helper

    def counting(self, emitter, kind, stmt, print_body, macro=target.NEST_FN, parts=None):
        functions = len(self.functions)
        helper(self, emitter, kind, stmt, print_body, macro, parts)
        printed[0] += len(self.functions) > functions

    monkeypatch.setattr(target.CTarget, "helper", counting)
    shared, shared_count = source()
    printed[0] = 0
    monkeypatch.setattr(target.CTarget, "_structure", lambda self, *args: None)
    every, every_count = source()
    assert _numbered_per_function(shared) == _numbered_per_function(every)
    assert shared_count < every_count / 2
