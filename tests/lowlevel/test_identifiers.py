"""Labels and index symbol names reach generated code only as sanitized identifiers and escaped
comments (ocannl/lowlevel/identifiers.py): any text compiles, computes the right values on every
backend, and executes nothing."""

from __future__ import annotations

import ast
import keyword
import os
import re
import symtable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import ocannl as oc  # noqa: E402
from ocannl import session, testing  # noqa: E402
from ocannl.backends.context import Context  # noqa: E402
from ocannl.backends.registry import get_backend  # noqa: E402
from ocannl.backends.c.emit import emit_c, function_name  # noqa: E402
from ocannl.errors import BackendUnavailable, IndexBindingError  # noqa: E402
from ocannl.lowlevel import dtypes  # noqa: E402
from ocannl.lowlevel.identifiers import (  # noqa: E402
    RESERVED,
    Namespace,
    comment_text,
    is_identifier,
    is_reserved,
    sanitize_identifier,
    string_literal,
)
from ocannl.lowlevel.indexing import IndexSymbol, Iter, Symbol  # noqa: E402
from ocannl.lowlevel.ir import Binary, Cast, Comment, EmbedIndex, Load, RoutineIR, Store, Unary, loop, seq  # noqa: E402
from ocannl.lowlevel.scalar_ops import Binop, Unop  # noqa: E402
from ocannl.lowlevel.tnode import TNode  # noqa: E402


def _available(name: str) -> bool:
    try:
        get_backend(name)
    except BackendUnavailable:
        return False
    return name != "triton" or os.environ.get("TRITON_INTERPRET") == "1"


COMPILED = [pytest.param(name, marks=pytest.mark.skipif(not _available(name), reason=f"{name} cannot run here"))
            for name in ("c", "metal", "triton")]
EVERY_BACKEND = [pytest.param("interp"), *COMPILED]

PAYLOAD = 'y""" + str(__import__("os").system("echo INJECTED")) + """'
"""The injection of the issue: closes the Triton module's docstring and runs a shell command."""

HOSTILE = sorted(
    set(keyword.kwlist + keyword.softkwlist)
    | set(
        """self cls def lambda None assert XBLOCK RBLOCK BLOCK_M BLOCK_K GROUP_M error tl triton launch
        buffers symbols FP_FUSION num_warps num_stages debug grid warmup range float int len min max
        auto register restrict signed sizeof _Bool class template compl and_eq typename
        kernel device constant thread threadgroup half bfloat uint gid lid float4 as_type select clamp
        M_PI M_PI_2 M_PI_4 INFINITY NAN NULL HUGE_VAL FLT_MAX INT32_MIN EOF errno unix linux MAXFLOAT
        isnan expf sqrtf fmaxf memset malloc free printf exit
        i0 i1 v3 _status _s_x _g ocannl_index ocannl_relu_f32 pid xindex xmask rindex acc t0 x0
        routine sym n1""".split()
    )
    | {"ⅰ", "i", "ﬁ", "ñandú", "日本", "a\x00b", "line\nbreak", "*/", "/*", '"""', "'", "\\", "\ud800",
       PAYLOAD, 'n"] + str(__import__("os").system("echo INJECTED")) + symbols["n', "x" * 320}
)
"""Names of every target's keywords, builtins, macros and generated names, and text that breaks
out of comments, docstrings and string literals: written here independently of the module's
own lists."""


def _slice_program(labels: tuple[str, str, str], names: tuple[str, str]):
    """``y = relu(xs[s] * w + t)``: ``s`` slices, ``t`` is read as a number; every tensor and
    symbol carries a label or name under test."""
    data = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)
    weights = np.array([1.5, -2.0, 0.25, 3.0], np.float32)
    s, t = IndexSymbol(names[0], 3), IndexSymbol(names[1], 5)
    xs = oc.tensor(data, batch=1, label=labels[0])
    w = oc.tensor(weights, label=labels[1])
    y = oc.relu(xs[s] * w + t, label=labels[2])

    def expected(k_s: int, k_t: int) -> np.ndarray:
        return np.maximum(data[k_s] * weights + np.float32(k_t), np.float32(0))

    return y, expected


def _check_program(backend: str, labels: tuple[str, str, str], names: tuple[str, str]) -> None:
    session.reset()
    y, expected = _slice_program(labels, names)
    routine = Context(backend).compile(y)
    for k_s, k_t in ((1, 4), (2, 0)):
        routine.run(**{names[0]: k_s, names[1]: k_t})
        np.testing.assert_array_equal(y.numpy(), expected(k_s, k_t))


# ---------------------------------------------------------------------------------------------
# The payload


@pytest.mark.parametrize("backend", EVERY_BACKEND)
def test_label_payload_executes_nothing(backend, capfd):
    y = oc.relu(oc.tensor(np.arange(4, dtype=np.float32)), label=PAYLOAD)
    Context(backend).compile(y).run()
    np.testing.assert_array_equal(y.numpy(), np.arange(4, dtype=np.float32))
    assert "INJECTED" not in capfd.readouterr().out


