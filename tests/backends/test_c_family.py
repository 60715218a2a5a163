"""The C-family syntax base (ocannl/backends/c_family.py) that the C and Metal tables extend.

Both languages print their helper functions from one generator, recorded as the walk prints the
calls: a source defines exactly the helpers it calls, each once per type, before its first call;
every helper, for every type a language has, builds without a warning in C and in MSL (through
the shim); a type the language lacks is refused where it is printed. Run on each backend of the
family, every operator, cast, storage format and PRNG operator, the runtime checks and the
conformance catalog compute the interpreter's bits (libm functions: within a few ulps).
"""

from __future__ import annotations

import collections
import re
import subprocess

import numpy as np
import pytest

from backend_params import backend_param
from handbuilt import pointwise_loop
from helpers import (
    APPROXIMATE_OPS, LIBM_PROGRAMS, assert_close_ulps, assert_same_bits, catalog_for, float16_bfloat16_routine,
    float16_bfloat16_values, run_both, run_on,
)
from ocannl import testing
from ocannl.backends.registry import get_backend
from ocannl.backends.c import CBackend, compiler
from ocannl.backends.c.emit import emit_c
from ocannl.backends.c.syntax import OWN_FLOAT32_FUNCTIONS, CSyntax
from ocannl.backends.c_family import _HELPERS, CFamilySyntax
from ocannl.backends.metal import MetalBackend, emit_metal, harness
from ocannl.backends.metal.syntax import MISSING_MATH_FUNCTIONS, MetalSyntax
from ocannl.errors import OutOfBoundsError
from ocannl.lowlevel import dtypes, prng_reference
from ocannl.lowlevel.dtypes import DType, DTypeError
from ocannl.lowlevel.indexing import Fixed, IndexSymbol, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Cast, Const, EmbedIndex, Load, LoadDynamic, RoutineIR, Store, StoreDynamic, Ternary, Unary, loop, seq,
)
from ocannl.lowlevel.scalar_ops import PRNG_OPS, Binop, Ternop, Unop
from ocannl.lowlevel.tnode import TNode

COMPUTE_TYPES = {
    "c": (dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64, dtypes.uint32),
    "metal": (dtypes.float32, dtypes.int32, dtypes.int64, dtypes.uint32),
}
SYNTAX = {"c": CSyntax, "metal": MetalSyntax}
EMIT = {"c": lambda r: emit_c(r).text, "metal": lambda r: emit_metal(r).text}
AVAILABLE = {"c": CBackend().available()[0], "metal": MetalBackend().available()[0]}

HELPER_OPS = (Unop.RELU, Unop.SAT01, Unop.NOT, Unop.ABS, Binop.MAX, Binop.MIN, Binop.RELU_GATE, Binop.SAT01_GATE)


def every_helper_routine(dtype: DType, n: int = 8) -> RoutineIR:
    """``out_<op>[i] := op(x[i], y[i])`` for every operator a helper prints (integers: the checked
    ``div`` and ``mod`` too; floats: ``erf``, a helper in MSL, and ``exp``, one in C), and ``x``
    gathered at a position read from ``y`` (a checked index)."""
    x, y = TNode("x", (n,), dtype), TNode("y", (n,), dtype)
    ops = HELPER_OPS + ((Unop.ERF, Unop.EXP) if dtype.is_float else (Binop.DIV, Binop.MOD))
    stmts = []
    for op in ops:
        i = Symbol()
        a, b = Load(x, (Iter(i),)), Load(y, (Iter(i),))
        value = Unary(op, a) if isinstance(op, Unop) else Binary(op, a, b)
        stmts.append(loop(i, n, Store(TNode(f"out_{op.value}", (n,), dtype), (Iter(i),), value)))
    i = Symbol()
    position = Cast(Load(y, (Iter(i),)), dtypes.int32) if dtype.is_float else Load(y, (Iter(i),))
    stmts.append(loop(i, n, Store(TNode("gathered", (n,), dtype), (Iter(i),), LoadDynamic(x, 0, position, ()))))
    return RoutineIR(f"helpers_{dtype.name}", seq(*stmts))


