"""The C backend's packed GEMM (ocannl/lowlevel/cpu_schedule.py, ``GemmPlan``; the micro-kernels in
ocannl/backends/c/gemm.py): bit for bit the interpreter's results, on every size (ragged ones whose
tiles and panels have edges, one cell, a batch), for matmul, batched matmul and both gradients,
with 1 and 2 OpenMP threads, for each kind of micro-kernel (the host's vectors, AVX2, scalar).

Small products are packed only from ``GEMM_MIN_WORK``; the tests lower it to reach the edge cases
with small, fast sizes.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ocannl as oc
from backend_params import runs_here
from golden import check_golden
from ocannl import nn, session, train
from ocannl.backends.c.emit import emit_c
from ocannl.errors import OcannlError
from ocannl.lowlevel import cpu_schedule, dtypes
from ocannl.lowlevel.cpu_schedule import SharedLoops, Strides, plan_contraction, plan_gemm
from ocannl.lowlevel.indexing import Affine, Iter, Symbol
from ocannl.lowlevel.ir import Binary, Const, For, Load, RoutineIR, Store, loop, seq
from ocannl.lowlevel.scalar_ops import Binop
from ocannl.lowlevel.summation import block_sums
from ocannl.lowlevel.tnode import TNode

needs_c = pytest.mark.skipif(not runs_here("c"), reason="no working C compiler")

SIZES = [(96, 99, 91), (1, 1, 1), (7, 300, 5), (65, 129, 63), (13, 64, 40), (30, 257, 70)]
"""``(m, k, n)``: ragged tiles and panels (96 x 91 with k = 99: a 64-term block and a 35-term
one), one cell, a long thin k, k beyond one ``kc`` panel (257 = 256 + 1), k of one block."""


@pytest.fixture
def packed_from_one(monkeypatch):
    """Every GEMM-class contraction is packed, however small, and runs on threads."""
    for name, value in (("GEMM_MIN_WORK", 1), ("GEMM_MIN_TILES", (0, 0)), ("GEMM_MIN_REUSE", 0),
                        ("GEMM_PARALLEL_MIN_WORK", 1)):
        monkeypatch.setattr(cpu_schedule, name, value)


def results(backend: str, case: str, m: int, k: int, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The values of one computation on ``backend`` (``case``: ``matmul``, ``bias`` (``a @ b +
    bias``, a reduction the optimizer inlines into its consumer), ``batched`` (three products of
    the given size), ``grads`` (one SGD step's gradients of ``sum((a @ b) * r)``)."""
    session.reset()
    rng = np.random.default_rng(seed)
    a_np = rng.standard_normal((m, k)).astype(np.float32)
    b_np = rng.standard_normal((k, n)).astype(np.float32)
    ctx = oc.Context(backend)
    if case == "batched":
        a = oc.tensor(rng.standard_normal((3, m, k)).astype(np.float32), batch=1, input=1)
        b = oc.tensor(rng.standard_normal((3, k, n)).astype(np.float32), batch=1, input=1)
        c = oc.einsum("b|i->o; b|j->i => b|j->o", a, b)
        ctx.compile(c).run()
        return {"c": ctx.get(c.value)}
    if case == "grads":
        a = oc.param("a", output=m, input=k, init=a_np)
        b = oc.param("b", output=k, input=n, init=b_np)
        c = (a @ b).materialize()
        r = oc.tensor(rng.standard_normal((m, n)).astype(np.float32), input=1, label="r")
        update = train.grad_update((c * r).sum())
        ctx.compile(update).run()
        return {"c": ctx.get(c.value), "a.grad": ctx.get(a.grad), "b.grad": ctx.get(b.grad)}
    a, b = oc.tensor(a_np, input=1), oc.tensor(b_np, input=1)
    c = a @ b
    if case == "bias":
        c = c + oc.tensor(rng.standard_normal(n).astype(np.float32), input=1)
    ctx.compile(c).run()
    return {"c": ctx.get(c.value)}


def assert_same_bits(got: dict[str, np.ndarray], expected: dict[str, np.ndarray], what: str) -> None:
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert got[name].shape == value.shape, f"{what}: {name}"
        assert np.array_equal(got[name].view(np.uint32), value.view(np.uint32)), (
            f"{what}: {name} differs from the interpreter in "
            f"{int((got[name].view(np.uint32) != value.view(np.uint32)).sum())} cells")


def c_source(build) -> str:
    """The C source the backend compiles for the computation ``build()`` returns."""
    session.reset()
    routine = oc.Context("c").compile(build())
    return routine._executable.source.text


# ---------------------------------------------------------------------------------------------
# Bits


@needs_c
@pytest.mark.parametrize("case", ["matmul", "bias", "batched", "grads"])
@pytest.mark.parametrize("m,k,n", SIZES, ids=[f"{m}x{k}x{n}" for m, k, n in SIZES])
def test_packed_gemm_equals_interpreter(packed_from_one, case, m, k, n):
    assert_same_bits(results("c", case, m, k, n), results("interp", case, m, k, n), f"{case} {m}x{k}x{n}")


@needs_c
def test_every_product_of_a_training_step_is_packed(packed_from_one):
    """The forward product and both gradient products print as packed GEMMs."""
    def build():
        a = oc.param("a", output=30, input=70, init=np.ones((30, 70), np.float32))
        b = oc.param("b", output=70, input=20, init=np.ones((70, 20), np.float32))
        return train.grad_update(((a @ b).materialize() * oc.tensor(np.ones((30, 20), np.float32), input=1)).sum())

    text = c_source(build)
    assert text.count("as a packed GEMM") == 3, text
    assert "static OCANNL_GEMM_FN void ocannl_gemm_" in text
    from ocannl.backends.c import compiler
    assert (text.count("#pragma omp parallel\n") == 3) == compiler.toolchain().openmp


def dense_relu_step(k: int):
    """A dense layer's SGD step, ``relu(w @ x + b)``, whose forward product the optimizer inlines
    into the bias add."""
    rng = np.random.default_rng(1)
    x = oc.tensor(rng.standard_normal((24, k)).astype(np.float32), batch=1, label="x")
    w = oc.param("w", output=40, init=rng.standard_normal((40, k)).astype(np.float32) / 16)
    b = oc.param("b", output=40, init=rng.standard_normal(40).astype(np.float32))
    w2 = oc.param("w2", output=k, init=rng.standard_normal((k, 40)).astype(np.float32) / 8)
    update = train.grad_update((w2 @ oc.relu(w @ x + b)).relu().mean())
    return update, train.sgd_update(update, lr=0.1)


