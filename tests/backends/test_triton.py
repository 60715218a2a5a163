"""The Triton backend (ocannl/backends/triton), run by Triton's CPU interpreter.

Everything here runs with ``TRITON_INTERPRET=1`` on CPU torch tensors (the
interpreter runs a grid's programs one after another, so shapes stay small), and every generated kernel the tests
interpret is also compiled for an H100 (sm_90) by Triton's compiler, which needs no GPU
(``gpu_check.py``): the interpreter accepts code the compiler would reject. Nor does the
interpreter catch out-of-bounds accesses, so the conformance runs carve buffers out of guard
zones of NaNs and check them after every run (``guard_zones``). The default run
takes a representative subset; ``pytest -m slow`` runs the whole conformance catalog and the
larger programs. On a machine with a GPU, ``python -m ocannl.testing --backend triton`` runs the
kit there.
"""

from __future__ import annotations

import importlib.util
import os
import re

import numpy as np
import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
    pytest.skip("the Triton backend needs triton and torch: pip install 'ocannl[triton]'", allow_module_level=True)
if os.environ["TRITON_INTERPRET"] != "1":
    pytest.skip("these tests run Triton's interpreter (TRITON_INTERPRET=1)", allow_module_level=True)

from golden import check_golden  # noqa: E402

import ocannl as oc  # noqa: E402
from ocannl import nn, session, testing, train  # noqa: E402
from ocannl.backends import registry  # noqa: E402
from ocannl.backends.context import Context  # noqa: E402
from ocannl.backends.triton import generate  # noqa: E402
from ocannl.backends.triton.gpu_check import compile_for_gpu  # noqa: E402
from ocannl.errors import BackendUnavailable, OutOfBoundsError  # noqa: E402
from ocannl.lowlevel.scalar_ops import Binop, Unop  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


# ---------------------------------------------------------------------------------------------
# Helpers


def data(*shape: int, seed: int = 0, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def routines_of(build) -> list:
    """The loop IR of every routine compiling ``build()`` makes (init routines included)."""
    session.reset()
    ctx = Context("interp")
    ctx.backend.tree_sums = True  # the IR the Triton backend gets: long sums stay unblocked
    irs = []
    compile_ir = ctx.backend.compile
    ctx.backend.compile = lambda ir: (irs.append(ir), compile_ir(ir))[1]
    ctx.compile(*build())
    return irs


def module_of(build):
    """The generated module of the (last) routine ``build()`` compiles to."""
    return generate(routines_of(build)[-1])


def kernels_of(text: str) -> list[str]:
    return re.findall(r"^def (\w+)\(", text, flags=re.M)[:-1]  # the last one is launch()


def check_on_gpu_compiler(builds) -> None:
    """Every kernel of every routine of ``builds`` compiles for sm_90."""
    sources = [generate(ir) for b in builds for ir in routines_of(b)]
    assert compile_for_gpu(sources)


def forward_and_backward(make):
    return testing._forward_and_backward(make)


GUARD = 4096
"""Cells of sentinel values before and after every buffer under :func:`guard_zones`."""


@pytest.fixture
def guard_zones(monkeypatch):
    """Buffers carved out of larger ones between guard zones of NaNs (integers: a sentinel),
    checked after every run: Triton's interpreter does not catch an out-of-bounds access, so a
    store past an edge shows as a changed guard, and a load past an edge reads NaN into the
    results the kit compares."""
    import torch

    from ocannl.backends.triton import runtime

    zones = []

    def sentinel(dtype: np.dtype):
        return {"f": np.nan, "i": -123456789, "u": 0x7FC1 if dtype.itemsize == 2 else 0xDEADBEEF}[dtype.kind]

    def zeros(self, shape, dtype):
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64))
        storage = np.full(n + 2 * GUARD, sentinel(dtype), dtype=dtype)
        storage[GUARD:GUARD + n] = 0
        tensor = torch.from_numpy(storage)
        zones.append((tensor, n, storage.copy()))
        return tensor[GUARD:GUARD + n].view(shape)

    def from_host(self, array):
        buffer = zeros(self, array.shape, array.dtype)
        buffer.copy_(torch.from_numpy(np.asarray(array, order="C")))  # a 0-d value stays 0-d
        return buffer

    run = runtime.TritonExecutable.run

    def checked_run(self, buffers, bindings):
        run(self, buffers, bindings)
        for tensor, n, initial in zones:
            now = tensor.numpy()
            for part in (slice(0, GUARD), slice(GUARD + n, None)):
                assert np.array_equal(now[part], initial[part], equal_nan=initial.dtype.kind == "f"), (
                    f"routine {self.name} wrote outside a buffer of {n} cells")

    monkeypatch.setattr(runtime.TorchBuffers, "zeros", zeros)
    monkeypatch.setattr(runtime.TorchBuffers, "from_host", from_host)
    monkeypatch.setattr(runtime.TritonExecutable, "run", checked_run)
    return zones


# ---------------------------------------------------------------------------------------------
# Larger programs than the catalog's: several tiles, ragged edges, tl.dot, looped stages.


def _p(name: str, shape, seed: int, n_input: int = 0, dtype=None, low=-1.0, high=1.0):
    out, inp = shape[:len(shape) - n_input], shape[len(shape) - n_input:]
    value = data(*shape, seed=seed, low=low, high=high)
    return oc.param(name, output=out, input=inp, init=value, dtype=dtype)


def _dense_relu():
    w, b = _p("w", (37, 45), 1, n_input=1), _p("b", (37,), 2)
    return oc.relu(w @ oc.tensor(data(50, 45, seed=3), batch=1, label="x") + b)


def _batched_scores():
    q = oc.tensor(data(2, 20, 3, 24, seed=1), batch=2, label="q")
    k = _p("k", (3, 24), 2) * oc.tensor(data(2, 18, 1, 1, seed=3), batch=2, label="s")
    return oc.einsum("b s | h d; b t | h d => b s | t -> h", q, k)


def _conv_padded():
    x = oc.tensor(data(2, 9, 9, 3, seed=1), batch=1, label="images")
    k = _p("kernel", (16, 3, 3, 3), 2, n_input=3)
    return oc.relu(oc.einsum("... | oh=+kh, ow=+kw, ic; kh, kw, ic -> oc => ... | oh, ow, oc", x, k))


