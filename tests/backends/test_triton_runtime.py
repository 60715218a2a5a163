"""The Triton backend's launch path, autotuner and split-K (ocannl/backends/triton: runtime.py,
autotune.py, tiling.py, writer.py), under Triton's CPU interpreter.

What needs a GPU is not run here: the direct calls of compiled launchers, CUDA graph capture and
the autotuner's measurements. What they rest on is: the symbol table the kernels read, the
kernel calls built once per set of buffers, the error flag and when it is read, the refusal of CUDA
graphs without a GPU, the autotuner's key, disk cache, fallback and search (with a fake timer),
and split-K's plan, code (interpreted, and compiled for sm_90) and values.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os

import numpy as np
import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
    pytest.skip("the Triton backend needs triton and torch: pip install 'ocannl[triton]'", allow_module_level=True)
if os.environ["TRITON_INTERPRET"] != "1":
    pytest.skip("these tests run Triton's interpreter (TRITON_INTERPRET=1)", allow_module_level=True)

import ocannl as oc  # noqa: E402
from ocannl import session, testing, train  # noqa: E402
from ocannl.backends import cache  # noqa: E402
from ocannl.backends.context import Context  # noqa: E402
from ocannl.backends.partition import Kernel, partition  # noqa: E402
from ocannl.backends.triton import autotune, generate, tiling  # noqa: E402
from ocannl.backends.triton.autotune import DotKey  # noqa: E402
from ocannl.backends.triton.gpu_check import compile_for_gpu  # noqa: E402
from ocannl.backends.triton.plan import DotPlan, plan_kernel  # noqa: E402
from ocannl.backends.triton.runtime import SYMBOL_ROW, KernelCall, symbol_rows  # noqa: E402
from ocannl.backends.triton.tiling import DotBlocks  # noqa: E402
from ocannl.backends.triton.writer import KernelSource, Param  # noqa: E402
from ocannl.errors import BackendUnavailable, OutOfBoundsError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def data(*shape: int, seed: int = 0, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def routine_ir(build):
    """The loop IR the Triton backend gets for the (last) routine of ``build()``."""
    session.reset()
    ctx = Context("interp")
    ctx.backend.tree_sums = True
    irs = []
    compile_ir = ctx.backend.compile
    ctx.backend.compile = lambda ir: (irs.append(ir), compile_ir(ir))[1]
    ctx.compile(*build())
    return irs[-1]


# ---------------------------------------------------------------------------------------------
# The symbol table


def _row_picker():
    rows = data(6, 4, 3, seed=1)
    b = oc.IndexSymbol("b", 6)  # a size: narrowed to int32 in the kernel
    c = oc.IndexSymbol("c")  # none: int64, and the access is checked
    xs = oc.tensor(rows, batch=2, label="xs")
    return rows, xs, (xs[b] * 2.0 + xs[c]).materialize()


def test_index_symbols_are_loaded_from_the_symbol_table_not_passed_as_scalars():
    rows, xs, y = _row_picker()
    ctx = Context("triton")
    routine = ctx.compile(y)
    source = routine._executable.source
    assert source.symbols == routine.ir.static_symbols
    (kernel,) = source.kernels
    assert [p.signature for p in kernel.params if p.node is None] == ["*i64", "*i32"]  # the table, the flag
    slot = {s.name: i for i, s in enumerate(source.symbols)}
    assert f"b = tl.load(symbol_table + {slot['b']}).to(tl.int32)" in source.text
    assert f"c = tl.load(symbol_table + {slot['c']})\n" in source.text
    for vb, vc in ((0, 5), (5, 0), (3, 3), (3, 3)):
        routine.run(b=vb, c=vc)
        np.testing.assert_array_equal(ctx.get(y), rows[vb] * np.float32(2.0) + rows[vc])
    assert ctx.stats.compilations == 1


def test_symbol_table_rows_keep_the_16_byte_alignment_kernels_are_specialized_on():
    for k in range(0, 6):
        rows = symbol_rows(np.arange(3 * k, dtype=np.int64).reshape(3, k))
        assert rows.shape[1] >= 1 and (rows.shape[1] * 8) % (8 * SYMBOL_ROW) == 0 and SYMBOL_ROW * 8 == 16
        np.testing.assert_array_equal(rows[:, :k], np.arange(3 * k).reshape(3, k))
        assert not rows[:, k:].any()


def test_kernel_calls_are_built_once_per_set_of_buffers():
    rows, xs, y = _row_picker()
    ctx = Context("triton")
    routine = ctx.compile(y)
    routine.run(b=1, c=2)
    executable = routine._executable
    calls = list(executable._calls)
    assert calls and all(any(a is executable.table for a in call.arguments) for call in calls)
    routine.run(b=2, c=1)
    routine.run_many(b=[0, 1], c=[1, 0])
    assert executable._calls == calls  # the same objects: nothing rebuilt
    ctx.set(xs, np.ones_like(rows))
    routine.run(b=0, c=0)  # a new buffer for xs: new calls over it
    assert executable._calls[0] is not calls[0]
    np.testing.assert_array_equal(ctx.get(y), np.full((4, 3), 3.0, np.float32))


def test_the_module_launch_function_runs_what_the_runtime_runs():
    """``launch()`` in the generated module (for reading, or running it by hand) takes the same
    arguments the runtime builds: node buffers by name, the symbol table, the error flag."""
    import torch

    rows, xs, y = _row_picker()
    ctx = Context("triton")
    routine = ctx.compile(y)
    routine.run(b=4, c=1)
    expected = ctx.get(y)
    executable = routine._executable
    buffers = {node.name: torch.zeros_like(buf) for node, buf in routine._buffers.items()}
    buffers["xs"].copy_(torch.from_numpy(rows))
    table = torch.from_numpy(symbol_rows(np.array([[{"b": 4, "c": 1}[s.name] for s in executable.source.symbols]]))[0])
    executable.module.launch(buffers, table, torch.zeros(1, dtype=torch.int32))
    np.testing.assert_array_equal(buffers[y.value.name].numpy(), expected)


def test_after_its_first_launch_on_a_gpu_a_kernel_calls_its_compiled_launcher_directly():
    """The direct call passes what Triton's JIT passes to the compiled kernel's launcher (checked
    against the installed Triton's source, so that an upgrade changing it fails here)."""
    import inspect

    import triton.runtime.jit

    jit_run = inspect.getsource(triton.runtime.jit.JITFunction.run)
    assert ("kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, launch_metadata,"
            in jit_run and "knobs.runtime.launch_exit_hook, *bound_args.values())" in jit_run)
    calls = []

    class Compiled:
        function, packed_metadata = "function handle", "packed metadata"

        def run(self, *args):
            calls.append(args)

    class Jit:
        def __getitem__(self, grid):
            return lambda *args, **options: (calls.append(("jit", grid, args, options)), Compiled())[1]

    a, b = object(), object()
    source = KernelSource("k", [Param("a"), Param("b")], {"XBLOCK": 64}, 3, 4, None, "", "flat")
    call = KernelCall(Jit(), source, [a, b], fp_fusion=False)
    call.launch(stream=None)  # the interpreter: always the JIT
    call.launch(stream=None)
    assert [c[0] for c in calls] == ["jit", "jit"]
    calls.clear()
    call.launch(stream=7)
    call.launch(stream=7)
    assert calls[0] == ("jit", (3,), (a, b), {"XBLOCK": 64, "num_warps": 4, "enable_fp_fusion": False})
    assert calls[1] == (3, 1, 1, 7, "function handle", "packed metadata", None, None, None, a, b, 64)
    from triton import knobs

    def hook(metadata):  # a profiler's: launches stay on the JIT, which calls it
        pass

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        calls.clear()
        profiled = KernelCall(Jit(), source, [a, b], fp_fusion=False)
        profiled.launch(stream=7)
        profiled.launch(stream=7)
        assert [c[0] for c in calls] == ["jit", "jit"]
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)