@needs_c
@pytest.mark.parametrize("k", [cpu_schedule.GEMM_BLOCKING[1] // 2 + 7, cpu_schedule.GEMM_BLOCKING[1] + 44],
                         ids=["one panel", "two panels"])
def test_products_inlined_into_their_consumers_run_as_gemms(packed_from_one, k):
    """A product inlined into its consumer (a bias add, relu's gradient mask) runs as a packed GEMM into the result,
    then the consumer over it (``cpu_schedule.gemm_with_epilogue``), with its terms in one ``kc``
    panel or several: the interpreter's bits."""
    values = {}
    for name in ("c", "interp"):
        session.reset()
        update, sgd = dense_relu_step(k)
        ctx = oc.Context(name)
        step = ctx.compile(update, sgd)
        for _ in range(2):
            step.run()
        values[name] = {p.label: ctx.get(p.value) for p in update.params}
        if name == "c":
            text = step._executable.source.text
            split = [s for s in step.ir.body.stmts if isinstance(s, For)
                     and cpu_schedule.gemm_with_epilogue(s, 32) is not None]
            # The forward product with its bias add; the product giving relu's input gradient
            # with relu's mask (``add.grad``: intermediate gradients are inlined).
            assert len(split) == 2, "the forward product with its bias add, the backward one with its mask"
            assert text.count("as a packed GEMM") >= len(split) + 1, text
    assert_same_bits(values["c"], values["interp"], "dense relu step")


@needs_c
@pytest.mark.parametrize("m,k,n", [(16, 32, 16), (64, 128, 10)])
def test_small_and_narrow_products_keep_register_tiles(m, k, n):
    """Below ``GEMM_MIN_WORK`` multiply-adds, or narrower than a micro-kernel tile
    (``GEMM_MIN_TILES``), packing would cost more than it saves."""
    text = c_source(lambda: oc.tensor(np.ones((m, k), np.float32), input=1)
                    @ oc.tensor(np.ones((k, n), np.float32), input=1))
    assert "as a packed GEMM" not in text and "register tiles" in text


@needs_c
@pytest.mark.slow
def test_packed_gemm_1024_equals_interpreter():
    assert_same_bits(results("c", "matmul", 1024, 1024, 1024), results("interp", "matmul", 1024, 1024, 1024), "1024")


def transformer_step_values(packed: bool) -> dict[str, np.ndarray]:
    """A transformer block's parameters after two SGD steps on C, every GEMM-class contraction
    packed or none: its attention's einsums have batch and head loops around their products,
    its projections rows and columns of two loops each, its gradients sums over two batch loops
    in blocks."""
    session.reset()
    oc.seed(0)
    rng = np.random.default_rng(0)
    x = oc.tensor(rng.standard_normal((4, 16, 32)).astype(np.float32), batch=2, label="x")
    target = oc.tensor(rng.standard_normal((4, 16, 32)).astype(np.float32), batch=2, label="target")
    block = nn.transformer_block(num_heads=2, d_k=16, d_ff=64, label="block")
    diff = block(x) - target
    update = train.grad_update((diff * diff).mean(label="loss"))
    ctx = oc.Context("c")
    routine = ctx.compile(update, train.sgd_update(update, lr=0.1))
    assert ("as a packed GEMM" in routine._executable.source.text) == packed
    routine.run()
    routine.run()
    return {p.label: ctx.get(p.value) for p in block.params}


@needs_c
def test_attention_and_projections_packed_equal_register_tiles(monkeypatch):
    """The same C code but for the GEMMs, so the math library (which may differ from numpy's in
    the last bit) is the same on both sides."""
    monkeypatch.setattr(cpu_schedule, "GEMM_MIN_WORK", 1 << 62)
    tiles = transformer_step_values(packed=False)
    monkeypatch.setattr(cpu_schedule, "GEMM_MIN_WORK", 1)
    monkeypatch.setattr(cpu_schedule, "GEMM_MIN_TILES", (0, 0))
    monkeypatch.setattr(cpu_schedule, "GEMM_MIN_REUSE", 0)
    assert_same_bits(transformer_step_values(packed=True), tiles, "transformer block")


def cnn_step_values(backend: str) -> dict[str, np.ndarray]:
    """Two SGD steps of two 3x3 convolutions (padded, then strided and valid) over a batch of
    8x8 images of 3 channels: their products over channels and taps are implicit GEMMs."""
    session.reset()
    oc.seed(0)
    rng = np.random.default_rng(0)
    x = oc.tensor(rng.standard_normal((8, 8, 8, 3)).astype(np.float32), batch=1, label="x")
    conv1, conv2 = nn.conv2d(16, label="conv1"), nn.conv2d(8, stride=2, use_padding=False, label="conv2")
    y = conv2(oc.relu(conv1(x)))
    update = train.grad_update((y * y).mean(label="loss"))
    ctx = oc.Context(backend)
    routine = ctx.compile(update, train.sgd_update(update, lr=0.01))
    routine.run()
    routine.run()
    return {p.label: ctx.get(p.value) for p in (*conv1.params, *conv2.params)}


@needs_c
def test_convolutions_as_implicit_gemms_equal_interpreter(packed_from_one):
    session.reset()
    assert_same_bits(cnn_step_values("c"), cnn_step_values("interp"), "cnn")


@needs_c
def test_both_renderings_of_the_gemm_loops_fetch_the_next_tiles_cells(packed_from_one):
    """The shared loops (a batch of products at linear offsets) and a product's own loops (a
    convolution, whose rows are not linear in one flat index) both ask for the block's next tile
    on the first panel; the values are the interpreter's (the convolution test above)."""
    rng = np.random.default_rng(0)

    def batched():
        a = oc.tensor(rng.standard_normal((3, 20, 9)).astype(np.float32), batch=1, input=1)
        b = oc.tensor(rng.standard_normal((3, 9, 40)).astype(np.float32), batch=1, input=1)
        return oc.einsum("b|i->o; b|j->i => b|j->o", a, b)

    def convolution():
        x = oc.tensor(rng.standard_normal((4, 8, 8, 3)).astype(np.float32), batch=1)
        return nn.conv2d(16, label="conv")(x)

    shared, own = c_source(batched), c_source(convolution)
    assert "ocannl_gemm_loops_" in shared and "if (pc == 0 && g->c_cols == 1) {" in shared, shared
    assert "__builtin_prefetch(c + g->c_rows*(ic + ni + r) + (jc + nj), 1, 3);" in shared
    assert "ocannl_gemm_loops_" not in own and "if (_pc == 0) {  /* the next tile's cells" in own, own
    assert re.search(r"__builtin_prefetch\(&\w+\[.*\] \+ 16\*\(_ni - _ir \+ _r\) \+ \(_nj - _jr\), 1, 3\);", own), (
        "16 output channels: the next row of cells is 16 floats on")


# ---------------------------------------------------------------------------------------------
# Threads and targets

_THREADS_SCRIPT = """
import json, sys
import numpy as np
from ocannl.lowlevel import cpu_schedule
cpu_schedule.GEMM_MIN_WORK = 1
cpu_schedule.GEMM_MIN_TILES = (0, 0)
cpu_schedule.GEMM_MIN_REUSE = 0
cpu_schedule.GEMM_PARALLEL_MIN_WORK = 1
from test_c_gemm import results
out = {}
for case, m, k, n in json.loads(sys.argv[1]):
    for name, value in results("c", case, m, k, n).items():
        out[f"{case} {m}x{k}x{n} {name}"] = value
np.savez(sys.argv[2], **out)
"""


@needs_c
@pytest.mark.parametrize("threads", [1, 2])
def test_bits_do_not_depend_on_the_thread_count(tmp_path, threads):
    """Every product runs in a parallel region (``GEMM_PARALLEL_MIN_WORK`` lowered); OpenMP reads
    its thread count when it starts, so each count runs in a process of its own."""
    cases = [("matmul", 96, 99, 91), ("grads", 65, 129, 63), ("batched", 40, 300, 33), ("bias", 130, 200, 70)]
    tests_dir = Path(__file__).resolve().parent
    env = dict(os.environ, OMP_NUM_THREADS=str(threads),
               PYTHONPATH=os.pathsep.join([str(tests_dir), str(tests_dir.parent), os.environ.get("PYTHONPATH", "")]))
    path = tmp_path / "c.npz"
    subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, json.dumps(cases), str(path)], env=env, check=True,
                   timeout=300)
    got = np.load(path)
    for case, m, k, n in cases:
        for name, value in results("interp", case, m, k, n).items():
            key = f"{case} {m}x{k}x{n} {name}"
            assert np.array_equal(got[key].view(np.uint32), value.view(np.uint32)), f"{key}, {threads} threads"