@pytest.mark.parametrize("backend", EVERY_BACKEND)
def test_symbol_name_payloads_execute_nothing(backend, capfd):
    names = (PAYLOAD, 'n"] + str(__import__("os").system("echo INJECTED")) + symbols["n')
    _check_program(backend, (PAYLOAD, "*/ system(1); /*", "w\\"), names)
    assert "INJECTED" not in capfd.readouterr().out


@pytest.mark.skipif(not _available("triton"), reason="triton cannot run here")
def test_triton_sources_carry_user_text_only_escaped():
    """The module parses, calls nothing of the payload, and Triton's compiler for an H100 (which
    needs no GPU) accepts kernels whose parameters come from hostile names."""
    from ocannl.backends.triton import generate
    from ocannl.backends.triton.gpu_check import compile_for_gpu

    y, _ = _slice_program((PAYLOAD, '"""', "\\N"), (PAYLOAD, "num_warps"))
    source = generate(Context("interp").compile(y).ir)
    tree = ast.parse(source.text)  # fails if a docstring closed early
    called = {ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    assert not any("import" in f or "system" in f or f == "str" for f in called), called
    assert compile_for_gpu([source])


# ---------------------------------------------------------------------------------------------
# Reserved and colliding names


@pytest.mark.parametrize("backend", EVERY_BACKEND)
@pytest.mark.parametrize("names", [
    ("def", "lambda", "None", "assert", "XBLOCK", "error"),
    ("self", "M_PI", "tl", "num_warps", "debug", "kernel"),
    ("i0", "_s_x", "s_x", "ocannl_index", "gid", "float4"),
    ("ⅰ", "i", "a-b", "a_b", "a b", "日本", "本"),  # alike once sanitized (NFKC folds ⅰ to i)
])
def test_reserved_symbol_names_compile_everywhere(backend, names):
    data = np.arange(len(names) * 2, dtype=np.float32).reshape(len(names), 2)
    xs = oc.tensor(data, batch=1, label="xs")
    total, expected = None, np.zeros(2, np.float32)
    bindings = {}
    for k, name in enumerate(names):
        sym = IndexSymbol(name, len(names))
        bindings[name] = (3 * k + 1) % len(names)
        term = xs[sym] * (sym + 1)
        total = term if total is None else total + term
        expected = expected + data[bindings[name]] * np.float32(bindings[name] + 1)
    routine = Context(backend).compile(total)
    routine.run(**bindings)
    np.testing.assert_allclose(total.numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize("backend", EVERY_BACKEND)
def test_index_symbol_self_binds(backend):
    sym = IndexSymbol("self", 4)
    xs = oc.tensor(np.arange(8, dtype=np.float32).reshape(4, 2), batch=1)
    y = xs[sym] + 0
    routine = Context(backend).compile(y)
    routine.run(self=3)
    np.testing.assert_array_equal(y.numpy(), [6.0, 7.0])


@pytest.mark.parametrize("backend", [*COMPILED])
def test_macro_labels_and_their_renamings(backend):
    """``M_PI`` twice: renaming the second to ``M_PI_2`` would hit math.h's macro."""
    session.reset()
    tensors = [oc.tensor(np.full(3, k + 1.0, np.float32), label=label)
               for k, label in enumerate(["M_PI", "M_PI", "M_PI_2", "M_PI_4", "NAN", "INT32_MIN", "XBLOCK"])]
    total = tensors[0]
    for t in tensors[1:]:
        total = total + t
    Context(backend).compile(total).run()
    np.testing.assert_array_equal(total.numpy(), np.full(3, 28.0, np.float32))


def test_index_symbol_names_are_any_string():
    assert IndexSymbol("def").identifier == "def" and IndexSymbol("日本").identifier == "sym"
    for bad in ("", None, 3):
        with pytest.raises(IndexBindingError, match="non-empty string"):
            IndexSymbol(bad)


# ---------------------------------------------------------------------------------------------
# The sanitizer and the escapers


def test_names_are_unique_and_reserved_nowhere():
    scope = Namespace()
    claimed = [scope.claim(base, 7) for base in ["M_PI", "M_PI", "NAN", "XBLOCK", "def", "i0", "ocannl_relu",
                                                 "OCANNL_X", "m_pi", "w", "w"]]
    assert claimed == ["m_pi", "m_pi_7", "nan_7", "xblock_7", "def_7", "i0_7", "n_ocannl_relu", "n_ocannl_x",
                       "m_pi_7_1", "w", "w_7"]
    assert sanitize_identifier("ⅰ") == sanitize_identifier("i") == "i"
    assert sanitize_identifier("a__b") == "a_b" and sanitize_identifier("ñandú") == "nandu"
    assert function_name("memset") == "memset_routine" and function_name("ocannl_x") == "n_ocannl_x"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(HOSTILE), st.text(min_size=1)), min_size=1, max_size=12),
       st.sampled_from([None, 1, "sym", "n3"]))