def _softmax(n: int):
    def make():
        return nn.softmax(_p("x", (3, n), 1) * 2.0)
    return make


def _layer_norm():
    return nn.layer_norm()(_p("x", (6, 40), 1) * oc.tensor(data(6, 1, seed=2), label="scale"))


def _max_pool():
    return nn.max_pool2d(_p("x", (12, 10, 3), 1))


def _take_repeated():
    table = _p("table", (30, 20), 1)
    ids = oc.tensor(np.random.default_rng(2).integers(0, 30, (40, 3)).astype(np.int32), batch=1, label="ids")
    return oc.take(table, ids)


def _long_sum():
    return (_p("x", (3000,), 1) * _p("y", (3000,), 2)).sum()


def _matmul_16bit(dtype: str):
    def make():
        a = _p("a", (33, 40), 1, n_input=1, dtype=dtype)
        b = _p("b", (40, 24), 2, n_input=1, dtype=dtype)
        return a @ b
    return make


def _matmul_float64():
    return _p("a", (20, 30), 1, n_input=1, dtype="float64") @ _p("b", (30, 18), 2, n_input=1, dtype="float64")


def _mlp_step():
    x = oc.tensor(data(8, 40, 20, seed=1), batch=2, label="xs")
    batch_n = oc.IndexSymbol("batch_n", 8)
    m = nn.mlp(hid_dims=(32, 24), label="mlp")
    loss = (m(x[batch_n]) * oc.tensor(data(40, 1, seed=2), batch=1)).relu().mean()
    update = train.grad_update(loss)
    # SGD, not Adam: Adam's step m / sqrt(v) turns a gradient of 1e-9 (a different summation
    # order away from 0) into a full step, so it amplifies reordering beyond any tolerance.
    return [update, train.sgd_update(update, lr=0.1, momentum=0.9)]


def _mixed_gemm(dtype: str):
    def build():
        from bench.triton_gpu import gemm_computation

        return [gemm_computation(40, 36, 70, dtype)[0]]
    return build


LARGER = [
    pytest.param(testing.Program("dense 37x45 @ 50 + bias, relu", forward_and_backward(_dense_relu)), id="dense-relu"),
    pytest.param(testing.Program("batched attention scores", forward_and_backward(_batched_scores)), id="scores"),
    pytest.param(testing.Program("padded conv as implicit GEMM", forward_and_backward(_conv_padded)), id="conv"),
    pytest.param(testing.Program("softmax rows of 300", forward_and_backward(_softmax(300))), id="softmax-300"),
    pytest.param(testing.Program("softmax rows of 2000 (looped)", forward_and_backward(_softmax(2000))),
                 id="softmax-2000", marks=pytest.mark.slow),
    pytest.param(testing.Program("layer norm", forward_and_backward(_layer_norm)), id="layer-norm",
                 marks=pytest.mark.slow),
    pytest.param(testing.Program("max pool", forward_and_backward(_max_pool)), id="max-pool", marks=pytest.mark.slow),
    pytest.param(testing.Program("take, repeated rows", forward_and_backward(_take_repeated)), id="take"),
    pytest.param(testing.Program("sum of 3000 products", forward_and_backward(_long_sum)), id="long-sum",
                 marks=pytest.mark.slow),
    pytest.param(testing.Program("float16 matmul", forward_and_backward(_matmul_16bit("float16"))), id="fp16",
                 marks=pytest.mark.slow),
    # In the default run: Triton's interpreter converts to bfloat16 by truncation, so a bfloat16
    # accumulator must round through tlib.bfloat16_round to match the other backends.
    pytest.param(testing.Program("bfloat16 matmul", forward_and_backward(_matmul_16bit("bfloat16"))), id="bf16"),
    # Sums of 70 products of standard normal values: the rounding of a cell follows the terms'
    # size (about 8), not the result's; Triton's interpreter sums each tile with numpy's matmul.
    pytest.param(testing.Program("float16 operands, float32 accumulator: tl.dot on 16-bit tiles",
                                 _mixed_gemm("float16"), atol=2e-5), id="fp16-tiles"),
    pytest.param(testing.Program("bfloat16 operands, float32 accumulator", _mixed_gemm("bfloat16"), atol=2e-5),
                 id="bf16-tiles", marks=pytest.mark.slow),
    pytest.param(testing.Program("float64 matmul", forward_and_backward(_matmul_float64)), id="fp64",
                 marks=pytest.mark.slow),
    pytest.param(testing.Program("mlp step with sgd, sliced batches", _mlp_step,
                                 runs=({"batch_n": 0}, {"batch_n": 5}, {"batch_n": 7})), id="mlp-sgd"),
]


@pytest.mark.parametrize("program", LARGER)
def test_larger_programs_match_the_interpreter(program, guard_zones):
    report = testing.conformance("triton", programs=[program], random_programs=0)
    assert report.ok, report.summary()
    check_on_gpu_compiler([program.build])


# ---------------------------------------------------------------------------------------------
# The conformance kit


CATALOG_SUBSET = ("unary sigmoid", "binary div", "binary pow", "where", "einsum batched attention scores",
                  "padded conv 2-D", "batch slice by index symbol", "take (gather) and scatter-add",
                  "training step adam", "PRNG default parameter init (Glorot uniform)")


def test_conformance_subset(guard_zones):
    programs = [p for p in testing.catalog() if p.name in CATALOG_SUBSET]
    assert len(programs) == len(CATALOG_SUBSET)
    report = testing.conformance("triton", programs=programs, random_programs=3)
    assert report.ok, report.summary()


@pytest.mark.slow
def test_conformance_full_catalog(guard_zones):
    report = testing.conformance("triton", random_programs=20)
    assert report.ok and report.passed, report.summary()


@pytest.mark.slow
def test_every_catalog_kernel_compiles_for_the_gpu():
    check_on_gpu_compiler([p.build for p in testing.catalog()])


# ---------------------------------------------------------------------------------------------
# What the generated code looks like