# ---------------------------------------------------------------------------------------------
# Errors: a routine's run reads its flag at once, an executable's run leaves it for the next read


def _gather_out_of_range():
    table = oc.tensor(data(5, 3), label="table")
    ids = oc.tensor(np.array([[1, 7]], dtype=np.int32), batch=1, label="ids")
    return oc.take(table, ids, label="picked")


def test_an_out_of_range_gather_is_raised_by_its_run_and_by_the_next_read_once():
    y = _gather_out_of_range()
    ctx = Context("triton")
    routine = ctx.compile(y)
    with pytest.raises(OutOfBoundsError, match=rf"routine {routine.name}: a gather position into table \(axis 0 of "
                                               rf"dims \(5, 3\)\) is outside its axis"):
        routine.run()  # a routine that can fail reads its flag at once (docs/semantics.md, "Failed runs")
    assert not ctx._memory.pending
    routine._executable.run(routine._buffers, {})  # the executable alone: no device-to-host read here
    assert list(ctx._memory.pending) == [routine._executable]
    with pytest.raises(OutOfBoundsError, match="outside its axis"):
        ctx.get(y)
    assert not ctx._memory.pending
    ctx.get(y)  # raised once: the flag was cleared


def test_synchronize_raises_the_pending_error_and_run_many_raises_earlier_runs_errors_first():
    y = _gather_out_of_range()
    ctx = Context("triton")
    routine = ctx.compile(y)
    s = oc.IndexSymbol("s", 4)
    rows = oc.tensor(data(4, 3), batch=1, label="rows")
    stepper = ctx.compile((rows[s] * 1.0).materialize())
    with pytest.raises(OutOfBoundsError):
        routine.run()  # binds the buffers; the executable's runs below leave their errors pending
    routine._executable.run(routine._buffers, {})
    with pytest.raises(OutOfBoundsError, match="outside its axis"):
        ctx._memory.synchronize()
    ctx._memory.synchronize()  # nothing pending any more
    routine._executable.run(routine._buffers, {})
    with pytest.raises(OutOfBoundsError) as info:
        stepper.run_many(s=[0, 1])
    assert f"routine {routine.name}" in str(info.value) and getattr(info.value, "step", None) is None