@needs_c
def test_a_batch_of_products_is_shared_out_by_product_first(packed_from_one):
    """64 products (attention's heads) give each thread units of whole products, each packing
    its operands once; 3 products on 2 threads still split each in two (the bits: above)."""
    def batched(count: int):
        return lambda: oc.einsum("b|i->o; b|j->i => b|j->o",
                                 oc.tensor(np.ones((count, 64, 32), np.float32), batch=1, input=1),
                                 oc.tensor(np.ones((count, 32, 64), np.float32), batch=1, input=1))

    for count in (64, 3):
        text = c_source(batched(count))
        assert f".outer = {{{count}, 1, 1}}" in text, "the products, for the shared loops to share out"
        assert "products == 1 ? 2*nt : (2*nt + products - 1) / products" in text


def use_isa(monkeypatch, isa: str) -> None:
    """Builds for ``isa`` (``host``: the machine's own vectors), skipping where this CPU or
    compiler has no such target."""
    if isa == "host":
        return
    monkeypatch.setenv("OCANNL_C_ISA", isa)
    from ocannl.backends.c import compiler
    try:
        compiler.toolchain()
    except OcannlError as e:  # this CPU or compiler has no such target
        pytest.skip(f"c_isa={isa}: {e}")


@needs_c
@pytest.mark.parametrize("isa,kernel", [
    ("portable", "_f32_"),
    *(pytest.param(isa, kernel, marks=pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                                         reason="an x86-64 target"))
      for isa, kernel in (("x86-64-v2", "_f32x4_"), ("x86-64-v3", "_f32x8_"))),
])
def test_each_micro_kernel_equals_interpreter(packed_from_one, monkeypatch, isa, kernel):
    """The scalar kernel of ``portable``, the SSE one of ``x86-64-v2`` (4 floats a vector) and
    the AVX2 one of ``x86-64-v3`` (8), besides the host's own (the tests above)."""
    use_isa(monkeypatch, isa)
    text = c_source(lambda: oc.tensor(np.ones((20, 70), np.float32), input=1)
                    @ oc.tensor(np.ones((70, 30), np.float32), input=1))
    assert "ocannl_gemm_" in text and kernel in text
    for case, (m, k, n) in [("matmul", (96, 99, 91)), ("grads", (13, 64, 40)), ("bias", (30, 257, 70))]:
        assert_same_bits(results("c", case, m, k, n), results("interp", case, m, k, n), f"{isa} {case}")


ATTENTION_PRODUCTS = {
    "scores": ("b|t,h,d; b|u,h,d => b|t,h,u", (3, 32, 2, 16), (3, 32, 2, 16)),
    "values": ("b|t,h,u; b|u,h,d => b|t,h,d", (3, 32, 2, 32), (3, 32, 2, 16)),
    "values.grad": ("b|t,h,u; b|t,h,d => b|u,h,d", (3, 32, 2, 32), (3, 32, 2, 16)),
}
"""Attention's batched products (a batch of 3, 2 heads, 32 positions, 16 values a head): the
scores read the keys across their rows (packed where the kernel loads vectors), the values and their gradient read both operands
in place, the gradient its left operand along a column (``k`` 64 floats apart)."""


def attention_product(backend: str, name: str) -> np.ndarray:
    spec, a_shape, b_shape = ATTENTION_PRODUCTS[name]
    session.reset()
    rng = np.random.default_rng(3)
    a = oc.tensor(rng.standard_normal(a_shape).astype(np.float32), batch=1)
    b = oc.tensor(rng.standard_normal(b_shape).astype(np.float32), batch=1)
    c = oc.einsum(spec, a, b)
    ctx = oc.Context(backend)
    routine = ctx.compile(c)
    routine.run()
    text = routine._executable.source.text if backend == "c" else ""
    return ctx.get(c.value), text


AVX512 = pytest.param("x86-64-v4", marks=pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                                             reason="an x86-64 target"))
"""AVX-512's 16-float vectors (16 x 16 and 8 x 16 tiles), where the code's shape is asserted; the
host's own target is checked for its bits only (its vectors are the machine's)."""


@needs_c
@pytest.mark.parametrize("isa", ["host", "portable", AVX512])
@pytest.mark.parametrize("name", list(ATTENTION_PRODUCTS))
def test_small_operands_are_read_in_place_with_the_interpreters_bits(packed_from_one, monkeypatch, isa, name):
    """An operand of a few KiB whose rows (or, for the right one, columns) lie evenly in memory is
    not packed: the micro-kernel reads it where it lies, at strides it is compiled with."""
    use_isa(monkeypatch, isa)
    got, text = attention_product("c", name)
    expected, _ = attention_product("interp", name)
    assert_same_bits({"c": got}, {"c": expected}, name)
    if isa == "host":
        return
    if name == "scores":
        assert "read in place (32 apart across, 1 along k)" in text, text
        # The keys' columns lie 32 floats apart: a vector kernel packs them, the scalar one not.
        assert (".b_in_place = 0," in text) == (isa != "portable"), text
    elif name == "values.grad":
        assert "_a1x64_b1x32(" in text and "read in place (1 apart across, 64 along k)" in text, text
    else:
        assert ".a_in_place = 1," in text and ".b_in_place = 1," in text, text


@needs_c
@pytest.mark.parametrize("isa", ["host", AVX512])
def test_a_ten_class_layer_is_packed_reading_its_wide_operand_in_place(monkeypatch, isa):
    """An MLP's 10-class output layer (128 x 1024 x 10, 1.3M multiply-adds): its forward product
    reads the activations in place (10 columns are one strip: each row would be packed for one
    use) and pads the 10 columns to a tile; its weight gradient reads them in place down 10 rows
    of one tile. Both are packed GEMMs with the interpreter's bits."""
    rng = np.random.default_rng(5)

    def step(backend: str):
        session.reset()
        x = oc.tensor(rng_x, batch=1, label="x")
        w = oc.param("w", output=10, init=w_init)
        loss = ((w @ x).materialize() * oc.tensor(r, batch=1)).sum()
        update = train.grad_update(loss)
        ctx = oc.Context(backend)
        routine = ctx.compile(update, train.sgd_update(update, lr=0.01))
        routine.run()
        text = routine._executable.source.text if backend == "c" else ""
        return {"w": ctx.get(w.value), "w.grad": ctx.get(w.grad)}, text

    rng_x = rng.standard_normal((128, 1024)).astype(np.float32)
    w_init = rng.standard_normal((10, 1024)).astype(np.float32) / 32
    r = rng.standard_normal((128, 10)).astype(np.float32)
    use_isa(monkeypatch, isa)
    got, text = step("c")
    expected, _ = step("interp")
    assert_same_bits(got, expected, "10-class layer")
    if isa == "host":
        return
    assert text.count("as a packed GEMM") == 2, text
    assert "_a1024x1(" in text and "_b1x1024(" in text, "the activations read in place, rows and columns"