def test_matmul_256_is_a_tiled_dot_over_many_programs():
    a_np, b_np = data(256, 256, seed=1), data(256, 256, seed=2)

    def build():
        return [oc.tensor(a_np, input=1, label="a") @ oc.tensor(b_np, input=1, label="b")]

    source = module_of(build)
    (kernel,) = source.kernels
    assert kernel.uses_dot and kernel.grid > 1
    assert 'tl.dot(' in source.text and 'input_precision="ieee"' in source.text
    session.reset()
    ctx = Context("triton")
    (c,) = build()
    ctx.compile(c).run()
    expected = (a_np.astype(np.float64) @ b_np.astype(np.float64))
    assert np.allclose(ctx.get(c.value), expected, rtol=1e-5, atol=1e-4)


def test_each_kernel_is_planned_before_it_is_written():
    """plan.py decides tiling, blocks and grid as data; the written kernel launches that grid."""
    from ocannl.backends.partition import partition
    from ocannl.backends.triton.plan import DotPlan, FlatPlan, plan_kernel

    def build():
        x = oc.tensor(data(96, 80, seed=1), batch=1, label="x")
        w = oc.tensor(data(300, 80, seed=2), input=1, label="w")
        return [oc.relu(w @ x)]

    ir = routines_of(build)[-1]
    kernels = partition(ir.body)
    plans = [plan_kernel(k) for k in kernels]
    (dot,) = [p for p in plans if isinstance(p, DotPlan)]
    assert (dot.m, dot.n, dot.k_total) == (96, 300, 80) or (dot.m, dot.n, dot.k_total) == (300, 96, 80)
    assert dot.grid == dot.row_tiles * dot.col_tiles and dot.k_ragged == (80 % dot.blocks.block_k != 0)
    assert all(isinstance(p, (DotPlan, FlatPlan)) or p.fills for p in plans)
    assert [k.grid for k in generate(ir).kernels] == [p.grid for p in plans]


def test_each_tiling_has_a_writer_holding_only_what_it_prints():
    """The base writers print what every kernel shares; ``RBLOCK`` stages and split reductions
    are the flat writer's alone, ``tl.dot`` the dot writer's, and emit.py picks a writer by the
    plan's kind."""
    from ocannl.backends.triton.dot import DotKernelWriter
    from ocannl.backends.triton.emit import WRITERS
    from ocannl.backends.triton.flat import FillKernelWriter, FlatKernelWriter
    from ocannl.backends.triton.plan import DotPlan, FillPlan, FlatPlan
    from ocannl.backends.triton.writer import KernelWriter

    assert WRITERS == {FillPlan: FillKernelWriter, FlatPlan: FlatKernelWriter, DotPlan: DotKernelWriter}
    flat_only, dot_only = ("stage_index", "reduction_stage", "splits"), ("dot_loop", "operand")
    assert not any(hasattr(KernelWriter, m) for m in flat_only + dot_only)
    assert not any(hasattr(DotKernelWriter, m) for m in flat_only)
    assert not any(hasattr(FlatKernelWriter, m) or hasattr(FillKernelWriter, m) for m in dot_only)


def test_a_flat_kernel_whose_inner_loops_run_in_order_is_planned_without_rblock():
    """A short sum (under ``SHORT_SUM`` terms) runs in the loop's order: the plan, decided before
    writing (stages.py's survey), has no ``RBLOCK`` tiles, and no writer plans again."""
    from ocannl.backends.partition import partition
    from ocannl.backends.triton.plan import FlatPlan, plan_kernel
    from ocannl.backends.triton.stages import Survey, survey
    from ocannl.backends.triton.writer import KernelWriter

    ir = routines_of(lambda: [oc.tensor(data(4, 3), batch=1, label="x").sum(axes="output")])[-1]
    (kernel,) = [k for k in partition(ir.body) if k.tiling == "flat"]
    assert survey(kernel, 3) == Survey(stages=False, splits=False)
    plan = plan_kernel(kernel)
    assert isinstance(plan, FlatPlan) and plan.rblock is None and plan.split == 1
    assert "RBLOCK" not in generate(ir).text
    assert not hasattr(KernelWriter, "simpler_plan")


def _flat_writer_use(kernel, plan) -> tuple[bool, bool]:
    """Whether the flat writer, given ``plan``, wrote an inner stage and split a reduction."""
    from ocannl.backends.triton.flat import FlatKernelWriter
    from ocannl.backends.triton.writer import Options

    class Watching(FlatKernelWriter):
        staged = False

        def stage_index(self, *args, **kwargs):
            self.staged = True
            return super().stage_index(*args, **kwargs)

    writer = Watching("k", kernel, plan, Options())
    writer.emit()
    return writer.staged, writer.split_last is not None


def test_the_survey_predicts_what_the_flat_writer_tiles():
    """For flat kernels with inner loops (reductions long and short, pointwise inner nests,
    a split reduction, softmax rows), the plan's ``RBLOCK`` and split are exactly what the
    writer then uses: planning is decided before printing and never revised by the writer."""
    from ocannl.backends.partition import partition
    from ocannl import ops
    from ocannl.backends.triton.plan import FlatPlan, plan_kernel

    builds = [
        lambda: [oc.tensor(data(4, 3), batch=1, label="x").sum(axes="output")],
        lambda: [oc.tensor(data(2, 4096), batch=1, label="x").sum(axes="output")],
        lambda: [nn.softmax(oc.tensor(data(8, 40), batch=1, label="x"))],
        lambda: [ops.max(oc.tensor(data(5, 3, 64), batch=1, label="x"), axes="output")],
        lambda: [oc.tensor(data(3, 20), batch=1, label="x").sum(axes="output")],
        _long_mean,
        _mean_then_longer_sum,
    ]
    seen = set()
    for build in builds:
        for ir in routines_of(build):
            for kernel in partition(ir.body):
                plan = plan_kernel(kernel)
                if isinstance(plan, FlatPlan):
                    staged, split = _flat_writer_use(kernel, plan)
                    assert (staged, split) == (plan.rblock is not None, plan.split > 1)
                    seen.add((staged, split))
    assert seen >= {(False, False), (True, False), (True, True)}