def test_the_error_names_the_failing_check_and_several_failures_give_the_same_one():
    """Two checks fail in one run (a gather, and an index symbol without a size): the flag keeps
    the larger site number, whichever program sets it last, so the error is the same at every run."""
    table = oc.tensor(data(5, 3), label="table")
    b = oc.IndexSymbol("b")
    rows = oc.tensor(data(4, 3), batch=1, label="rows")
    picked = oc.take(table, oc.tensor(np.array([[1, 7]], dtype=np.int32), batch=1, label="ids"), label="picked")
    both = (picked.sum() + rows[b].sum()).materialize()
    messages = set()
    for _ in range(2):
        ctx = Context("triton")
        routine = ctx.compile(both)
        assert len(routine._executable.source.sites) == 2
        with pytest.raises(OutOfBoundsError) as info:
            routine.run(b=9)
        messages.add(str(info.value))
    (message,) = messages
    assert message.split(": ", 1)[1].split(";")[0] in routine._executable.source.sites.values()


def test_cuda_graphs_are_refused_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("OCANNL_TRITON_CUDA_GRAPHS", "1")
    ctx = Context("triton")
    with pytest.raises(BackendUnavailable, match=r"triton_cuda_graphs \(from OCANNL_TRITON_CUDA_GRAPHS\).*needs a GPU"):
        ctx.compile(oc.tensor(data(3), label="x") + 1.0)
    monkeypatch.setenv("OCANNL_TRITON_CUDA_GRAPHS", "0")
    ctx.compile(oc.tensor(data(3), label="x") + 1.0).run()


# ---------------------------------------------------------------------------------------------
# The autotuner