def test_plan_reads_in_place_only_small_operands_that_fill_whole_strips():
    """The 64 x 32 operands of a product are read in place; a 512 x 512 one (1 MiB) is packed, and
    so is one of 60 rows, which a strip of 16 would overrun."""
    small = plan_gemm(plan_contraction(matmul_nest(64, 32, 64, block=False)[0]), 64)
    assert small.a_packing.in_place == (32, 1) and small.b_packing.in_place == (1, 64)
    assert small.kernel.a_in_place == (32, 1)
    large = plan_gemm(plan_contraction(matmul_nest(512, 512, 512)[0]), 64)
    assert large.a_packing.in_place is None and large.b_packing.in_place is None
    ragged = plan_gemm(plan_contraction(matmul_nest(60, 32, 64, block=False)[0]), 64)
    assert ragged.mr == 12 and ragged.a_packing.in_place == (32, 1), "60 rows: 5 whole strips of 12"
    assert plan_gemm(plan_contraction(matmul_nest(50, 32, 64, block=False)[0]), 64).a_packing.in_place is None


@needs_c
def test_operands_contiguous_along_k_and_4_kib_apart_are_packed_by_blocks(packed_from_one):
    """``c[i, k] = sum_j a[i, j] * b[k, j]`` (``a @ b.T``: an MLP layer's forward product, and the
    gradient of its input) with rows 1024 floats apart: both operands are packed 16 terms of a
    row at a time (``Packing.k_block``), bit for bit the interpreter's, ragged strips included."""
    rng = np.random.default_rng(0)
    a_np, b_np = (rng.standard_normal(shape).astype(np.float32) for shape in ((13, 1024), (20, 1024)))

    def build():
        return oc.einsum("ij;kj=>ik", oc.tensor(a_np), oc.tensor(b_np))

    def values(backend: str) -> dict[str, np.ndarray]:
        session.reset()
        ctx = oc.Context(backend)
        c = build()
        ctx.compile(c).run()
        return {"c": ctx.get(c.value)}

    text = c_source(build)
    assert ".a_k_block = 1," in text and ".b_k_block = 1," in text, text
    assert ".a_along = 1024, .a_k = 1," in text and ".b_along = 1024, .b_k = 1," in text, "flat strides"
    assert_same_bits(values("c"), values("interp"), "a @ b.T")


# ---------------------------------------------------------------------------------------------
# The plan


def accumulate(node: TNode, cell: tuple, term) -> Store:
    """``node[cell] := node[cell] + term``."""
    return Store(node, cell, Binary(Binop.ADD, Load(node, cell), term))


def matmul_nest(m: int, k: int, n: int, dtype=dtypes.float32, block: bool = True):
    """The loop nest of ``c[i, j] := 0; c[i, j] += a[i, l] * b[l, j]``, in the summation order's
    blocks unless ``block`` is false."""
    a, b, c = TNode("a", (m, k), dtype), TNode("b", (k, n), dtype), TNode("c", (m, n), dtype)
    i, j, l = Symbol(), Symbol(), Symbol()
    cell = (Iter(i), Iter(j))
    term = Binary(Binop.MUL, Load(a, (Iter(i), Iter(l))), Load(b, (Iter(l), Iter(j))))
    nest = loop(i, m, loop(j, n, seq(Store(c, cell, Const(0 if dtype is dtypes.int32 else 0.0, dtype)),
                                     loop(l, k, accumulate(c, cell, term)))))
    if block:
        nest = block_sums(RoutineIR("matmul", nest)).body
    return nest, (a, b, c), (i, j, l)


def test_plan_of_a_matmul():
    nest, (a, b, _), (i, j, _) = matmul_nest(50, 200, 40)
    plan = plan_contraction(nest, 32)
    g = plan.gemm
    assert g is not None and g.depth == 200 and len(g.k) == 1 and g.block == 64
    assert (g.rows, g.cols, g.outer) == (((i, 50),), ((j, 40),), ()) and (g.a.tnode, g.b.tnode) == (a, b)
    assert g.a_first and (g.mr, g.nr, g.lanes) == (*cpu_schedule.GEMM_TILES[32], 8)
    assert g.kc % g.block == 0, "a block must never straddle two panels"
    assert g.c_strides == (40, 1)
    assert plan_contraction(nest).gemm is None, "without a vector width, the target has no packed GEMM"


def transposed_product_nest(m: int, k: int, n: int):
    """``c[i, j] := 0; c[i, j] += a[i, l] * b[j, l]`` (``a @ b.T``) in the summation order's blocks."""
    a, b, c = TNode("a", (m, k)), TNode("b", (n, k)), TNode("c", (m, n))
    i, j, l = Symbol(), Symbol(), Symbol()
    cell = (Iter(i), Iter(j))
    term = Binary(Binop.MUL, Load(a, (Iter(i), Iter(l))), Load(b, (Iter(j), Iter(l))))
    nest = loop(i, m, loop(j, n, seq(Store(c, cell, Const(0.0, dtypes.float32)), loop(l, k, accumulate(c, cell, term)))))
    return block_sums(RoutineIR("transposed", nest)).body


def test_plan_packs_by_blocks_the_operands_whose_rows_alias_in_the_cache():
    """Operands contiguous along ``k`` are read at the flat index of ``k`` (not the digits of its
    blocks), and packed by blocks of ``k`` when their rows are a multiple of 4 KiB apart."""
    aliasing = plan_contraction(transposed_product_nest(50, 1024, 40), 32).gemm
    assert aliasing.a_packing == aliasing.b_packing == cpu_schedule.Packing(True, True, cpu_schedule.PACK_K_BLOCK)
    assert len(aliasing.k) == 2, "k is two loops, blocks of 64 terms, read as one flat index"
    apart_784 = plan_contraction(transposed_product_nest(50, 784, 40), 32).gemm
    assert apart_784.a_packing == apart_784.b_packing == cpu_schedule.Packing(True, True, None)
    plain = plan_contraction(matmul_nest(50, 1024, 40)[0], 32).gemm
    assert plain.b_packing.k_block is None, "b is contiguous along its columns: k after k"