def test_claimed_names_are_identifiers_of_every_target(texts, tag):
    scope = Namespace(prefixes=["fn_tile"])
    names = [scope.claim(sanitize_identifier(t) or "n", tag) for t in texts]
    assert len(set(names)) == len(names)
    for name in names:
        assert is_identifier(name) and not is_reserved(name) and name.isidentifier(), name
        assert not name.lower().startswith("fn_tile") and not keyword.iskeyword(name)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.sampled_from(HOSTILE), st.text()))
def test_escaped_text_cannot_leave_a_comment_or_literal(text):
    line = comment_text(text)
    assert line.isascii() and line.isprintable() and "\n" not in line
    assert "*/" not in line and "/*" not in line and '"' not in line and "\\" not in line
    assert ast.literal_eval(f'"""{line} """') == f"{line} "  # a docstring that ends where it should
    literal = string_literal(text)
    assert literal.isascii() and ast.literal_eval(literal) == text


@pytest.mark.skipif(not _available("triton"), reason="triton cannot run here")
def test_every_global_a_triton_kernel_reads_is_reserved():
    """A node or symbol name (a kernel parameter) can never shadow a name the generated module
    relies on: every name a kernel or ``launch`` reads from the module or the builtins is
    reserved."""
    from ocannl.backends.triton import generate

    seen = set()
    for program in testing.catalog():
        session.reset()
        routine = Context("interp").compile(*program.build())
        module = symtable.symtable(generate(routine.ir).text, "module", "exec")
        kernels = {child.get_name() for child in module.get_children()}
        for function in module.get_children():
            for symbol in function.get_symbols():
                if symbol.is_global() and symbol.get_name() not in kernels:
                    seen.add(symbol.get_name())
                    assert symbol.get_name() in RESERVED, (program.name, symbol.get_name())
    assert {"tl", "range"} <= seen


def test_every_name_a_c_function_uses_is_reserved_or_generated():
    """What the C function refers to is a node, a symbol, a generated local (``i0``, ``v0``,
    ``_...``), its own helpers, or a name of the language and headers: all reserved."""
    tensors = [TNode(label, (3,), dtypes.float32) for label in ("x", "y")]
    out = TNode("out", (3,), dtypes.float32)
    i, step = Symbol(), IndexSymbol("step", 4)
    value = Binary(Binop.ADD, Unary(Unop.EXP, Load(tensors[0], (Iter(i),))), Load(tensors[1], (Iter(i),)))
    value = Binary(Binop.MUL, value, Cast(EmbedIndex(Iter(step), dtypes.int32), dtypes.float32))
    body = seq(Comment("a comment"), loop(i, 3, Store(out, (Iter(i),), Unary(Unop.SQRT, value))))
    source = emit_c(RoutineIR("r", body)).text
    code = source[source.index(f"int {function_name('r')}("):]
    code = re.sub(r"/\*.*?\*/|\"[^\"]*\"|^#.*$", "", code, flags=re.M)
    ours = {"x", "y", "out", "r", *(f"{function_name('r')}_{entry}" for entry in ("packed", "steps", "unpacked"))}
    helpers = rf"{function_name('r')}_(tile|nest|part)\d+"  # the functions of its nests (emit.py)
    for word in set(re.findall(r"(?<![\w.])[A-Za-z_]\w*", code)):
        generated = word.startswith("_") or re.fullmatch(r"[iv]\d+", word) or re.fullmatch(helpers, word)
        assert word in ours or generated or is_reserved(word), word


# ---------------------------------------------------------------------------------------------
# Random labels and symbol names on every compiled backend


NAMES = st.one_of(st.sampled_from(HOSTILE), st.text(min_size=1, max_size=24), st.text(min_size=300, max_size=330))


@pytest.mark.parametrize("backend", COMPILED)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(labels=st.tuples(NAMES, NAMES, NAMES), names=st.lists(NAMES, min_size=2, max_size=2, unique=True))
def test_random_labels_and_symbol_names_compute_right(backend, labels, names):
    _check_program(backend, labels, tuple(names))


@pytest.mark.slow
@pytest.mark.parametrize("backend", COMPILED)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(labels=st.tuples(NAMES, NAMES, NAMES), names=st.lists(NAMES, min_size=2, max_size=2, unique=True))
def test_random_labels_and_symbol_names_compute_right_long(backend, labels, names):
    _check_program(backend, labels, tuple(names))


def test_missing_binding_hint_is_valid_python_for_keyword_names():
    import ocannl as oc
    from ocannl.errors import IndexBindingError

    sym = oc.IndexSymbol("def", 3)
    xs = oc.tensor(np.arange(6, dtype=np.float32).reshape(3, 2), batch=1)
    routine = oc.Context("interp").compile(xs[sym] * 2)
    with pytest.raises(IndexBindingError, match=r"run\(\*\*\{'def': 0\}\)"):
        routine.run()


def test_index_symbol_size_must_be_positive():
    import ocannl as oc
    from ocannl.errors import IndexBindingError

    with pytest.raises(IndexBindingError, match="size must be a positive int"):
        oc.IndexSymbol("n", 0)