KEY = DotKey("k0", 512, 256, 1024, 1, "float32", "NVIDIA H100 80GB HBM3")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_tuning_cache_round_trips_and_its_key_includes_the_device(cache_dir):
    chosen = DotBlocks(64, 128, 32, 8, 8, 3)
    path = autotune.store(KEY, chosen, {0: 1e-4})
    assert path.parent == cache_dir / "triton" / "autotune" and cache.verified(path)
    assert autotune.load(KEY) == chosen
    for other in (DotKey(**{**KEY.__dict__, "device": "NVIDIA A100-SXM4-80GB"}),
                  DotKey(**{**KEY.__dict__, "dtype": "float16"}), DotKey(**{**KEY.__dict__, "k": 2048}),
                  DotKey(**{**KEY.__dict__, "kernel": "k1"})):
        assert autotune.load(other) is None
    path.write_text(path.read_text().replace('"block_m": 64', '"block_m": 16'))  # not what was recorded
    with pytest.warns(cache.CacheWarning, match="does not match its recorded digest"):
        assert autotune.load(KEY) is None


def test_a_tuned_configuration_copied_to_another_key_is_rebuilt_not_read(cache_dir):
    """A record names its entry: a configuration copied with its record under another key's name
    is measured again, with a warning, before its contents are even parsed."""
    other = DotKey(**{**KEY.__dict__, "k": 2048})
    path = autotune.store(KEY, DotBlocks(64, 128, 32, 8, 8, 3))
    copy = autotune.cache_path(other)
    copy.write_bytes(path.read_bytes())
    cache.record_path(copy).write_bytes(cache.record_path(path).read_bytes())
    with pytest.warns(cache.CacheWarning, match=rf"has the record of autotune/{path.name}, another entry"):
        assert autotune.load(other) is None