def test_kernels_over_2_31_cells_index_in_int64():
    """Generated code only: nothing of 2**31 cells is allocated. The flat kernel's index and
    every offset into the large buffers are int64; the kernels compile for the GPU."""
    from handbuilt import accum, matvec
    from ocannl.backends.triton.writer import WIDE
    from ocannl.lowlevel.indexing import Iter, Symbol
    from ocannl.lowlevel.lower import lower_routine
    from ocannl.lowlevel.optimize import materialized_nodes, optimize
    from ocannl.lowlevel.scalar_ops import Unop
    from ocannl.lowlevel.tnode import TNode

    rows, cols = 2**16, 2**15
    assert rows * cols == WIDE
    x, y = TNode("x", (rows, cols)), TNode("y", (rows, cols))
    v, c = TNode("v", (cols,)), TNode("c", (rows,))
    i, j = Symbol(), Symbol()
    relu = accum(y, None, Unop.RELU, (x,), [(i, rows), (j, cols)], (Iter(i), Iter(j)), ((Iter(i), Iter(j)),))
    sources = []
    for name, body in (("relu", relu), ("matvec", matvec(x, v, c))):
        unoptimized = lower_routine(name, body)
        sources.append(generate(optimize(unoptimized, materialized_nodes(unoptimized) | {x, v})))
    relu_text, matvec_text = (s.text for s in sources)
    assert "tl.program_id(0).to(tl.int64)" in relu_text
    assert re.search(r"tl\.load\(x \+ [^\n]*\.to\(tl\.int64\)", relu_text)
    assert re.search(r"tl\.load\(x \+ [^\n]*\.to\(tl\.int64\)", matvec_text)
    assert "tl.store(c + xindex, " in matvec_text  # c has 2**16 cells: its offsets stay int32
    assert compile_for_gpu(sources)


def _gemm_source(n: int, dtype: str):
    from bench.triton_gpu import gemm_computation
    from ocannl.lowlevel.lower import lower_routine
    from ocannl.lowlevel.optimize import materialized_nodes, optimize

    computation, (a, b, _) = gemm_computation(n, n, n, dtype)
    unoptimized = lower_routine(f"gemm_{dtype}", computation.body)
    return generate(optimize(unoptimized, materialized_nodes(unoptimized) | {a, b}))


def test_16_bit_dots_run_on_hopper_tensor_cores():
    """float16 and bfloat16 tiles compile to wgmma for sm_90 (64-row tiles; bfloat16 natively
    on a GPU, as an equal TF32 dot in the interpreter), without spills."""
    sources = [_gemm_source(256, dtype) for dtype in ("float16", "bfloat16")]
    assert "NATIVE_BF16_DOT" in sources[1].text
    binaries = compile_for_gpu(sources)
    assert len(binaries) == 2 and all(b.wgmma and not b.spills for b in binaries.values())


def _mlp_784_1024_1024_10():
    rng = np.random.default_rng(0)
    x = oc.tensor(rng.standard_normal((256, 784)).astype(np.float32), batch=1, label="x")
    y = oc.tensor(np.eye(10, dtype=np.float32)[rng.integers(0, 10, 256)], batch=1, label="y")
    probs = nn.softmax(nn.mlp(hid_dims=(1024, 1024), label="mlp")(x))
    loss = (-(y * oc.log(probs + 1e-9)).sum(axes="output")).mean(label="loss")
    update = train.grad_update(loss)
    return [update, train.sgd_update(update, lr=0.01)]


def test_the_large_gemms_of_an_mlp_step_fill_an_h100():
    """784-1024-1024-10 at batch 256: the two forward and three backward GEMMs over 1024-wide
    layers each launch at least one program per SM of an H100 (132)."""
    from ocannl.backends.partition import partition
    from ocannl.backends.triton.plan import DotPlan, plan_kernel
    from ocannl.backends.triton.tiling import SM_COUNT

    ir = routines_of(_mlp_784_1024_1024_10)[-1]
    plans = [plan_kernel(k) for k in partition(ir.body)]
    large = [n for n, p in enumerate(plans) if isinstance(p, DotPlan) and min(p.m, p.n) >= 256]
    assert len(large) == 5 and min(plans[n].grid for n in large) >= SM_COUNT
    # Grouped with other kernels or not, each runs the programs of its plan.
    assert [generate(ir).programs[n] for n in large] == [plans[n].grid for n in large]


def test_the_mlp_loss_is_stored_once():
    """The loss kernel of the MLP step starts its sum from the reset in a register and keeps the
    sum there for the scaling that follows: one store of ``loss``, not three."""
    text = module_of(_mlp_784_1024_1024_10).text
    assert len(re.findall(r"tl\.store\(loss\b", text)) == 1


@pytest.mark.slow
def test_training_steps_compile_for_sm_90_without_spills():
    """Every kernel of the MLP, moons and transformer-block steps (grouped launches included)
    compiles with a launch's alignment and spills nothing (compile_for_gpu fails on a spill)."""
    builds = [_mlp_784_1024_1024_10, _moons_step, _transformer_block_step]
    assert compile_for_gpu([generate(routines_of(build)[-1]) for build in builds])


def _moons_step():
    from examples import moons

    _, _, update, sgd, _, _ = moons.build()
    return [update, sgd]


def _transformer_block_step():
    """A transformer block (batch 8, sequence 16, d 32, 2 heads, MLP 64) trained with Adam, the
    compile-time benchmark's: its backward has the subtractions of softmax, layer norm and max
    (``c =- v``)."""
    from bench.cc_time import transformer

    return list(transformer()[0])


@pytest.mark.parametrize("build", [_moons_step, _mlp_784_1024_1024_10, _transformer_block_step],
                         ids=["moons", "mlp-784-1024-1024-10", "transformer-block"])
def test_training_steps_run_no_serial_reduction_of_16_or_more_terms(build):
    """Every reduction of 16 terms or more in these steps is a tree over tiles: the only loops a
    program runs one iteration at a time are shorter (and chunk loops, ``range(0, n, BLOCK)``)."""
    text = module_of(build).text
    serial = [(name, int(n)) for name, n in re.findall(r"for (\w+) in range\((\d+)\)", text)]
    assert [loop for loop in serial if loop[1] >= 16] == []
    if build is _transformer_block_step:  # the subtractions (softmax, layer norm) are trees too
        assert len(re.findall(r"(\w+) = \1 - tl\.sum\(", text)) >= 3  # into an accumulator, or a local


def test_transformer_block_gradients_with_tiled_subtractions_match_the_interpreter():
    """The gradients of the block (its softmax and layer norm backward subtract rows of 16 and
    32 terms as trees) agree with the interpreter's loop order within the float tolerance."""
    def build():
        return _transformer_block_step()[:1]  # Adam would amplify a reordered 1e-9 into a step

    assert testing.compare(build, ["triton"]) == []



