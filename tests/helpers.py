"""What many test files share: random input values; a routine of loop IR run on a backend beside
the interpreter, their bits compared; and a rewritten routine run before and after an
optimization pass, whose bits it must keep (docs/design.md, "Testing").

The other shared modules keep their own roles: ``handbuilt`` builds assignments and loop IR by
hand, ``backend_params`` parametrizes tests over backends, ``golden`` pins printed code,
``imports`` reads a module's imports.
"""

from __future__ import annotations

import numpy as np

from ocannl import testing
from ocannl.backends.registry import get_backend
from ocannl.backends.interp import InterpBackend
from ocannl.lowlevel import dtypes
from handbuilt import pointwise_loop
from ocannl.lowlevel.ir import Binary, Const, Load, RoutineIR, seq
from ocannl.lowlevel.scalar_ops import LIBM_MAX_ULPS, LIBM_OPS, Binop
from ocannl.lowlevel.tnode import TNode

# The operators whose results the C library computes, not correctly rounded: the library's LIBM_OPS,
# and pow, which C and MSL print as a call too; compared with :func:`assert_close_ulps`.
APPROXIMATE_OPS = LIBM_OPS | {Binop.POW}
# The catalog's programs that apply them (ocannl/testing.py names them): their gradients amplify the ulps.
LIBM_PROGRAMS = {f"{'unary' if op.arity == 1 else 'binary'} {op.value}" for op in APPROXIMATE_OPS}


def data(*shape: int, rng: np.random.Generator | int | None = None, dtype=np.float32, mean: float = 0.0,
         negative_zeros: bool = False) -> np.ndarray:
    """Normal values of ``shape`` around ``mean``, drawn from ``rng`` (a generator or a seed); with
    no ``rng``, seeded by the shape, so that a program built again in a fresh session reads the
    same values. ``negative_zeros`` makes every third value ``-0.0``, so that a lost sign shows."""
    values = np.random.default_rng(sum(shape) if rng is None else rng).standard_normal(shape).astype(dtype)
    if mean:
        values += values.dtype.type(mean)
    if negative_zeros:
        values.flat[::3] = -0.0
    return values


def random_inputs(routine: RoutineIR, seed: int) -> dict[TNode, np.ndarray]:
    """Standard-normal values for every node ``routine`` reads and does not write."""
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(n.dims).astype(n.dtype.storage) for n in routine.reads if n not in routine.writes}


def catalog_for(backend: str) -> list[testing.Program]:
    """The conformance catalog without the programs computing in a type ``backend`` lacks (Metal
    has no float64)."""
    unsupported = set(getattr(get_backend(backend), "unsupported_dtypes", ()))
    return [p for p in testing.catalog() if not p.needs & unsupported]


def storage_shape(node: TNode) -> tuple[int, ...]:
    """The shape of ``node``'s buffer: a ``uint4x32`` cell is four ``uint32`` words."""
    return node.dims + ((4,) if node.dtype is dtypes.uint4x32 else ())


def run_on(backend, routine: RoutineIR, inputs: dict, bindings: dict | None = None) -> dict[TNode, np.ndarray]:
    """Run ``routine`` on ``backend`` (an instance or a name) from ``inputs`` (zeros elsewhere):
    the buffers it writes."""
    if isinstance(backend, str):
        backend = get_backend(backend)
    buffers = {}
    for node in routine.reads + routine.writes:
        if node in inputs:
            value = np.array(inputs[node], dtype=node.dtype.storage).reshape(storage_shape(node))
            buffers[node] = np.ascontiguousarray(value)
        else:
            buffers[node] = np.zeros(storage_shape(node), dtype=node.dtype.storage)
    backend.compile(routine).run(buffers, bindings or {})
    return {node: buffers[node] for node in routine.writes}


def run_both(backend, routine: RoutineIR, inputs: dict, bindings: dict | None = None):
    """``routine`` run on the interpreter and on ``backend``: the two results of :func:`run_on`."""
    return run_on(InterpBackend(), routine, inputs, bindings), run_on(backend, routine, inputs, bindings)