def test_a_planted_bytecode_file_never_runs(cache_dir, tmp_path):
    """A routine's module is executed from its generated text: a ``.pyc`` with an unchecked
    hash planted where Python's import system would look for the module's bytecode never runs,
    and no module file is written to the cache."""
    import importlib.util
    import py_compile

    from ocannl.backends.triton.emit import ModuleSource
    from ocannl.backends.triton.runtime import load_module

    marker = tmp_path / "marker"
    text = "VALUE = 1\n"
    planted = cache_dir / "triton" / f"planted-{hashlib.sha256(text.encode()).hexdigest()[:16]}.py"
    planted.parent.mkdir(parents=True, mode=0o700)
    planted.write_text(f"VALUE = 2\nopen({str(marker)!r}, 'w').close()\n")
    py_compile.compile(str(planted), cfile=importlib.util.cache_from_source(str(planted)), doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    planted.unlink()
    module = load_module(ModuleSource(routine="planted", kernels=[], text=text, checks_positions=False))
    assert module.VALUE == 1 and not marker.exists()
    assert not list((cache_dir / "triton").glob("*.py"))


def test_without_tuning_or_without_a_gpu_the_heuristic_table_serves(cache_dir, monkeypatch):
    def measure(blocks):
        raise AssertionError("nothing is measured")

    assert autotune.choose(KEY, measure) == tiling.dot_blocks(512, 256, 1024, False, 1)  # tuning is off by default
    monkeypatch.setenv("OCANNL_TRITON_AUTOTUNE", "1")
    no_gpu = DotKey(**{**KEY.__dict__, "device": ""})
    assert autotune.choose(no_gpu, measure) == autotune.heuristic(no_gpu)
    assert autotune.choose(KEY, None) == autotune.heuristic(KEY)
    assert not (cache_dir / "triton" / "autotune").exists() or not any((cache_dir / "triton" / "autotune").iterdir())
    # Under the interpreter the pre-pass keeps the table's plans even with tuning on.
    kernel, plan = _split_k_kernel()
    assert autotune.tuned([kernel], [plan]) == [plan]
    assert plan.blocks == tiling.dot_blocks(64, 64, 8192, False, 1)


def test_the_search_takes_the_fastest_and_ties_go_to_the_table(cache_dir, monkeypatch):
    configs = autotune.candidates(KEY)
    base = autotune.heuristic(KEY)
    assert configs[0] == base and len(configs) == len(set(configs)) > 8
    assert {(c.block_k, c.split_k, c.group_m) for c in configs} == {(base.block_k, base.split_k, base.group_m)}
    fastest = next(c for c in configs if c.block_m != base.block_m and c.num_warps == 4)
    timer = {c: 2e-4 for c in configs} | {fastest: 1e-4}
    broken = configs[-1]  # e.g. needs more shared memory than the GPU has
    calls = []

    def measure(blocks):
        calls.append(blocks)
        if blocks == broken:
            raise RuntimeError("out of resources")
        return timer[blocks]

    assert autotune.search(configs, measure)[0] == fastest
    assert autotune.search(configs, lambda b: 1.0)[0] == base  # a tie: the earliest, the table's
    with pytest.raises(RuntimeError, match="out of resources"):
        autotune.search([broken], measure)
    monkeypatch.setenv("OCANNL_TRITON_AUTOTUNE", "1")
    calls.clear()
    assert autotune.choose(KEY, measure) == fastest and calls == configs
    calls.clear()
    assert autotune.choose(KEY, measure) == fastest and calls == []  # from the disk cache


def test_a_candidate_is_written_with_its_blocks_run_and_timed(cache_dir, monkeypatch):
    """The measuring path up to the GPU timer: each candidate's kernel generated under its blocks
    and run (here by the interpreter, with a fake timer); the choice is cached."""
    def build():
        w, x = _matmul(32, 32, 64)
        return [w @ x]

    (kernel,) = partition(routine_ir(build).body)
    key = DotKey("k", 32, 32, 64, 1, "float32", "a GPU")
    runs, written = [], []
    planned = autotune.plan_kernel

    def timer(run, repeats):
        run()
        runs.append(written[-1])
        return {16: 3e-6, 32: 1e-6}[written[-1].block_m]

    def spying_plan_kernel(kernel, dot_blocks=None):
        written.append(dot_blocks)
        return planned(kernel, dot_blocks=dot_blocks)

    monkeypatch.setattr(autotune, "plan_kernel", spying_plan_kernel)
    configs = [c for c in autotune.candidates(key) if c.num_warps == 4 and c.num_stages == 2][:2]
    assert {c.block_m for c in configs} == {16, 32}
    monkeypatch.setattr(autotune, "candidates", lambda k: configs)
    monkeypatch.setenv("OCANNL_TRITON_AUTOTUNE", "1")
    chosen = autotune.choose(key, autotune.measure_kernel(kernel, key, timer=timer))
    assert runs == configs and chosen.block_m == 32 and autotune.load(key) == chosen


def test_given_blocks_decide_a_plan_and_planning_never_tunes(monkeypatch):
    """Planning is pure: the table's blocks unless the caller gives a contraction's, with tuning
    on and whatever the autotuner would say."""
    def no_tuning(*args):
        raise AssertionError("planning consulted the autotuner")

    monkeypatch.setenv("OCANNL_TRITON_AUTOTUNE", "1")
    monkeypatch.setattr(autotune, "choose", no_tuning)
    kernel, plan = _split_k_kernel()
    given = DotBlocks(32, 32, 32, 8, 4, 2, 4)
    assert plan_kernel(kernel, dot_blocks=given).blocks == given
    assert plan.blocks == plan_kernel(kernel).blocks != given


def test_the_tuning_pre_pass_chooses_among_plans_of_the_contractions(cache_dir, monkeypatch):
    """With tuning on and a GPU, ``TritonBackend.compile``'s pre-pass replaces a contraction's
    plan by the one planned with the measured fastest blocks; other kernels keep theirs."""
    kernel, plan = _split_k_kernel(32, 32, 64)
    (pointwise,) = partition(routine_ir(lambda: [oc.tensor(data(3), label="x") + 1.0]).body)
    flat = plan_kernel(pointwise)
    fastest = next(c for c in autotune.candidates(autotune.dot_key(kernel, plan)) if c != plan.blocks)
    monkeypatch.setenv("OCANNL_TRITON_AUTOTUNE", "1")
    monkeypatch.setattr(autotune, "device_name", lambda: "a GPU")
    monkeypatch.setattr(autotune, "measure_kernel", lambda k, key: lambda b: 1e-6 if b == fastest else 2e-6)
    tuned_plan, same = autotune.tuned([kernel, pointwise], [plan, flat])
    assert tuned_plan == plan_kernel(kernel, dot_blocks=fastest) and same is flat
    prepasses = []
    monkeypatch.setattr(autotune, "tuned", lambda kernels, plans: prepasses.append(plans) or list(plans))
    session.reset()
    Context("triton").compile(oc.tensor(data(3), label="x") + 1.0)
    assert len(prepasses) == 1


# ---------------------------------------------------------------------------------------------
# Split-K


def _matmul(m: int, n: int, k: int, low: float = -1.0):
    w = oc.param("w", output=n, input=k, init=data(n, k, seed=1, low=low))
    return w, oc.tensor(data(m, k, seed=2, low=low), batch=1, label="x")


def _split_k_kernel(m: int = 64, n: int = 64, k: int = 8192) -> tuple[Kernel, DotPlan]:
    """The contraction kernel of ``w @ x`` and its plan."""
    def build():
        w, x = _matmul(m, n, k)
        return [w @ x]

    (kernel,) = partition(routine_ir(build).body)
    return kernel, plan_kernel(kernel)


def _split_k_plan(m: int = 64, n: int = 64, k: int = 8192) -> DotPlan:
    return _split_k_kernel(m, n, k)[1]


def test_the_table_splits_k_for_a_small_output_over_a_long_reduction():
    plan = _split_k_plan()
    assert (plan.m, plan.n, plan.k_total) == (64, 64, 8192)
    assert plan.split_k == 16 and plan.k_slice == 512 and plan.grid >= tiling.SM_COUNT
    assert tiling.split_k(programs=tiling.SM_COUNT, k=8192) == 1  # the tiles fill a wave already
    assert tiling.split_k(programs=16, k=2 * tiling.SPLIT_K_SLICE - 1) == 1  # too short to split
    large = _split_k_plan(256, 1024, 1024)
    assert large.split_k == 1 and large.grid >= tiling.SM_COUNT


def test_split_k_matches_the_interpreter_is_deterministic_and_leaves_its_counters_at_zero():
    """M = N = 16, K = 1024: one output tile, four slices of 256; with a bias and relu epilogue
    (masked in all but the last program of the tile)."""
    def build():
        w, x = _matmul(16, 16, 1024, low=0.0)
        return [(w @ x + oc.tensor(data(16, seed=3), label="bias")).relu()]

    source = generate(routine_ir(build))
    (kernel,) = source.kernels
    assert kernel.grid == 4 and "slices_done" in source.text and "tl.atomic_add" in source.text
    assert testing.compare(build, ["triton"]) == []
    session.reset()
    (y,) = build()
    ctx = Context("triton")
    routine = ctx.compile(y)
    routine.run()
    first = ctx.get(y)
    routine.run()
    np.testing.assert_array_equal(ctx.get(y), first)
    counters = [t for key, t in routine._executable.scratch.items() if key[1].startswith("slices_done")]
    assert counters and all(not t.any() for t in counters)


def test_split_k_gradient_accumulation_matches_the_interpreter():
    """The weight gradient of a 16 x 16 layer over a batch of 1024: the batch is the reduction."""
    def build():
        w, x = _matmul(1024, 16, 16)
        update = train.grad_update((w @ x).relu().sum())
        return [update]

    ir = routine_ir(build)
    plans = [plan_kernel(k) for k in partition(ir.body)]
    assert any(isinstance(p, DotPlan) and p.split_k > 1 for p in plans)
    assert testing.compare(build, ["triton"]) == []


def test_split_k_kernels_compile_for_sm90_without_spills():
    def build():
        w, x = _matmul(64, 64, 8192)
        return [(w @ x).relu()]

    source = generate(routine_ir(build))
    binaries = compile_for_gpu([source])
    assert len(binaries) == 1 and not any(b.spills for b in binaries.values())


@pytest.mark.slow
def test_split_k_of_64x64x8192_within_the_dot_tolerance():
    def build():
        w, x = _matmul(64, 64, 8192, low=0.0)
        return [w @ x]

    session.reset()
    (y,) = build()
    ctx = Context("triton")
    ctx.compile(y).run()
    expected = data(64, 8192, seed=2, low=0.0).astype(np.float64) @ data(64, 8192, seed=1, low=0.0).astype(np.float64).T
    assert np.allclose(ctx.get(y), expected, rtol=1e-5, atol=1e-4)