def test_a_factor_computed_from_one_load_is_packed_as_computed():
    """An intermediate gradient inlined into a product (``0.0 + g[i, l]``, the copy of a gradient
    passed on through an addition) leaves the product GEMM-class: the packing computes the factor
    as it reads the load. A factor reading two loads does not."""
    a, b, c = TNode("a", (50, 200)), TNode("b", (200, 40)), TNode("c", (50, 40))
    i, j, l = Symbol(), Symbol(), Symbol()
    cell = (Iter(i), Iter(j))

    def nest(factor):
        term = Binary(Binop.MUL, factor, Load(b, (Iter(l), Iter(j))))
        body = seq(Store(c, cell, Const(0.0, dtypes.float32)), loop(l, 200, accumulate(c, cell, term)))
        return block_sums(RoutineIR("copy", loop(i, 50, loop(j, 40, body)))).body

    copy = Binary(Binop.ADD, Const(0.0, dtypes.float32), Load(a, (Iter(i), Iter(l))))
    g = plan_contraction(nest(copy), 32).gemm
    assert g is not None and isinstance(g.a, Binary) and g.a.a == copy.a and g.a.b.tnode is a and g.a_packing.flat_k
    text = emit_c(RoutineIR("copy", nest(copy)), vector_bytes=32).text
    assert ".a = a, .a_outer = {0, 0, 0}, .a_along = 200, .a_k = 1, .a_plus = 0.0f," in text, "packed as a + 0.0"
    assert ".b_plus = (-0.0f)," in text, "packed as it is read"
    two_loads = Binary(Binop.ADD, Load(a, (Iter(i), Iter(l))), Load(a, (Iter(i), Iter(l))))
    assert plan_contraction(nest(two_loads), 32).gemm is None


def test_a_product_of_one_block_of_terms_takes_the_tile_that_pads_its_rows_least():
    """64 rows of 32 terms (an attention product): 4 tiles of 16 rows on AVX-512, not 5 of 12 and
    a padded one; with blocks of terms (300) tiles keep their running totals: 8 of 8 rows, and 12
    rows where those pad less (60 rows, or 36: 8-row tiles would pad 4)."""
    short = plan_gemm(plan_contraction(matmul_nest(64, 32, 64, block=False)[0]), 64)
    assert (short.mr, short.nr) == cpu_schedule.GEMM_TILES_ONE_BLOCK[64] == (16, 16)
    assert plan_gemm(plan_contraction(matmul_nest(60, 32, 64, block=False)[0]), 64).mr == 12, "60 = 5 x 12"
    assert plan_gemm(plan_contraction(matmul_nest(64, 300, 64)[0]), 64).mr == 8
    assert plan_gemm(plan_contraction(matmul_nest(60, 300, 64)[0]), 64).mr == 12
    assert plan_gemm(plan_contraction(matmul_nest(36, 300, 64)[0]), 64).mr == 12
    assert (8, 16) == cpu_schedule.GEMM_TILES_FEWER_ROWS[64]
    assert plan_gemm(plan_contraction(matmul_nest(64, 32, 64, block=False)[0]), 32).mr == 6


def test_running_totals_stay_in_registers_where_there_are_enough():
    """12 x 16 tiles of AVX-512 (12 block sums, 12 running totals, a row of B, a value of A in
    32 registers) keep their cells' totals in registers; AVX2's 16 registers do not."""
    plan = plan_contraction(matmul_nest(40, 300, 300)[0])
    assert plan_gemm(plan, 64).totals_in_registers and not plan_gemm(plan, 32).totals_in_registers
    assert not plan_gemm(plan_contraction(matmul_nest(40, 60, 300, block=False)[0]), 64).totals_in_registers
    text = emit_c(RoutineIR("totals", matmul_nest(40, 300, 300)[0]), vector_bytes=64).text
    assert "_t0_0 = _t0_0 + _c0_0;" in text and "c[0] = c[0] + _c0_0" not in text


def test_plan_of_a_projection_over_several_loops():
    """``y[b, s, h, d] += w[h, d, i] * x[b, s, i]`` (a multi-head projection): rows are ``(b, s)``,
    columns ``(h, d)``, each a flat index of two loops; the result is linear in both."""
    x, w, y = TNode("x", (4, 16, 32)), TNode("w", (2, 16, 32)), TNode("y", (4, 16, 2, 16))
    b, s, h, d, i = Symbol(), Symbol(), Symbol(), Symbol(), Symbol()
    cell = (Iter(b), Iter(s), Iter(h), Iter(d))
    term = Binary(Binop.MUL, Load(w, (Iter(h), Iter(d), Iter(i))), Load(x, (Iter(b), Iter(s), Iter(i))))
    nest = loop(b, 4, loop(s, 16, loop(h, 2, loop(d, 16, seq(
        Store(y, cell, Const(0.0, dtypes.float32)), loop(i, 32, accumulate(y, cell, term)))))))
    g = plan_contraction(nest, 32).gemm
    assert g is not None and (g.rows, g.cols, g.k) == (((b, 4), (s, 16)), ((h, 2), (d, 16)), ((i, 32),))
    assert not g.a_first and g.a.tnode is x and g.c_strides == (32, 1) and g.block is None


def test_golden_packed_gemm(update_golden, monkeypatch):
    """The printed packed GEMM of a ragged matmul (k = 200: three blocks of 64 and one of 8) for
    an AVX2 target, on threads, pinned for review."""
    monkeypatch.setattr(cpu_schedule, "GEMM_PARALLEL_MIN_WORK", 1)
    nest, _, _ = matmul_nest(50, 200, 40)
    check_golden("c/packed_gemm.c", emit_c(RoutineIR("packed_gemm", nest), vector_bytes=32).text, update_golden)


def test_plan_rejects_what_is_not_gemm_class():
    ints, _, _ = matmul_nest(50, 200, 40, dtype=dtypes.int32, block=False)
    assert plan_contraction(ints, 32).gemm is None, "integer products keep register tiles"
    deep, _, _ = matmul_nest(8, 5000, 8)
    assert plan_contraction(deep, 32).gemm is None, "blocks of blocks (k > 64 x 64) keep register tiles"
    # A matrix-vector product: no loop for columns.
    a, v, y = TNode("a", (300, 400)), TNode("v", (400,)), TNode("y", (300,))
    i, l = Symbol(), Symbol()
    step = accumulate(y, (Iter(i),), Binary(Binop.MUL, Load(a, (Iter(i), Iter(l))), Load(v, (Iter(l),))))
    plan = plan_contraction(loop(i, 300, loop(l, 400, step)), 32)
    assert plan is not None and plan.gemm is None


def test_plan_of_a_convolution_is_an_implicit_gemm():
    """``y[o, t] += x[ci, t + kk] * w[o, ci, kk]``: rows ``o``, columns ``t``, and the terms the
    flat index of the channel and tap loops."""
    x, w, y = TNode("x", (16, 130)), TNode("w", (40, 16, 3)), TNode("y", (40, 128))
    o, t, ci, kk = Symbol(), Symbol(), Symbol(), Symbol()
    cell = (Iter(o), Iter(t))
    term = Binary(Binop.MUL, Load(x, (Iter(ci), Affine(((1, t), (1, kk))))), Load(w, (Iter(o), Iter(ci), Iter(kk))))
    conv = loop(o, 40, loop(t, 128, seq(Store(y, cell, Const(0.0, dtypes.float32)),
                                        loop(ci, 16, loop(kk, 3, accumulate(y, cell, term))))))
    g = plan_contraction(conv, 32).gemm
    assert g is not None and (g.rows, g.cols, g.k) == (((o, 40),), ((t, 128),), ((ci, 16), (kk, 3)))
    assert not g.a_first and g.a.tnode is w and g.block is None
    assert g.shared is None, "x's offset 130*ci + t + kk is not linear in the flat index of (ci, kk): loops of its own"