def float16_bfloat16_routine(n: int):
    """``x`` stored as float16 and as bfloat16, the two read back and added, and a bfloat16 times
    3 stored as float16: ``(routine, x, outputs)``."""
    x = TNode("x", (n,), dtypes.float32)
    h = TNode("h", (n,), dtypes.float16)
    b = TNode("b", (n,), dtypes.bfloat16)
    back = TNode("back", (n,), dtypes.float32)
    sum_hb = TNode("sum_hb", (n,), dtypes.float16)
    body = seq(
        pointwise_loop(h, lambda i: Load(x, (i,))),
        pointwise_loop(b, lambda i: Load(x, (i,))),
        pointwise_loop(back, lambda i: Binary(Binop.ADD, Load(h, (i,)), Load(b, (i,)))),
        pointwise_loop(sum_hb, lambda i: Binary(Binop.MUL, Load(b, (i,)), Const(3.0))),
    )
    return RoutineIR("halves", body), x, (h, b, back, sum_hb)


def float16_bfloat16_values(n: int) -> np.ndarray:
    """Ties and near-ties of both formats, subnormals, overflow, NaN, and random bit patterns."""
    special = np.array(
        [1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-8, 1 + 3 * 2**-8, 2**-24, 2**-25, 3 * 2**-26, 2**-14 - 2**-25,
         65504, 65519.99, 65520, -65520, 1e-8, np.inf, -np.inf, np.nan, 0.0, -0.0, 3.4e38, 1.0039062,
         np.float32(1.0) + np.float32(2**-9), 6e-5, -6.1e-5, 1e-45],
        dtype=np.float32,
    )
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    rand = bits.view(np.float32)
    scaled = (rng.standard_normal(n) * 1e3).astype(np.float32)
    return np.concatenate([special, rand, scaled])[:n]


def assert_same_bits(expected: np.ndarray, got: np.ndarray, what: str = "") -> None:
    """Equal bit patterns; floats' NaNs only need to be NaNs on both sides."""
    assert expected.shape == got.shape and expected.dtype == got.dtype, what
    if expected.dtype.kind == "f":
        nan = np.isnan(expected)
        assert np.array_equal(nan, np.isnan(got)), f"{what}: NaNs differ"
        ints = np.dtype(f"u{expected.dtype.itemsize}")
        bad = (expected.view(ints) != got.view(ints)) & ~nan
    else:
        bad = expected != got
    if bad.any():
        i = tuple(int(k) for k in np.argwhere(bad)[0])
        raise AssertionError(f"{what}: expected {expected[i]!r} (the interpreter's) but got {got[i]!r} at {i}")


def assert_close_ulps(expected: np.ndarray, got: np.ndarray, what: str = "") -> None:
    """Within ``LIBM_MAX_ULPS`` units in the last place, with equal signs; NaNs where
    ``expected`` has them."""
    nan = np.isnan(expected)
    assert np.array_equal(nan, np.isnan(got)), f"{what}: NaNs differ"
    e, g = expected[~nan], got[~nan]
    ints = np.dtype(f"i{expected.dtype.itemsize}")
    ulps = np.abs(e.view(ints).astype(np.int64) - g.view(ints).astype(np.int64))
    close = (e == g) | ((np.sign(e) == np.sign(g)) & (ulps <= LIBM_MAX_ULPS))
    assert close.all(), f"{what}: more than {LIBM_MAX_ULPS} ulps apart"


def run_ir(routine: RoutineIR, values: dict, **bindings) -> dict[TNode, np.ndarray]:
    """Every buffer of ``routine`` after one interpreter run from ``values`` (zeros elsewhere),
    its index symbols bound by name."""
    buffers = {}
    for node in routine.reads + routine.writes:
        init = values.get(node)
        buffers[node] = (np.zeros(storage_shape(node), node.dtype.storage) if init is None
                         else np.ascontiguousarray(np.asarray(init, node.dtype.storage)).copy())
    symbols = {s.name: s for s in routine.static_symbols}
    InterpBackend().compile(routine).run(buffers, {symbols[k]: v for k, v in bindings.items()})
    return buffers


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """The same type, shape and bytes (NaNs too: a rewrite of the loop IR keeps every bit)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def assert_pass_keeps_bits(before: RoutineIR, after: RoutineIR, values: dict, **bindings) -> None:
    """Every buffer holds after ``after`` what it holds after ``before``, bit for bit: what an
    optimization pass must keep."""
    want, got = run_ir(before, values, **bindings), run_ir(after, values, **bindings)
    for node, array in got.items():
        assert same_bits(array, want[node]), f"{node.debug_name}: {array} != {want[node]}"