def prng_routine(dtype: DType, n: int = 8) -> RoutineIR:
    """``out[i] := uniform1(threefry4x32(key[0], uint4x32_of(i)))`` and
    ``words[i] := uint4x32_word(threefry4x32(uint4x32_pack(i, i), uint4x32_of(i)), 3)``: every
    PRNG helper."""
    key, out = TNode("key", (1,), dtypes.uint4x32), TNode("out", (n,), dtype)
    words = TNode("words", (n,), dtypes.uint32)
    i = Symbol()
    counter = Unary(Unop.UINT4X32_OF, EmbedIndex(Iter(i)))
    bits = Binary(Binop.THREEFRY4X32, Load(key, (Fixed(0),)), counter)
    packed = Binary(Binop.UINT4X32_PACK, EmbedIndex(Iter(i), dtypes.int64), EmbedIndex(Iter(i), dtypes.int64))
    word = Binary(Binop.UINT4X32_WORD, Binary(Binop.THREEFRY4X32, packed, counter), Const(3, dtypes.uint32))
    body = seq(Store(out, (Iter(i),), Unary(Unop.UNIFORM1, bits, dtype)), Store(words, (Iter(i),), word))
    return RoutineIR(f"prng_{dtype.name}", loop(i, n, body))


def half_routine(dtype: DType, n: int = 8) -> RoutineIR:
    """``y[i] := x[i] + x[i]`` on a 16-bit float: loads and stores convert."""
    x, y = TNode("x", (n,), dtype), TNode("y", (n,), dtype)
    i = Symbol()
    value = Binary(Binop.ADD, Load(x, (Iter(i),)), Load(x, (Iter(i),)))
    return RoutineIR(f"half_{dtype.name}", loop(i, n, Store(y, (Iter(i),), value)))


def wide_tile_routine(dtype: DType, n: int = 128) -> RoutineIR:
    """``m[i, j] := max over k of relu(x[i, k, j])`` and ``min``, ``relu_gate`` alike, each a
    contraction printed as a register tile 8 columns wide, whose select operators print their
    ``_blend`` helpers; and ``w[i, j] := where(x[i, 0, j] > 0, x[i, 1, j], 1)``, a where on data
    printed as a select."""
    x = TNode("x", (n, 4, 8), dtype)
    stmts = []
    for op, neutral in ((Binop.MAX, float("-inf")), (Binop.MIN, float("inf")), (Binop.ADD, 0.0)):
        m = TNode(f"m_{op.value}", (n, 8), dtype)
        i, j, k = Symbol(), Symbol(), Symbol()
        cell, read = (Iter(i), Iter(j)), Load(x, (Iter(i), Iter(k), Iter(j)))
        term = Unary(Unop.RELU, read) if op is not Binop.ADD else Binary(Binop.RELU_GATE, read, read)
        reduce = loop(k, 4, Store(m, cell, Binary(op, Load(m, cell), term)))
        stmts.append(loop(i, n, loop(j, 8, seq(Store(m, cell, Const(neutral, dtype)), reduce))))
    i, j = Symbol(), Symbol()
    test = Binary(Binop.GT, Load(x, (Iter(i), Fixed(0), Iter(j))), Const(0.0, dtype))
    value = Ternary(Ternop.WHERE, test, Load(x, (Iter(i), Fixed(1), Iter(j))), Const(1.0, dtype))
    stmts.append(loop(i, n, loop(j, 8, Store(TNode("w", (n, 8), dtype), (Iter(i), Iter(j)), value))))
    return RoutineIR(f"wide_{dtype.name}", seq(*stmts))


def sources(language: str) -> list[tuple[str, str]]:
    routines = [every_helper_routine(d) for d in COMPUTE_TYPES[language]]
    routines += [wide_tile_routine(dtypes.float32)]
    routines += [prng_routine(d) for d in COMPUTE_TYPES[language] if d.is_float]
    routines += [half_routine(dtypes.float16), half_routine(dtypes.bfloat16)]
    return [(r.name, EMIT[language](r)) for r in routines]


DEFINITION = re.compile(r"^(?:static )?(?:inline )?\w+ (ocannl_\w+)\(([^)]*)\) \{", re.M)