def test_plan_runs_products_linear_in_their_loops_in_shared_loops():
    """A matmul, and a batch of products (``c[b, i, j] += x[b, i, l] * w[b, l, j]``), run in the
    loops their tile shape shares (``SharedLoops``): each operand's and the result's strides
    along the batch, its rows (or columns) and the terms; a factor ``0.0 + load`` is packed plus
    zero."""
    nest, (a_node, b_node, c_node), _ = matmul_nest(50, 200, 40)
    g = plan_contraction(nest, 32).gemm
    assert g.shared == SharedLoops(Strides(a_node, 0, (), 200, 1), Strides(b_node, 0, (), 1, 40),
                                   Strides(c_node, 0, (), 40, 1))
    x, w, c = TNode("x", (3, 50, 200)), TNode("w", (3, 200, 40)), TNode("c", (3, 50, 40))
    b, i, j, l = Symbol(), Symbol(), Symbol(), Symbol()
    cell = (Iter(b), Iter(i), Iter(j))
    read = Load(x, (Iter(b), Iter(i), Iter(l)))
    for factor, plus_zero in ((read, False), (Binary(Binop.ADD, Const(0.0, dtypes.float32), read), True)):
        term = Binary(Binop.MUL, factor, Load(w, (Iter(b), Iter(l), Iter(j))))
        batched = loop(b, 3, loop(i, 50, loop(j, 40, loop(l, 200, accumulate(c, cell, term)))))
        g = plan_contraction(block_sums(RoutineIR("batched", batched)).body, 32).gemm
        assert g.outer == ((b, 3),)
        assert g.shared == SharedLoops(Strides(x, 0, (10000,), 200, 1), Strides(w, 0, (8000,), 1, 40),
                                       Strides(c, 0, (2000,), 40, 1), plus_zero, False)
    # An operand stored as float16: its loads convert, which the shared loops, reading floats, would not.
    half, v, y = TNode("half", (50, 200), dtypes.float16), TNode("v", (200, 40)), TNode("y", (50, 40))
    term = Binary(Binop.MUL, Load(half, (Iter(i), Iter(l))), Load(v, (Iter(l), Iter(j))))
    cell = (Iter(i), Iter(j))
    reset = Store(y, cell, Const(0.0, dtypes.float32))
    nest = loop(i, 50, loop(j, 40, seq(reset, loop(l, 200, accumulate(y, cell, term)))))
    g = plan_contraction(block_sums(RoutineIR("half", nest)).body, 32).gemm
    assert g is not None and g.shared is None


def test_plan_gemm_sizes_its_tiles_by_the_vector_width():
    nest, _, _ = matmul_nest(36, 300, 300)  # rows every tile height divides but 8 (and 16)
    plan = plan_contraction(nest)
    for vector_bytes, lanes in ((64, 16), (32, 8), (16, 4), (0, 1)):
        g = plan_gemm(plan, vector_bytes)
        assert (g.mr, g.nr) == cpu_schedule.GEMM_TILES[vector_bytes] and g.lanes == lanes and g.nr % lanes == 0
        assert g.mc % g.mr == 0 and g.nc % g.nr == 0 and g.kc % g.block == 0
    one_row, _, _ = matmul_nest(1, 300, 300)
    assert plan_gemm(plan_contraction(one_row), 32) is None, "narrower than a tile: register tiles"


# ---------------------------------------------------------------------------------------------
# Resets: the accumulators start from the reset constant, the cells are written once


RESET_SHAPES = [(32, 32, 48), (32, 99, 48), (24, 300, 40)]
"""``(m, k, n)``: a sum in loop order (k <= 64), in blocks (64 + 35), in a loop of blocks and a
shorter last one (4 x 64 + 44)."""


def reset_store_lines(text: str, node: str = "c") -> list[str]:
    """The lines of ``text`` storing a constant into a cell of ``node``: a zeroing loop nest."""
    import re

    return [line for line in text.splitlines() if re.search(rf"\b{node}\[[^\]]*\] = -?[0-9.]+f?;", line)]


@pytest.mark.parametrize("vector_bytes", [None, 32, 0], ids=["register-tiles", "packed-avx2", "packed-scalar"])
@pytest.mark.parametrize("m,k,n", RESET_SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in RESET_SHAPES])
def test_reset_contraction_prints_no_zeroing_nest(packed_from_one, vector_bytes, m, k, n):
    """``c := 0; c += a * b`` prints no nest storing the zeros before the tiles: the tiles'
    accumulators (the micro-kernel's on its first panel) start from the reset instead."""
    nest, _, _ = matmul_nest(m, k, n)
    text = emit_c(RoutineIR("reset", nest), vector_bytes=vector_bytes).text
    assert ("as a packed GEMM" in text) == (vector_bytes is not None), text
    assert reset_store_lines(text) == [], "\n".join(reset_store_lines(text))
    if vector_bytes is not None:
        assert ".fresh = 1, .start = 0.0f," in text, "the first panel's micro-kernel call starts from the reset"


def signed_zero_results(backend: str, m: int, k: int, n: int) -> dict[str, np.ndarray]:
    """``a @ b`` and the gradients of ``sum((a @ b) * r)`` where some rows of ``a`` and some
    columns of ``r`` are ``-0.0``: their sums are ``-0.0`` term by term, and only the reset's
    ``+0.0`` start makes them ``+0.0``, as in the interpreter."""
    session.reset()
    rng = np.random.default_rng(1)
    a_np = rng.standard_normal((m, k)).astype(np.float32)
    a_np[::3] = -0.0
    b_np = rng.standard_normal((k, n)).astype(np.float32)
    r_np = rng.standard_normal((m, n)).astype(np.float32)
    r_np[:, ::4] = -0.0
    ctx = oc.Context(backend)
    a = oc.param("a", output=m, input=k, init=a_np)
    b = oc.param("b", output=k, input=n, init=b_np)
    c = (a @ b).materialize()
    update = train.grad_update((c * oc.tensor(r_np, input=1, label="r")).sum())
    ctx.compile(update).run()
    return {"c": ctx.get(c.value), "a.grad": ctx.get(a.grad), "b.grad": ctx.get(b.grad)}


@pytest.mark.parametrize("backend", [pytest.param("c", marks=needs_c),
                                     pytest.param("metal", marks=pytest.mark.skipif(not runs_here("metal"),
                                                                                    reason="no Metal runner"))])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "register-tiles"])
@pytest.mark.parametrize("m,k,n", RESET_SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in RESET_SHAPES])
def test_reset_start_keeps_the_interpreters_bits(monkeypatch, backend, packed, m, k, n):
    """Starting from the reset rounds as storing it and reading it back: ``+0.0 + (-0.0)`` is
    ``+0.0`` (bit for bit the interpreter's, signed zeros included), whether the product runs
    packed or in register tiles, on C and on Metal's loops."""
    if packed:
        for name, value in (("GEMM_MIN_WORK", 1), ("GEMM_MIN_TILES", (0, 0)), ("GEMM_MIN_REUSE", 0),
                        ("GEMM_PARALLEL_MIN_WORK", 1)):
            monkeypatch.setattr(cpu_schedule, name, value)
    else:
        monkeypatch.setattr(cpu_schedule, "GEMM_MIN_WORK", 1 << 60)
    got, expected = signed_zero_results(backend, m, k, n), signed_zero_results("interp", m, k, n)
    zero_rows = expected["c"][::3]
    assert (zero_rows == 0).all() and not np.signbit(zero_rows).any(), "the test must reach the signed-zero rule"
    assert_same_bits(got, expected, f"{backend} {'packed' if packed else 'tiles'} {m}x{k}x{n}")


