"""The C-family syntax base (ocannl/backends/c_family.py) that the C and Metal tables extend.

Both languages print their helper functions from one generator, recorded as the walk prints the
calls: a source defines exactly the helpers it calls, each once per type, before its first call;
every helper, for every type a language has, builds without a warning in C and in MSL (through
the shim); a type the language lacks is refused where it is printed.
"""

from __future__ import annotations

import collections
import re
import subprocess

import pytest

from ocannl.backends.c import CBackend, compiler
from ocannl.backends.c.emit import emit_c
from ocannl.backends.c.syntax import CSyntax
from ocannl.backends.c_family import _HELPERS, CFamilySyntax
from ocannl.backends.metal import MetalBackend, emit_metal, harness
from ocannl.backends.metal.syntax import MetalSyntax
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.dtypes import DType, DTypeError
from ocannl.lowlevel.indexing import Fixed, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Cast, Const, EmbedIndex, Load, LoadDynamic, RoutineIR, Store, Ternary, Unary, loop, seq,
)
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop
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
    ``div`` and ``mod`` too), and ``x`` gathered at a position read from ``y`` (a checked index)."""
    x, y = TNode("x", (n,), dtype), TNode("y", (n,), dtype)
    ops = HELPER_OPS + ((Binop.DIV, Binop.MOD) if not dtype.is_float else ())
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
    # MSL kernels print no register tiles, so no select of a tile's cells (``_blend``).
    expected = [h for h in _HELPERS if language == "c" or not h.endswith("_blend")]
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
            calls.append(syntax.unary(Unop.UNIFORM1, dtype, bits))
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