@pytest.mark.parametrize("language", SYNTAX)
def test_a_source_defines_exactly_the_helpers_it_calls_once_before_their_use(language):
    defined = set()
    for name, text in sources(language):
        text = re.sub(r"^#else\n.*?^#endif\n", "", text, flags=re.S | re.M)  # one branch, as compiled
        definitions = list(DEFINITION.finditer(text))
        defined |= {m.group(1) for m in definitions}
        overloads = collections.Counter(m.group(1, 2) for m in definitions)
        assert all(k == 1 for k in overloads.values()), f"{name}: defined twice: {overloads}"
        named_at = {m.start(1) for m in definitions}
        for helper in {m.group(1) for m in definitions}:
            defined_at = min(m.start(1) for m in definitions if m.group(1) == helper)
            calls = [m.start() for m in re.finditer(rf"\b{helper}\(", text) if m.start() not in named_at]
            assert calls, f"{name}: {helper} is defined and never called"
            assert min(calls) > defined_at, f"{name}: {helper} is called before it is defined"
    # MSL kernels print no register tiles, so no select of a tile's cells (``_blend``); C's library
    # has the functions MSL's lacks; MSL keeps its own of the functions C prints a helper for.
    stand_ins = {"c": {f"ocannl_{name}" for name in MISSING_MATH_FUNCTIONS},
                 "metal": {f"ocannl_{name}" for name in OWN_FLOAT32_FUNCTIONS}}[language]
    expected = [h for h in _HELPERS if h not in stand_ins and (language == "c" or not h.endswith("_blend"))]
    missed = [h for h in expected if not any(d == h or d.startswith(f"{h}_") for d in defined)]
    assert not missed, f"no source exercised {missed}"


def test_c_defines_its_storage_formats_only_where_used():
    text = dict(sources("c"))
    assert "typedef _Float16 ocannl_half;" in text["half_float16"]
    assert "ocannl_f32_to_bf16" in text["half_bfloat16"] and "ocannl_half" not in text["half_bfloat16"]
    assert "typedef struct { uint32_t v[4]; } uint4x32_t;" in text["prng_float64"]
    assert "uint4x32_t" not in text["helpers_float32"]


def calls_of_every_helper(syntax: CFamilySyntax, types: tuple[DType, ...]) -> tuple[list[str], list[str]]:
    """Parameters and statements that call every helper the table prints, for every type."""
    params, calls = [], []
    for dtype in types:
        t = syntax.compute_type(dtype)
        a, b = f"a_{dtype.name}", f"b_{dtype.name}"
        params += [f"{t} {a}", f"{t} {b}"]
        calls += [syntax.unary(op, dtype, a) if isinstance(op, Unop) else syntax.binary(op, dtype, a, b)
                  for op in HELPER_OPS]
        if dtype.is_float:
            bits = syntax.binary(Binop.THREEFRY4X32, dtypes.uint4x32, "key", "key")
            calls += [syntax.unary(Unop.UNIFORM1, dtype, bits), syntax.unary(Unop.EXP, dtype, a)]
        else:
            calls += [syntax.int_division(op, dtype, a, b, 1) for op in (Binop.DIV, Binop.MOD)]
            calls.append(syntax.unary(Unop.UINT4X32_OF, dtypes.uint4x32, a))
    calls.append(syntax.checked_index("a_int64", 10, 2))
    params.append(f"{syntax.storage_type(dtypes.uint4x32)} key")
    return params, [f"  (void)({c});" for c in calls]


def warning_flags(flags: tuple[str, ...]) -> list[str]:
    return [f for f in flags if not f.startswith("-Wno-")] + ["-Wall", "-Wextra", "-Werror", "-fsyntax-only"]