# ---------------------------------------------------------------------------------------------
# Packing buffers: from the heap, so that a small thread stack does not overflow


@needs_c
def test_packed_gemm_runs_on_a_thread_with_a_small_stack():
    """A 256-cube product packs 400 KiB per thread (``(mc + nc) * kc`` floats): on a Python thread
    of 256 KiB of stack (musl's default is 128 KiB) it must compute, not overflow."""
    import threading

    m = k = n = 256
    rng = np.random.default_rng(2)
    a_np, b_np = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)

    def build(backend: str):
        session.reset()
        ctx = oc.Context(backend)
        c = oc.tensor(a_np, input=1) @ oc.tensor(b_np, input=1)
        return ctx, c, ctx.compile(c)

    expected_ctx, expected_c, expected_routine = build("interp")
    expected_routine.run()
    expected = expected_ctx.get(expected_c.value)
    ctx, c, routine = build("c")
    assert "as a packed GEMM" in routine._executable.source.text
    failures: list[BaseException] = []

    def run() -> None:
        try:
            routine.run()
        except BaseException as e:  # noqa: BLE001 - reported on the test's thread
            failures.append(e)

    previous = threading.stack_size(256 * 1024)
    try:
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
    finally:
        threading.stack_size(previous)
    assert not failures, failures
    assert_same_bits({"c": ctx.get(c.value)}, {"c": expected}, "256-cube product on a small stack")


_NO_MEMORY_SCRIPT = """
import ctypes, resource, sys
import numpy as np
import ocannl as oc
from ocannl.errors import KernelMemoryError
ctx = oc.Context("c")
c = oc.tensor(np.ones((256, 256), np.float32), input=1) @ oc.tensor(np.ones((256, 256), np.float32), input=1)
routine = ctx.compile(c)
routine.run()  # the Python side of a run allocates what it needs once
with open("/proc/self/statm") as f:
    size = int(f.read().split()[0]) * resource.getpagesize()
limit = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (size // 2, limit[1]))  # no new mapping, whatever gets unmapped
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
held = []
while True:  # and no free block of the heap left that could hold the packing buffers
    block = libc.malloc(1 << 16)
    if not block:
        break
    held.append(block)
try:
    routine.run()
except KernelMemoryError as e:
    print("KernelMemoryError:", e)
else:
    print("ran")
for block in held:
    libc.free(block)
resource.setrlimit(resource.RLIMIT_AS, limit)
routine.run()  # the routine works again once memory is available
print("then", float(ctx.get(c.value)[0, 0]))
"""


@needs_c
@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads the address space size from /proc")
def test_packing_buffers_that_cannot_be_allocated_raise_a_project_error():
    """With no address space left for the packing buffers the routine reports the failure (a
    failed check, site kind ``memory``) and the backend raises ``KernelMemoryError``, naming
    the product's sizes and the bytes, instead of crashing."""
    tests_dir = Path(__file__).resolve().parent
    # One thread (no thread stacks to map); the address space limited below what is mapped and
    # the heap's free blocks taken, so no allocation of 64 KiB or more can succeed.
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(tests_dir), str(tests_dir.parent), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", _NO_MEMORY_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    first, then = done.stdout.splitlines()
    assert first.startswith("KernelMemoryError: no memory for a thread's packing buffers"), done.stdout
    assert "bytes) of a 256x256 by 256x256 product" in first
    assert then == "then 256.0", done.stdout


# ---------------------------------------------------------------------------------------------
# Threads only where a region's work is worth waking them


