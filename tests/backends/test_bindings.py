"""Index symbol bindings: checked once for every backend (``Routine.run``), passed as 64-bit
integers everywhere, and a symbol without a size bound past the axis it indexes is the same
OutOfBoundsError on every backend (never a read of another row).
"""

from __future__ import annotations

import numpy as np
import pytest

import ocannl as oc
from ocannl.errors import BackendUnavailable, IndexBindingError, OutOfBoundsError

BACKENDS = ("interp", "c", "metal", "triton")

ROWS = np.arange(12, dtype=np.float32).reshape(4, 3)


@pytest.fixture(params=BACKENDS)
def ctx(request) -> oc.Context:
    try:
        return oc.Context(request.param)
    except BackendUnavailable as e:
        pytest.skip(str(e))


def _row_reader(ctx: oc.Context, symbol: oc.IndexSymbol):
    """A routine copying row ``symbol`` of ROWS (a batch axis of 4), and a function binding it
    and returning the row."""
    xs = oc.tensor(ROWS, batch=1, label="rows")
    row = (xs[symbol] * 1).materialize()
    routine = ctx.compile(row)

    def read(value):
        routine.run(**{symbol.name: value})
        return ctx.get(row.value)

    return routine, read


def test_a_binding_past_32_bits_is_out_of_bounds_on_every_backend(ctx):
    _, read = _row_reader(ctx, oc.IndexSymbol("b"))  # no size: the access is checked
    np.testing.assert_array_equal(read(1), ROWS[1])
    for value in (2**32 + 1, 2**32, 4, 2**40, 2**62, 2**63 - 1):  # never an overflow of the offset
        with pytest.raises(OutOfBoundsError) as info:
            read(value)
        # Triton's error flag carries no site: its message points to the interpreter instead.
        assert ("rows" if ctx.backend_name != "triton" else "interp backend") in str(info.value)
    np.testing.assert_array_equal(read(3), ROWS[3])  # the routine still runs afterwards


def test_a_far_binding_is_out_of_bounds_in_the_scalar_interpreter_too():
    _, read = _row_reader(oc.Context("interp", interp_mode="scalar"), oc.IndexSymbol("b"))
    with pytest.raises(OutOfBoundsError, match=r"read of rows at index \(4611686018427387904, 0\)"):
        read(2**62)


def test_numpy_integers_bind(ctx):
    _, read = _row_reader(ctx, oc.IndexSymbol("b"))
    for value in (np.int64(2), np.int32(2), np.uint8(2), np.uint64(2)):
        np.testing.assert_array_equal(read(value), ROWS[2])


@pytest.mark.parametrize("value", [True, np.bool_(False), 2.0, np.float32(1.0), "1", None])
def test_bools_floats_and_others_are_refused(value):
    _, read = _row_reader(oc.Context("interp"), oc.IndexSymbol("b"))
    with pytest.raises(IndexBindingError, match=r"routine mul_fwd: index symbol b must be bound to an int"):
        read(value)


def test_ranges_are_checked_before_any_backend_runs(ctx):
    sized = oc.IndexSymbol("n", 4)
    _, read = _row_reader(ctx, sized)
    with pytest.raises(IndexBindingError, match=r"n = 4 is outside \[0, 4\), the range of its size 4"):
        read(4)
    with pytest.raises(IndexBindingError, match=r"n = -1 is outside \[0, 4\)"):
        read(-1)
    _, read_unsized = _row_reader(ctx, oc.IndexSymbol("u"))
    with pytest.raises(IndexBindingError, match=r"u = 9223372036854775808 is outside \[0, 9223372036854775808\)"):
        read_unsized(2**63)
    with pytest.raises(IndexBindingError, match=r"u = -1 is outside"):
        read_unsized(-1)


def test_a_symbol_in_arithmetic_keeps_64_bits(ctx):
    """``s * 1.0`` reads the bound value whole: 2**40 does not wrap through 32 bits."""
    s = oc.IndexSymbol("s")
    y = (s * 1.0).materialize()
    routine = ctx.compile(y)
    for value in (3, 2**31 + 5, 2**40):
        routine.run(s=value)
        assert ctx.get(y.value) == np.float32(value)


def test_generated_code_takes_64_bit_bindings():
    """The C function and the Metal kernels declare each symbol 64-bit."""
    from ocannl.backends.c.emit import emit_c
    from ocannl.backends.metal.emit import Options, emit_metal

    ctx = oc.Context("interp")
    routine, _ = _row_reader(ctx, oc.IndexSymbol("b"))
    assert "int64_t _s_b)" in emit_c(routine.ir).text
    assert "constant long& _s_b" in emit_metal(routine.ir, Options()).text


def test_triton_checked_scalar_indices_compile_for_the_gpu():
    """The interpreter accepts what the GPU compiler may not: the forms a binding past the axis
    and a scalar gather position produce (a scalar-masked store of the error flag, a clamped
    index) go through Triton's compiler for sm_90 too."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from ocannl import session
    from ocannl.backends.triton import generate
    from ocannl.backends.triton.gpu_check import compile_for_gpu

    def routines(build):
        session.reset()
        ctx, irs = oc.Context("interp"), []
        compile_ir = ctx.backend.compile
        ctx.backend.compile = lambda ir: (irs.append(ir), compile_ir(ir))[1]
        ctx.compile(*build())
        return irs

    builds = [
        lambda: [oc.tensor(ROWS, batch=1)[oc.IndexSymbol("b")] * 1],
        lambda: [oc.IndexSymbol("s") * 1.0],
        lambda: [oc.take(oc.tensor(ROWS), oc.tensor(np.array([2**32 - 1], np.uint32)))],
        lambda: [oc.take(oc.tensor(ROWS), oc.tensor(np.array([1, 2**40])))],
    ]
    sizes = compile_for_gpu([generate(ir) for build in builds for ir in routines(build)])
    assert len(sizes) == 4 and all(b.cubin_bytes > 0 for b in sizes.values())