@pytest.mark.skipif(not AVAILABLE["c"], reason="no working C compiler here")
def test_every_helper_of_every_type_compiles_without_a_warning_in_c():
    syntax = CSyntax()
    params, calls = calls_of_every_helper(syntax, COMPUTE_TYPES["c"])
    text = "\n".join(["#include <math.h>", "#include <stdint.h>", "#include <string.h>", *syntax.builtins(),
                      f"int ocannl_calls({', '.join(params)}, int *_status) {{", *calls, "  return 0;", "}", ""])
    tc = compiler.toolchain()
    result = subprocess.run([*tc.command, *warning_flags(tc.flags), "-x", "c", "-"], input=text,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[:5000]


@pytest.mark.skipif(not AVAILABLE["metal"], reason="no C++20 compiler for the Metal shim here")
def test_every_helper_of_every_type_compiles_without_a_warning_in_msl():
    syntax = MetalSyntax()
    params, calls = calls_of_every_helper(syntax, COMPUTE_TYPES["metal"])
    text = "\n".join(["#include <metal_stdlib>", "using namespace metal;", *syntax.builtins(),
                      f"inline int ocannl_calls({', '.join(params)}, device atomic_int* _status) {{", *calls,
                      "  return 0;", "}", ""])
    tc = harness.toolchain()
    silence = "-Wno-unknown-attributes" if "clang" in tc.version.lower() else "-Wno-attributes"
    cmd = [*tc.command, *warning_flags(tc.flags), silence, "-I", str(harness.SHIM_DIR), "-x", "c++", "-"]
    result = subprocess.run(cmd, input=text, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[:5000]


def test_metal_refuses_float64_where_it_is_printed():
    syntax = MetalSyntax()
    with pytest.raises(DTypeError, match="float64"):
        syntax.unary(Unop.UNIFORM1, dtypes.float64, "bits")
    with pytest.raises(DTypeError, match="float64"):
        syntax.binary(Binop.MAX, dtypes.float64, "a", "b")
    with pytest.raises(DTypeError, match="float64"):
        syntax.literal(0.5, dtypes.float64)
    assert syntax.builtins() == []


@pytest.mark.parametrize("syntax", [CSyntax, MetalSyntax], ids=["c", "metal"])
def test_branchless_selects_are_asked_for_by_argument_not_by_a_mode_of_the_table(syntax):
    """Where no chain runs (``cpu_schedule.NestPlan.branchless``) the walk asks for a select
    without a branch by argument; the table itself holds no mode that one nest could leave set
    for the next."""
    table = syntax()
    f32 = dtypes.float32
    assert "ocannl_max_blend" in table.binary(Binop.MAX, f32, "a", "b", branchless=True)
    assert "blend" not in table.binary(Binop.MAX, f32, "a", "b")
    assert "ocannl_relu_blend" in table.unary(Unop.RELU, f32, "x", branchless=True)
    assert "blend" not in table.binary(Binop.MAX, dtypes.int32, "a", "b", branchless=True), "floats only"
    assert not hasattr(table, "vector_tile")


# ---------------------------------------------------------------------------------------------
# Run on each backend of the family, every operator, cast, storage format and PRNG operator
# computes the interpreter's bits (libm functions: within a few ulps)


def compute_type_cases() -> list:
    """``(backend, dtype)`` for every compute type of every C-family backend, as pytest
    parameters skipped where the backend cannot run."""
    return [pytest.param(name, dtype, marks=param.marks, id=f"{name}-{dtype}")
            for name in COMPUTE_TYPES for param in [backend_param(name)] for dtype in COMPUTE_TYPES[name]]


BACKENDS = [backend_param(name) for name in COMPUTE_TYPES]

SPECIAL_F = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.5, -3.75, 1e-40, -1e-44, 3e38, -3e38, np.inf, -np.inf,
             np.nan, 0.1, 7.0, 1e-7, 0.999, 1.0000001, 100.0, -100.0, 0.25, 33.5]
INT_RANGES = {dtypes.int32: (-(2**31), 2**31 - 1), dtypes.int64: (-(2**63), 2**63 - 1), dtypes.uint32: (0, 2**32 - 1)}


def operand_values(dtype: DType, n: int = 64) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x, y, z and a divisor array d (no zeros) with the type's special values and random ones."""
    rng = np.random.default_rng(3)
    if dtype.is_float:
        special = np.array(SPECIAL_F, dtype=dtype.storage)
        rand = (rng.standard_normal(n) * 10).astype(dtype.storage)
    else:
        lo, hi = INT_RANGES[dtype]
        special = np.array([lo, hi, 0, 1, -1 if lo < 0 else 2, lo + 1, hi - 1, 7, 100, 3], dtype=dtype.storage)
        rand = rng.integers(lo, hi, n, dtype=dtype.storage, endpoint=True)
    x = np.concatenate([special, rand])[:n]
    y, z = np.roll(x, 5), np.roll(x, 11)
    d = np.where(y == 0, 3, y).astype(dtype.storage)
    if not dtype.is_float:
        d[:4] = np.array([-1, 1, 2, -3] if INT_RANGES[dtype][0] < 0 else [1, 2, 3, 7], dtype=dtype.storage)
    return x, y, z, d


def op_routine(dtype: DType, n: int = 64):
    """One store per operator into its own node: (routine, inputs, {op: output node})."""
    x, y, z, d = (TNode(name, (n,), dtype) for name in ("x", "y", "z", "d"))
    outputs, stmts = {}, []
    unops = [op for op in Unop if op not in PRNG_OPS]
    binops = [op for op in Binop if op not in PRNG_OPS]
    for op in unops + binops + list(Ternop):
        if op.float_only and not dtype.is_float:
            continue
        out = TNode(f"out_{op.value}", (n,), dtype)

        def value(i, op=op):
            a, b, c = Load(x, (i,)), Load(y, (i,)), Load(z, (i,))
            if isinstance(op, Unop):
                return Unary(op, a)
            if isinstance(op, Binop):
                return Binary(op, a, Load(d, (i,)) if op in (Binop.DIV, Binop.MOD) else b)
            return Ternary(op, a, b, c)

        outputs[op] = out
        stmts.append(pointwise_loop(out, value))
    values = operand_values(dtype, n)
    return RoutineIR(f"ops_{dtype.name}", seq(*stmts)), dict(zip((x, y, z, d), values)), outputs


@pytest.mark.parametrize("backend,dtype", compute_type_cases())
def test_every_operator_matches_the_interpreter(backend, dtype):
    routine, inputs, outputs = op_routine(dtype)
    expected, got = run_both(backend, routine, inputs)
    for op, node in outputs.items():
        if op in APPROXIMATE_OPS:
            assert_close_ulps(expected[node], got[node], f"{op.value} {dtype}")
        else:
            assert_same_bits(expected[node], got[node], f"{op.value} {dtype}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_casts_between_every_compute_type(backend):
    types = COMPUTE_TYPES[backend]
    n = 12
    float_values = [-3.7, -0.5, 0.0, -0.0, 2.9, 1e9, -2e9, 3e9, 16777217.0, 0.1, 65504.5, -7.25]
    int_values = [-(2**31), 2**31 - 1, -1, 0, 1, 2**24 + 1, 123456789, -98765, 7, 2**30, -5, 255]
    sources = {t: TNode(f"src_{t.name}", (n,), t) for t in types}
    inputs = {}
    for t, node in sources.items():
        vals = float_values if t.is_float else int_values
        inputs[node] = np.array(vals, dtype=np.float64 if t.is_float else np.int64).astype(t.storage)
    inputs[sources[dtypes.int64]] = np.array(int_values[:-2] + [2**53 + 1, -(2**62) - 3], dtype=np.int64)
    stmts, outputs = [], []
    for s in types:
        for t in types:
            if s is t:
                continue
            out = TNode(f"{s.name}_to_{t.name}", (n,), t)
            outputs.append(out)
            stmts.append(pointwise_loop(out, lambda i, s=s, t=t: Cast(Load(sources[s], (i,)), t)))
    expected, got = run_both(backend, RoutineIR("casts", seq(*stmts)), inputs)
    for out in outputs:
        assert_same_bits(expected[out], got[out], out.name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float16_and_bfloat16_round_like_the_interpreter(backend):
    n = 4096
    routine, x, outs = float16_bfloat16_routine(n)
    expected, got = run_both(backend, routine, {x: float16_bfloat16_values(n)})
    for node in outs:
        assert_same_bits(expected[node], got[node], node.name)
    every_half = TNode("every_half", (1 << 16,), dtypes.float16)
    widened = TNode("widened", (1 << 16,), dtypes.float32)
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    widen = RoutineIR("widen", pointwise_loop(widened, lambda i: Load(every_half, (i,))))
    got = run_on(backend, widen, {every_half: halves})
    assert_same_bits(halves.astype(np.float32), got[widened], "every half to float")


@pytest.mark.parametrize("backend", BACKENDS)
def test_prng_operators_match_the_reference(backend):
    n = 40
    key = TNode("key", (1,), dtypes.uint4x32)
    signed = TNode("signed", (n,), dtypes.int32)
    bits, of = TNode("bits", (n,), dtypes.uint4x32), TNode("of", (n,), dtypes.uint4x32)
    uniform = [TNode(t.name, (n,), t) for t in COMPUTE_TYPES[backend] if t.is_float]

    def block(i):
        return Binary(Binop.THREEFRY4X32, Load(key, (Fixed(0),)), Unary(Unop.UINT4X32_OF, EmbedIndex(i)))

    body = seq(
        pointwise_loop(bits, block),
        *(pointwise_loop(u, lambda i, t=u.dtype: Unary(Unop.UNIFORM1, block(i), t)) for u in uniform),
        pointwise_loop(of, lambda i: Unary(Unop.UINT4X32_OF, Load(signed, (i,)))),
    )
    k = np.array([[7, 0xDEADBEEF, 3, 0]], np.uint32)
    inputs = {key: k, signed: np.arange(-20, 20, dtype=np.int32) * 1000003}
    expected, got = run_both(backend, RoutineIR("prng", body), inputs)
    for node in (bits, *uniform, of):
        assert_same_bits(expected[node], got[node], node.name)
    counters = np.zeros((n, 4), np.uint32)
    counters[:, 0] = np.arange(n)
    assert np.array_equal(got[bits], prng_reference.threefry4x32(k[0], counters))
    assert got[of][0].tolist() == [(-20 * 1000003) & 0xFFFFFFFF, 0xFFFFFFFF, 0, 0]


@pytest.mark.parametrize("backend", [backend_param("interp"), *BACKENDS])
def test_runtime_checks_raise_like_the_interpreter(backend):
    n = 4
    ids = TNode("ids", (n,), dtypes.int32)
    table = TNode("table", (3,), dtypes.float32)
    out = TNode("out", (n,), dtypes.float32)
    gather = RoutineIR("gather", pointwise_loop(out, lambda i: LoadDynamic(table, 0, Load(ids, (i,)), ())))
    j = Symbol()
    scatter = RoutineIR("scatter", loop(j, n, StoreDynamic(table, 0, Load(ids, (Iter(j),)), (), Load(out, (Iter(j),)))))
    impl = get_backend(backend)
    bufs = {ids: np.array([0, 2, 3, 1], np.int32), table: np.zeros(3, np.float32), out: np.zeros(n, np.float32)}
    with pytest.raises(OutOfBoundsError, match="table"):
        impl.compile(gather).run(bufs, {})
    with pytest.raises(OutOfBoundsError, match="table"):
        impl.compile(scatter).run(bufs, {})
    a, b, q = (TNode(name, (n,), dtypes.int32) for name in ("a", "b", "q"))
    div = RoutineIR("div", pointwise_loop(q, lambda i: Binary(Binop.DIV, Load(a, (i,)), Load(b, (i,)))))
    with pytest.raises(ZeroDivisionError):
        impl.compile(div).run({a: np.ones(n, np.int32), b: np.array([1, 2, 0, 3], np.int32), q: np.zeros(n, np.int32)}, {})
    sym = IndexSymbol("row")  # no size: the access is checked when it runs
    x = TNode("x", (3, n), dtypes.float32)
    executable = impl.compile(RoutineIR("slice", pointwise_loop(out, lambda i: Load(x, (Iter(sym), i)))))
    executable.run({x: np.ones((3, n), np.float32), out: np.zeros(n, np.float32)}, {sym: 2})
    with pytest.raises(OutOfBoundsError, match="x"):
        executable.run({x: np.ones((3, n), np.float32), out: np.zeros(n, np.float32)}, {sym: 3})


@pytest.mark.parametrize("backend", BACKENDS)
def test_catalog_is_bit_identical_except_libm(backend):
    """Every program of the catalog the backend can run (Metal has no float64) computes the
    interpreter's values, bit for bit, except the results of libm functions, whose gradients
    amplify their ulps."""
    programs = catalog_for(backend)
    assert {"take (gather) and scatter-add", "padded conv 2-D", "batch slice by index symbol"} <= {p.name for p in programs}
    for program in programs:
        expected, got = testing.run_program(program, "interp"), testing.run_program(program, backend)
        assert expected.keys() == got.keys(), program.name
        for name, value in expected.items():
            if program.name in LIBM_PROGRAMS and value.dtype.kind == "f":
                assert np.allclose(value, got[name], rtol=testing.FLOAT_RTOL, atol=testing.FLOAT_ATOL), name
            else:
                assert_same_bits(value, got[name], f"{program.name}: {name}")