# ---------------------------------------------------------------------------------------------
# Launches: kernels grouped (ocannl/backends/partition.py, "Which kernels share a launch")


@pytest.mark.parametrize(("build", "most"), [(_moons_step, 8), (_mlp_784_1024_1024_10, 10),
                                             (_transformer_block_step, 20)],
                         ids=["moons", "mlp-784-1024-1024-10", "transformer-block"])
def test_training_steps_launch_few_kernels_soundly(build, most):
    """A training step's kernels run in at most ``most`` launches (before grouping: 18, 20 and 63),
    and the grouping passes the static check: no two segments of a launch touch a node one of
    them writes, conflicting kernels keep their order, chains are of single-program kernels."""
    from ocannl.backends.partition import launch_hazards, partition

    ir = routines_of(build)[-1]
    source = generate(ir)
    assert len(source.kernels) == len(source.launches) <= most
    assert launch_hazards(partition(ir.body), list(source.programs), list(source.launches)) == []
    for kernel, launch in zip(source.kernels, source.launches):
        assert kernel.grid == sum(source.programs[segment[0]] for segment in launch.segments)


def test_single_program_kernels_run_as_one_chain_with_barriers():
    """The moons step's kernels each run one program: the step is one launch whose first program
    calls them in order (the others run kernels independent of them), a barrier before each that
    reads or overwrites what an earlier one since the last barrier touched."""
    source = module_of(_moons_step)
    (launch,) = source.launches
    chain = launch.segments[0]  # the longest program comes first
    assert len(chain) > 5 and all(source.programs[k] == 1 for k in chain)
    (kernel,) = source.kernels
    body = kernel.text.split(f"def {kernel.name}(")[1]
    first = body.split("elif")[0]
    steps = re.findall(r"^        (tl\.debug_barrier|\w+)\(", first, flags=re.M)
    calls = [step for step in steps if step != "tl.debug_barrier"]
    assert len(calls) == len(chain) and steps[0] != "tl.debug_barrier" and "tl.debug_barrier" in steps
    assert kernel.grid == len(launch.segments) and "if pid < 1:" in body


def _sgd_on_wide_layers():
    """An MLP over 64 features with a 64-wide hidden layer, one SGD step: its three updates are
    independent of each other."""
    x = oc.tensor(data(16, 64, seed=3), batch=1, label="x")
    target = oc.tensor(data(16, 64, seed=4), batch=1, label="target")
    diff = nn.mlp(hid_dims=(64,), label="wide")(x) - target
    update = train.grad_update((diff * diff).mean(label="loss"))
    return [update, train.sgd_update(update, lr=0.1)]


def test_independent_kernels_run_as_segments_of_one_launch():
    """Kernels that touch nothing another writes share launches (the output layer's weight
    gradient and update beside the gradient flowing back and the loss; the first layer's weight
    and bias gradients): each launch's programs are its segments' programs one after the other
    (``pid - start``); the step matches the interpreter."""
    source = module_of(_sgd_on_wide_layers)
    wide = [launch for launch in source.launches
            if sum(source.programs[s[0]] > 1 for s in launch.segments) >= 2]
    assert wide, [launch.segments for launch in source.launches]
    grouped = [k for k in source.kernels if k.tiling == "group"]
    assert grouped and all(re.search(r"elif pid < \d+:\n        \w+\(pid - \d+, ", k.text) for k in grouped)
    assert testing.compare(_sgd_on_wide_layers, ["triton"]) == []