def test_tile_regions_count_their_own_work():
    """A narrow product (10 columns: register tiles) summed in 4 blocks of 64 terms runs one
    parallel region per block: the region gets threads when its own quarter of the work
    reaches ``TILE_PARALLEL_MIN_WORK``, not when the whole product does."""
    per_block = cpu_schedule.TILE_PARALLEL_MIN_WORK // (10 * 64)  # rows whose block reaches it
    for rows, threaded in ((per_block // 2, False), (2 * per_block, True)):
        nest, _, _ = matmul_nest(rows, 256, 10)
        assert rows * 256 * 10 >= cpu_schedule.TILE_PARALLEL_MIN_WORK
        text = emit_c(RoutineIR("narrow", nest)).text
        assert "register tiles" in text
        assert ("#pragma omp parallel for" in text) == threaded, f"{rows} rows"


@needs_c
def test_small_training_step_runs_only_its_largest_products_on_threads():
    """The 64-256-256-10 MLP's SGD step (batch 64) of ``bench/cpu_steps.py``: its three 64 x 256
    x 256 products (2^22 multiply-adds) reach ``GEMM_PARALLEL_MIN_WORK``, and the update of its
    256 x 256 weight ``PARALLEL_MIN_WORK``; every other loop nest and product is below the
    thresholds and runs on the calling thread (two threads measured slower than one while its
    small nests had pragmas)."""
    def build():
        rng = np.random.default_rng(3)
        x = oc.tensor(rng.standard_normal((64, 64)).astype(np.float32), batch=1, label="inputs")
        y = oc.tensor(np.eye(10, dtype=np.float32)[rng.integers(0, 10, 64)], batch=1, label="onehot")
        update = train.grad_update(nn.cross_entropy(nn.mlp(hid_dims=(256, 256), label="mlp")(x), y, label="loss"))
        return [update, train.sgd_update(update, lr=0.1)]

    session.reset()
    text = oc.Context("c").compile(*build())._executable.source.text
    assert "as a packed GEMM" in text, "the step's products are packed"
    from ocannl.backends.c import compiler
    regions = 3 if compiler.toolchain().openmp else 0
    shapes = len(re.findall(r"void ocannl_gemm_loops_\d+x\d+\(", text))  # shared loops: a region, a worksharing loop
    threads = text.count("#pragma omp") - text.count("#pragma omp simd")  # simd: vector loops, no threads
    loops = text.count("#pragma omp parallel for")
    assert text.count(".parallel = 1,") == regions and threads == 2 * shapes + loops
    assert loops == (1 if regions else 0)
    if loops:
        nest = text.split("#pragma omp parallel for", 1)[1].split("}", 1)[0]
        assert "< 256;" in nest and "mlp_w2[" in nest and "0.1f * mlp_w2_grad[" in nest, "the 256 x 256 weight's update"


# ---------------------------------------------------------------------------------------------
# Selects: in wide register tiles max, min and relu, and a where on data everywhere, print as
# selects of bits, not branches


def pool_step_values(backend: str, channels: int) -> dict[str, np.ndarray]:
    """One SGD step through a padded 3x3 convolution, relu, a 2x2 max pool and a second
    convolution, on inputs with ties, zeros of both signs and NaNs: the pool's maximum, the
    search for each window's first maximum and the relu gates all go through selects."""
    session.reset()
    oc.seed(0)
    rng = np.random.default_rng(channels)
    data = rng.standard_normal((4, 6, 6, channels)).astype(np.float32)
    data[0, :2, :2, :] = 1.5  # a window of ties
    data[1, 0, 0, 0], data[1, 0, 1, 0] = -0.0, 0.0
    data[2, 2, 2, 0] = np.nan
    x = oc.tensor(data, batch=1, label="x")
    conv1, conv2 = nn.conv2d(channels, label="conv1"), nn.conv2d(5, label="conv2")
    pooled = nn.max_pool2d(oc.relu(conv1(x)))
    y = conv2(pooled)
    loss = (y * y).mean(label="loss")
    update = train.grad_update(loss)
    ctx = oc.Context(backend)
    routine = ctx.compile(update, train.sgd_update(update, lr=0.01))
    routine.run()
    return {"pooled": ctx.get(pooled.value), **{p.label: ctx.get(p.value) for p in (*conv1.params, *conv2.params)}}


@pytest.mark.parametrize("backend", ["c", "metal", "triton"])
@pytest.mark.parametrize("channels", [3, 5, 13])
def test_pool_and_relu_selects_equal_interpreter(backend, channels):
    if not runs_here(backend):
        pytest.skip(f"{backend} does not run here")
    session.reset()
    got, expected = pool_step_values(backend, channels), pool_step_values("interp", channels)
    for name, value in expected.items():
        # NaNs propagate into the parameters; compare where the interpreter has a number and
        # require the same NaN cells. C and Metal sum each cell in the interpreter's order (the
        # same bits); Triton regroups the convolutions' sums into trees (ulps apart).
        assert np.array_equal(np.isnan(got[name]), np.isnan(value)), name
        finite = ~np.isnan(value)
        if backend == "triton":
            np.testing.assert_allclose(got[name][finite], value[finite], rtol=1e-5, atol=1e-6, err_msg=name)
        else:
            assert np.array_equal(got[name][finite].view(np.uint32), value[finite].view(np.uint32)), name


def _pool_source(vector_bytes: int | None = 32) -> str:
    """The C source of a convolution and max pool's gradient at the CNN benchmark's sizes (the
    pool's forward maximum and first-maximum search as register tiles 8 columns wide)."""
    session.reset()
    x = oc.tensor(np.zeros((64, 8, 8, 1), np.float32), batch=1, label="x")
    update = train.grad_update(nn.max_pool2d(nn.conv2d(8, label="conv")(x)).sum(label="loss"))
    routine = oc.Context("interp").compile(update)
    return emit_c(routine.ir, vector_bytes=vector_bytes).text


def test_pool_search_prints_selects_not_conditional_loads():
    """The first-maximum search reads the window position as the loop indices (a virtual node)
    and chooses between it and the window size with a select: no ``?:`` around a load."""
    text = _pool_source()
    search = [line for line in text.splitlines() if "= ocannl_min_blend_f32(" in line]
    assert search, "no first-maximum search in the pool's gradient"
    for line in search:
        assert line.count("ocannl_select_f32(") == 1 and "?" not in line, line
        assert "window_position" not in line, line
    assert "= ocannl_max_blend_f32(" in text, "the forward maximum's tile selects without branches"
    assert "ocannl_max_blend_f32(float a, float b) { return ocannl_select_f32((a > b) | (b != b), a, b); }" in text
    assert "x = (x & mask) | (y & ~mask);" in text


def test_index_only_where_keeps_its_branch():
    """A where whose test reads only loop indices (a convolution's padding guard) stays a
    conditional expression: predictable, and the C compiler hoists it out of the inner loop."""
    session.reset()
    x = oc.tensor(np.zeros((2, 6, 6, 3), np.float32), batch=1, label="x")
    conv = nn.conv2d(4, label="conv")
    update = train.grad_update((conv(x) * conv(x)).sum(label="loss"))
    routine = oc.Context("interp").compile(update)
    text = emit_c(routine.ir, vector_bytes=32).text
    guarded = [line for line in text.splitlines() if " >= 0 && " in line and "x[" in line]
    assert guarded and not any("ocannl_select_f32(" in line for line in guarded)


@needs_c
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="reads x86-64 assembly")
def test_pool_selects_vectorize():
    """The max pool's forward tile and its first-maximum search compile to packed comparisons
    (the selects vectorize) with the backend's own compiler and flags."""
    from ocannl.backends.c.compiler import toolchain

    tc = toolchain()
    if not any(name in tc.version.lower() for name in ("gcc", "clang", "free software foundation")):
        pytest.skip(f"assembly of {tc.command} is not read here")
    text = _pool_source(tc.vector_bytes or None)
    result = subprocess.run([*tc.command, *tc.flags, "-S", "-o", "-", "-x", "c", "-"], input=text,
                            capture_output=True, text=True, check=True)
    functions: dict[str, list[str]] = {}
    current = None
    for line in result.stdout.splitlines():
        if line and not line[0].isspace() and line.endswith(":") and not line.startswith("."):
            current = line[:-1]
        elif current is not None:
            functions.setdefault(current, []).append(line.strip())
    packed = [name for name, body in functions.items()
              if any(line.split()[0].lstrip("v") == "cmpps" for line in body if line)]
    # The forward maximum and the first-maximum search: two kernels of packed comparisons.
    assert len(packed) >= 2, f"packed comparisons only in {packed} of {sorted(functions)}"


# ---------------------------------------------------------------------------------------------
# Elementwise nests run over consecutive cells innermost


def _spread_nest(read_back: bool = False):
    """``y[2*i + k, j] := x[i, j] * 2`` over loops ``i < 4, j < 8, k < 2`` (a max pool's gradient
    spreading a window's value: the window loop ``k`` innermost, over cells 8 apart)."""
    x, y = TNode("x", (4, 8), dtypes.float32), TNode("y", (8, 8), dtypes.float32)
    i, j, k = Symbol(), Symbol(), Symbol()
    cell = (Affine(((2, i), (1, k))), Iter(j))
    value = Binary(Binop.MUL, Load(x, (Iter(i), Iter(j))), Const(2.0, dtypes.float32))
    if read_back:
        value = Binary(Binop.ADD, value, Load(y, (Iter(j), Iter(i))))
    return loop(i, 4, loop(j, 8, loop(k, 2, Store(y, cell, value)))), (i, j, k)


def test_elementwise_nest_is_reordered_by_store_stride():
    nest, (i, j, k) = _spread_nest()
    reordered = cpu_schedule.in_store_order(nest)
    chain = []
    while isinstance(reordered, type(nest)):
        chain.append((reordered.symbol, reordered.extent))
        reordered = reordered.body
    assert chain == [(i, 4), (k, 2), (j, 8)], "the loop over consecutive cells goes innermost"
    assert reordered == nest.body.body.body, "the stored statement is unchanged"
    assert cpu_schedule.in_store_order(cpu_schedule.in_store_order(nest)) is None, "already in order"


def test_nests_not_reordered():
    """A read of the stored node at another cell, and a store that writes a cell twice (a sum
    of two loops of stride 1), keep their order."""
    nest, _ = _spread_nest(read_back=True)
    assert cpu_schedule.in_store_order(nest) is None
    y = TNode("y", (5,), dtypes.float32)
    a, b = Symbol(), Symbol()
    twice = loop(a, 4, loop(b, 2, Store(y, (Affine(((1, b), (1, a))),), Const(1.0, dtypes.float32))))
    assert cpu_schedule.in_store_order(twice) is None