@pytest.fixture
def programs_in_reverse(monkeypatch):
    """Triton's interpreter runs a launch's programs last to first: a program reading what a
    later-numbered program of the same launch writes would then read another value."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    forward = builder.set_grid_idx

    def backward(x, y, z):
        nx, ny, nz = builder.grid_dim
        forward(nx - 1 - x, ny - 1 - y, nz - 1 - z)

    monkeypatch.setattr(builder, "set_grid_idx", backward)


def _step_values(build) -> list[np.ndarray]:
    session.reset()
    oc.seed(0)
    ctx = Context("triton")
    tensors = build()
    ctx.compile(*tensors).run()
    return [ctx.get(p.value) for p in tensors[0].params] + [ctx.get(tensors[0].loss.value)]


@pytest.mark.parametrize("build", [_transformer_block_step, _sgd_on_wide_layers], ids=["transformer-block", "sgd"])
def test_grouped_launches_compute_the_same_in_any_program_order(build, request):
    """The steps' launches (segments of up to 48 programs, chains) give the same bits when their
    programs run in reverse order."""
    forward = _step_values(build)
    request.getfixturevalue("programs_in_reverse")
    backward = _step_values(build)
    assert len(forward) >= 4
    for f, b in zip(forward, backward):
        assert np.array_equal(f, b)


def _reduce_rows(op: Binop, dtype: str, terms: int, low: float, high: float, rows: int = 5):
    """``acc[i] <op>= xs[i, k]`` over ``rows`` rows of ``terms`` terms each, written as one
    accumulating assignment (the form the frontend gives a gradient's ``=-``)."""
    from ocannl.lowlevel.assignments import Accum, Block, Computation
    from ocannl.lowlevel.indexing import Iter, Projections, Symbol

    def build():
        rng = np.random.default_rng(1)
        if np.dtype(dtype).kind == "f":
            start = rng.uniform(-1.0, 1.0, rows).astype(dtype)
            xs = rng.uniform(low, high, (rows, terms)).astype(dtype)
        else:
            start = rng.integers(-2**30, 2**30, rows).astype(dtype)
            xs = rng.integers(low, high, (rows, terms)).astype(dtype)
        acc, x = oc.tensor(start, label="cells"), oc.tensor(xs, label="xs")
        i, k = Symbol(), Symbol()
        projections = Projections(product_space=(rows, terms), product_iterators=(i, k), lhs_dims=acc.value.dims,
                                  rhs_dims=(x.value.dims,), project_lhs=(Iter(i),),
                                  project_rhs=((Iter(i), Iter(k)),))
        write = Accum(acc.value, op, Unop.ID, (x.value,), lambda: projections, spec=".")
        return [Computation("reduce", Block((write,)), (acc.initializer(), x.initializer()))]
    return build


@pytest.mark.parametrize(("op", "dtype", "terms", "low", "high", "tree"), [
    pytest.param(Binop.SUB, "float32", 40, -1.0, 1.0, "acc = acc - tl.sum(", id="sub-float32"),
    pytest.param(Binop.SUB, "float32", 3000, -1.0, 1.0, "y0 = -tl.sum(", id="sub-float32-chunks-kahan"),
    pytest.param(Binop.SUB, "int32", 40, -2**30, 2**30, "acc = acc - tl.sum(", id="sub-int32-wraps"),
    pytest.param(Binop.MUL, "float32", 40, 0.9, 1.1, "acc = acc * product(", id="mul-float32"),
    pytest.param(Binop.MUL, "int32", 40, -2**30, 2**30, "acc = acc * product(", id="mul-int32-wraps"),
    pytest.param(Binop.DIV, "float32", 40, 0.9, 1.1, "acc = tl.div_rn(acc, product(", id="div-float32"),
    pytest.param(Binop.DIV, "float32", 3000, 0.999, 1.001, "acc = tl.div_rn(acc, product(", id="div-float32-chunks",
                 marks=pytest.mark.slow),
    pytest.param(Binop.DIV, "int32", 20, 1, 4, None, id="div-int32-in-loop-order"),
])
def test_accumulations_are_trees_where_they_regroup(op, dtype, terms, low, high, tree, guard_zones):
    """``c =- v`` is ``c`` minus the sum of the terms, ``c =* v`` times their product, a float
    ``c =/ v`` divided by their product: each a tree over the row's tile (integers bit for bit,
    the loop wrapping as the tree does); an integer division truncates at every step and keeps
    the loop."""
    build = _reduce_rows(op, dtype, terms, low, high)
    text = module_of(build).text
    serial = re.findall(r"for \w+ in range\((\d+)\)", text)
    if tree is None:
        assert serial == [str(terms)]
    else:
        assert tree in text and serial == []
    report = testing.conformance("triton", programs=[testing.Program(f"{op.value} {dtype}", build)],
                                 random_programs=0)
    assert report.ok and report.passed, report.summary()
    check_on_gpu_compiler([build])


# ---------------------------------------------------------------------------------------------
# Long reductions with few rows, split over the SMs (tiling.py, "Split reductions")


def _long_mean():
    x = oc.tensor(data(65536, seed=5), label="x")
    return [x.mean(label="mean")]


_PRODUCT_ATOL = 2e-3
"""A float32 product of 65,536 terms near 1 taken as a tree (tiles, slices: the unsplit kernel's
too) departs from the loop's order by about 5e-4 relative: the partial products sit near 1,
where rounding up and down steps differ by a factor of two, so their roundings do not cancel."""


@pytest.mark.parametrize(("build", "exact", "atol"), [
    pytest.param(_long_mean, False, 0.0, id="mean-65536-float32"),
    pytest.param(_reduce_rows(Binop.MAX, "float32", 65536, -1.0, 1.0, rows=2), True, 0.0, id="max-float32",
                 marks=pytest.mark.slow),
    pytest.param(_reduce_rows(Binop.ADD, "int32", 65536, -2**30, 2**30, rows=2), True, 0.0, id="sum-int32-wraps",
                 marks=pytest.mark.slow),
    pytest.param(_reduce_rows(Binop.ADD, "float32", 65536, -1.0, 1.0, rows=2), False, 0.0, id="sum-float32",
                 marks=pytest.mark.slow),
    pytest.param(_reduce_rows(Binop.MIN, "float32", 65536, -1.0, 1.0, rows=2), True, 0.0, id="min-float32",
                 marks=pytest.mark.slow),
    pytest.param(_reduce_rows(Binop.MIN, "int32", 65536, -2**30, 2**30, rows=2), True, 0.0, id="min-int32",
                 marks=pytest.mark.slow),
    pytest.param(_reduce_rows(Binop.SUB, "float32", 65536, -1.0, 1.0, rows=2), False, 0.0, id="sub-float32",
                 marks=pytest.mark.slow),
    pytest.param(_reduce_rows(Binop.MUL, "int32", 65536, -2**30, 2**30, rows=2), True, 0.0, id="mul-int32-wraps",
                 marks=pytest.mark.slow),
    pytest.param(_reduce_rows(Binop.MUL, "float32", 65536, 0.99999, 1.00001, rows=2), False, _PRODUCT_ATOL,
                 id="mul-float32", marks=pytest.mark.slow),
    pytest.param(_reduce_rows(Binop.DIV, "float32", 65536, 0.99999, 1.00001, rows=2), False, _PRODUCT_ATOL,
                 id="div-float32", marks=pytest.mark.slow),
])
def test_long_reductions_with_few_rows_split_over_the_sms(build, exact, atol, guard_zones, request):
    """A 65,536-term reduction of one or two rows runs in at least one program per SM: each
    program combines a slice, the last to finish combines the slices in order. It agrees with
    the interpreter (max, min and integers exactly), gives the same bits at every run (twice in
    one routine: the counters are back at zero) and when the programs run in reverse order, and
    compiles for sm_90 without spills."""
    from ocannl.backends.triton.tiling import SM_COUNT

    (kernel,) = module_of(build).kernels
    assert kernel.grid >= SM_COUNT and "slices_done" in kernel.text
    program = testing.Program("long reduction", build, runs=({}, {}), exact=exact, atol=atol)
    expected = testing.run_program(program, "interp")
    first, second = testing.run_program(program, "triton"), testing.run_program(program, "triton")
    assert testing.first_mismatch(program.name, expected, first, exact=exact, atol=atol) is None
    request.getfixturevalue("programs_in_reverse")
    backward = testing.run_program(program, "triton")
    for name, value in first.items():
        assert value.tobytes() == second[name].tobytes() == backward[name].tobytes(), name
    check_on_gpu_compiler([build])


def _split_mean_beside_relu():
    x = oc.tensor(data(65536, seed=5), label="x")
    y = oc.tensor(data(2, 65536, seed=6), label="y")
    return [x.mean(label="mean"), oc.relu(y, label="r")]


def test_a_split_reduction_shares_a_launch_soundly(request):
    """A split mean and an independent ReLU run as two segments of one launch: the grouping
    passes the static check, and the results agree with the interpreter and have the same bits
    when the launch's programs run in reverse order."""
    from ocannl.backends.partition import launch_hazards, partition
    from ocannl.backends.triton.tiling import SM_COUNT

    ir = routines_of(_split_mean_beside_relu)[-1]
    source = generate(ir)
    (launch,) = source.launches
    assert len(launch.segments) == 2 and max(source.programs) >= SM_COUNT
    assert launch_hazards(partition(ir.body), list(source.programs), list(source.launches)) == []
    program = testing.Program("split mean beside relu", _split_mean_beside_relu)
    forward = testing.run_program(program, "triton")
    assert testing.first_mismatch(program.name, testing.run_program(program, "interp"), forward) is None
    request.getfixturevalue("programs_in_reverse")
    backward = testing.run_program(program, "triton")
    assert all(value.tobytes() == backward[name].tobytes() for name, value in forward.items())


def _mean_then_longer_sum():
    x = oc.tensor(data(65536, seed=5), label="x")
    y = oc.tensor(data(2, 65536, seed=6), label="y")
    return [x.mean(label="mean"), (y * 2.0).sum(label="total")]


def test_a_reduction_after_a_store_of_its_kernel_is_not_split():
    """The two reductions share a single-program kernel; the longer one, which the plan would
    split, follows the mean's store (which every program would then run): the kernel is planned
    unsplit (stages.py's survey), and agrees with the interpreter."""
    source = module_of(_mean_then_longer_sum)
    assert [k.grid for k in source.kernels] == [1] and "slices_done" not in source.text
    assert testing.compare(_mean_then_longer_sum, ["triton"]) == []


def test_reductions_split_only_when_long_and_few_programs():
    """A reduction splits from 8192 terms on, into slices of at least 256 terms, until its
    programs fill the SMs; a kernel with enough programs already does not split."""
    from ocannl.backends.triton.tiling import SM_COUNT, SPLIT_REDUCTION, split_reduction

    assert split_reduction(1, SPLIT_REDUCTION - 1) == 1
    assert split_reduction(1, SPLIT_REDUCTION) == SPLIT_REDUCTION // 256
    assert split_reduction(1, 65536) == 256 and split_reduction(2, 65536) == 128
    assert split_reduction(SM_COUNT, 65536) == 1


def test_matmul_bias_relu_is_one_kernel():
    def build():
        x = oc.tensor(data(64, 48, seed=1), batch=1, label="x")
        w = oc.param("w", output=32, input=48, init=data(32, 48, seed=2))
        b = oc.param("b", output=32, init=data(32, seed=3))
        return [oc.relu(w @ x + b)]

    source = module_of(build)
    assert len(source.kernels) == 1 and source.kernels[0].uses_dot
    assert testing.compare(build, ["triton"]) == []


def test_matmul_bias_relu_is_one_kernel_with_intermediates_kept():
    """With every intermediate materialized, the bias add and relu become the dot's epilogue."""

    def build():
        x = oc.tensor(data(64, 48, seed=1), batch=1, label="x")
        w = oc.param("w", output=32, input=48, init=data(32, 48, seed=2))
        b = oc.param("b", output=32, init=data(32, seed=3))
        product = (w @ x).materialize()
        biased = (product + b).materialize()
        return [oc.relu(biased)]

    source = module_of(build)
    assert len(source.kernels) == 1 and source.kernels[0].uses_dot
    text = source.text
    assert text.index("tl.dot(") < text.index("tl.store(compose") < text.index("tl.store(relu")
    assert "tl.load(compose" not in text  # the epilogue reads the accumulator, not memory
    assert testing.compare(build, ["triton"]) == []


@pytest.mark.parametrize("row", [100, 1500])
def test_row_softmax_is_one_kernel(row):
    def build():
        return [nn.softmax(oc.tensor(data(5, row, seed=1) * 4, batch=1, label="x"))]

    source = module_of(build)
    assert len(source.kernels) == 1, source.text
    assert testing.compare(build, ["triton"]) == []


def test_static_index_symbols_are_read_from_the_symbol_table_and_compile_once():
    xs = data(6, 4, 3, seed=1)
    batch_n = oc.IndexSymbol("batch_n", 6)
    y = oc.tensor(xs, batch=2, label="xs")[batch_n] * 2.0
    ctx = Context("triton")
    routine = ctx.compile(y)
    for n in (0, 5, 2):
        routine.run(batch_n=n)
        assert np.array_equal(ctx.get(y.value), xs[n] * np.float32(2.0))
    assert ctx.stats.compilations == 1
    text = generate(routine.ir).text
    # Not a scalar argument: the kernel loads it from the routine's int64 table, narrowed as it has a size.
    assert "batch_n = tl.load(symbol_table + 0).to(tl.int32)" in text and "do_not_specialize" not in text


def test_buffers_are_torch_tensors_and_values_come_back_as_numpy():
    import torch

    x = oc.tensor(data(3, 4), label="x")
    y = x * 3.0
    ctx = Context("triton")
    ctx.compile(y).run()
    assert isinstance(ctx._buffers[y.value], torch.Tensor) and ctx._buffers[y.value].device.type == "cpu"
    got = ctx.get(y.value)
    assert isinstance(got, np.ndarray) and np.array_equal(got, data(3, 4) * np.float32(3.0))
    ctx.set(x.value, np.ones((3, 4)))
    ctx.compile(y).run()
    assert np.array_equal(ctx.get(y.value), np.full((3, 4), 3.0, np.float32))


def test_take_out_of_range_raises():
    table = oc.tensor(data(5, 3), label="table")
    ids = oc.tensor(np.array([[1, 7]], dtype=np.int32), batch=1, label="ids")
    y = oc.take(table, ids)
    ctx = Context("triton")
    routine = ctx.compile(y)
    with pytest.raises(OutOfBoundsError, match="outside its axis"):
        routine.run()  # a routine that can fail reads its error flag at once


def test_debug_dir_gets_the_generated_module(tmp_path):
    y = oc.tensor(data(3), label="x") + 1.0
    ctx = Context("triton", debug_dir=tmp_path)
    routine = ctx.compile(y)
    text = (tmp_path / f"{routine.name}.triton.py").read_text()
    assert "@triton.jit" in text and "def launch(buffers, symbols, error):" in text


def test_fp32_dot_precision_and_fast_math_settings(monkeypatch):
    def build():
        return [oc.tensor(data(32, 32), input=1) @ oc.tensor(data(32, 32, seed=1), input=1)]

    monkeypatch.setenv("OCANNL_TRITON_FP32_DOT", "tf32")
    monkeypatch.setenv("OCANNL_FAST_MATH", "1")
    text = module_of(build).text
    assert 'input_precision="tf32"' in text and "FP_FUSION = True" in text
    monkeypatch.setenv("OCANNL_TRITON_FP32_DOT", "fp16")
    with pytest.raises(oc.errors.OcannlError, match="triton_fp32_dot"):
        module_of(build)


# ---------------------------------------------------------------------------------------------
# Selection and availability


def test_auto_never_picks_the_interpreter():
    assert registry.get_backend("triton").emulated
    assert registry.best_available() != "triton"
    assert oc.Context.auto().backend_name != "triton"


def test_without_triton_the_error_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    with pytest.raises(BackendUnavailable, match=re.escape("pip install 'ocannl[triton]'")):
        Context("triton")


def test_without_gpu_or_interpreter_it_says_how_to_test(monkeypatch):
    from ocannl.backends.triton import runtime

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(runtime, "_gpu_device_files", lambda: False)
    ok, reason = runtime.availability()
    assert not ok and "TRITON_INTERPRET=1" in reason


# ---------------------------------------------------------------------------------------------
# Training end to end, and golden sources


def test_moons_trains_to_the_interpreters_loss():
    from examples.moons import train_moons

    losses = {}
    for backend in ("interp", "triton"):
        session.reset()
        result = train_moons(Context(backend), epochs=1, n_points=100)
        losses[backend] = result["step_losses"]
    assert len(losses["triton"]) == 10
    assert np.allclose(losses["triton"], losses["interp"], rtol=1e-4, atol=1e-6), losses


def test_guard_zones_catch_a_store_past_the_end(guard_zones):
    """The sanitizer itself: a kernel writing one cell past its buffer is reported."""
    from ocannl.backends.triton import runtime

    y = oc.tensor(data(5), label="x") * 2.0
    ctx = Context("triton")
    routine = ctx.compile(y)
    source = routine._executable.source
    source.text = source.text.replace("mask=xmask)", "mask=xindex < 6)")
    routine._executable.module = runtime.load_module(source)
    with pytest.raises(AssertionError, match="wrote outside a buffer of 5 cells"):
        routine.run()


@pytest.mark.slow
def test_gpu_benchmark_script_runs_at_toy_sizes(capsys):
    from bench.triton_gpu import main

    assert main(["--smoke"]) == 0
    out = capsys.readouterr().out
    assert "GEMM" in out and "float16" in out and "training step" in out


def _golden_matmul():
    w = oc.param("w", output=48, input=64, init=np.zeros((48, 64), np.float32))
    return w @ oc.tensor(np.zeros((40, 64), np.float32), batch=1, label="x")


def _golden_broadcast_add():
    x = oc.tensor(np.zeros((30, 20), np.float32), batch=1, label="x")
    b = oc.tensor(np.zeros((1, 20), np.float32), batch=1, label="b")
    return x + b + oc.tensor(np.zeros((1,), np.float32), label="c")


def _golden_einsum_reduction():
    x = oc.tensor(np.zeros((6, 50, 3), np.float32), batch=1, input=1, label="x")
    return oc.einsum("b|i->o => b|i", x, label="reduced")


def _golden_conv2d():
    x = oc.tensor(np.zeros((2, 8, 8, 3), np.float32), batch=1, label="images")
    kernel = oc.param("kernel", output=16, input=(3, 3, 3), init=np.zeros((16, 3, 3, 3), np.float32))
    return oc.einsum("... | 2*oh=+kh, 2*ow=+kw, ..ic..; kh, kw, ..ic.. -> ..oc.. => ... | oh, ow, ..oc..",
                     x, kernel, label="conv")


GOLDEN = {"matmul": _golden_matmul, "broadcast_add": _golden_broadcast_add,
          "einsum_reduction": _golden_einsum_reduction, "conv2d": _golden_conv2d}
"""The canonical programs of golden/forward, at sizes that show the tiled paths: the matmul and
the convolution (an implicit GEMM over 3x3x3 windows) are tl.dot kernels, the reduction a tiled
tl.sum."""


@pytest.mark.parametrize("name", ["matmul", "broadcast_add", "einsum_reduction", "conv2d"])
def test_golden_triton_sources(name, update_golden):
    make = GOLDEN[name]
    source = module_of(lambda: [make()])
    check_golden(f"triton/{name}.triton.py", source.text, update_golden)
    assert compile_for_gpu([source])


def _golden_sgd_step():
    """A linear layer over 1024 inputs, one SGD step: a single-program chain (the loss and its
    gradient), independent gradient kernels and updates as segments of one launch."""
    x = oc.tensor(np.zeros((8, 1024), np.float32), batch=1, label="x")
    w = oc.param("w", output=4, input=1024, init=np.zeros((4, 1024), np.float32))
    b = oc.param("b", output=4, init=np.zeros((4,), np.float32))
    diff = w @ x + b - oc.tensor(np.zeros((8, 4), np.float32), batch=1, label="target")
    update = train.grad_update((diff * diff).mean(label="loss"))
    return [update, train.sgd_update(update, lr=0.1)]


def test_golden_grouped_launches(update_golden):
    source = module_of(_golden_sgd_step)
    assert any(k.tiling == "group" for k in source.kernels)
    check_golden("triton/sgd_step.triton.py", source.text, update_golden)
    assert compile_for_gpu([source])


@pytest.mark.parametrize("rows", [(1,), (2,), (1, 2)])
def test_take_from_a_table_of_one_or_two_rows(rows):
    """A gather whose load needs no mask (one program, a clamped position) passes no ``other``."""
    table = oc.param("table", output=rows, init=np.arange(np.prod(rows), dtype=np.float32).reshape(rows) + 1)
    taken = oc.take(table, oc.tensor(np.array([0])))
    ctx = oc.Context("triton")
    ctx.compile(taken).run()
    want = oc.Context("interp")
    want.compile(taken).run()
    np.testing.assert_array_equal(ctx.get(taken), want.get(taken))
