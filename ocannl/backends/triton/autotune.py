"""Choosing a contraction's blocks: the heuristic table of tiling.py, or, with the
``triton_autotune`` setting on a GPU, the fastest of a few measured configurations, remembered
on disk. Tuning is a pre-pass of ``TritonBackend.compile`` (:func:`tuned`) that chooses among
plans of a kernel (plan.py plans a contraction with each candidate's blocks); planning itself
measures nothing and writes no code.

**What is tuned.** For a ``tl.dot`` kernel, keyed by :class:`DotKey` (the kernel: a digest of
its loop IR; its shape ``m x n x k`` and batch; its operands' storage type; the GPU's name): the
output tile ``BLOCK_M x BLOCK_N``, ``num_warps`` and ``num_stages`` (:func:`candidates`).

**What is not, and why tuning is off by default.** ``BLOCK_K`` and split-K stay the table's:
they decide how the reduction is cut (how many terms each ``tl.dot`` step and each slice adds
before the partial sums are combined), so a different choice adds the same terms in another
grouping and may change the last bits of the result. The candidates share the table's cut of
the reduction; the order of the products inside one ``tl.dot`` step is the compiler's (it
depends on the instructions chosen for a tile and a warp count), so even these candidates may
round differently. A run is deterministic either way, and the same cache gives the same
choice, hence the same bits; but a fresh tuning on another GPU or under another load may pick
another configuration. ocannl is deterministic by default, so tuning is opt-in
(``OCANNL_TRITON_AUTOTUNE=1``).

**The disk cache.** One JSON file per key under the kernel cache
(``<cache>/triton/autotune/<digest>.json``; ocannl/backends/cache.py: a directory only the
current user can write), written atomically with its record beside it (the entry's name, the
sha256 of its bytes, sealed with the user's cache key); an entry that does not verify, or whose
key differs, is ignored and measured again. The bytes parsed are the bytes verified, read once.
Deleting the directory forgets all choices.

**Without a GPU** (the interpreter, or a CPU-only machine) nothing is measured: the table
serves. The tests run the key, the cache round trip, the fallback, the search with a fake
timer, and the writing and running of a candidate (:func:`measure_kernel`) under the interpreter;
the GPU timing itself (:func:`gpu_time`) runs only on a GPU.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from ocannl import config
from ocannl.lowlevel.ir import Namer, RoutineIR, Seq, format_stmt

from ocannl.backends import cache
from ocannl.backends.partition import Kernel
from ocannl.backends.triton import tiling
from ocannl.backends.triton.plan import DotPlan, Plan, plan_kernel
from ocannl.backends.triton.tiling import DotBlocks

WARPS = (4, 8)
"""``num_warps`` tried."""
STAGES_16 = (3, 4)
STAGES_32 = (2, 3)
"""``num_stages`` tried for 16-bit (above) and float32 operands: the software pipelining depth
(more stages hide more memory latency and take more shared memory)."""
MAX_ENTRY_BYTES = 1 << 16
"""The largest tuned configuration read from the cache (one is a few hundred bytes)."""


@dataclass(frozen=True)
class DotKey:
    """What a tuned choice is valid for."""

    kernel: str
    """A digest of what the kernel computes (its loop IR): two kernels of one shape but other
    epilogues or layouts are tuned apart."""
    m: int
    n: int
    k: int
    batch: int
    dtype: str
    """The operands' storage type (``float16``, ``bfloat16``; ``float32`` otherwise)."""
    device: str
    """The GPU's name (``torch.cuda.get_device_name()``)."""

    @property
    def sixteen_bit(self) -> bool:
        return self.dtype in ("float16", "bfloat16")

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:32]


def enabled() -> bool:
    """The ``triton_autotune`` setting (off by default: module docstring)."""
    return config.flag("triton_autotune")


def heuristic(key: DotKey) -> DotBlocks:
    """The table's choice (tiling.py): the fallback, and the configuration tuning starts from."""
    return tiling.dot_blocks(key.m, key.n, key.k, key.sixteen_bit, key.batch)


def candidates(key: DotKey) -> list[DotBlocks]:
    """The configurations a search measures, the table's first: every output tile the table
    may take for this shape, with each warp count and pipelining depth, keeping the table's
    ``BLOCK_K``, group size and split-K (module docstring). Duplicates removed, order fixed."""
    base = heuristic(key)
    stages = STAGES_16 if key.sixteen_bit else STAGES_32
    out = [base]
    for bm, bn in tiling.dot_tiles(key.m, key.n, key.sixteen_bit):
        for warps in WARPS:
            for s in stages:
                out.append(replace(base, block_m=bm, block_n=bn, num_warps=warps, num_stages=s))
    return list(dict.fromkeys(out))


def search(configs: Sequence[DotBlocks], measure: Callable[[DotBlocks], float]) -> tuple[DotBlocks, dict]:
    """The configuration of ``configs`` whose ``measure`` (seconds a launch takes) is least; a
    tie goes to the earlier one, so the table's choice wins unless another is faster. A
    configuration whose measure raises (it does not compile, or needs more shared memory than
    the GPU has) is skipped; if all do, the first one's error is raised. Returns the choice and
    the times measured (by configuration index)."""
    times: dict[int, float] = {}
    errors: list[Exception] = []
    for i, blocks in enumerate(configs):
        try:
            times[i] = float(measure(blocks))
        except Exception as e:  # noqa: BLE001 - a configuration the GPU cannot run is skipped
            errors.append(e)
    if not times:
        raise errors[0]
    best = min(times, key=lambda i: (times[i], i))
    return configs[best], times


# ---------------------------------------------------------------------------------------------
# The disk cache


def cache_path(key: DotKey) -> Path:
    return cache.directory("triton", "autotune") / f"{key.digest()}.json"


def load(key: DotKey) -> DotBlocks | None:
    """The cached choice for ``key``, or ``None`` (absent, corrupted, or for another key)."""
    path = cache_path(key)
    text = cache.read_verified(path, MAX_ENTRY_BYTES)
    if text is None:
        return None
    try:
        entry = json.loads(text.decode("ascii"))
        if entry.get("key") != asdict(key):
            return None
        return DotBlocks(**entry["blocks"])
    except (ValueError, TypeError, KeyError, AttributeError):  # UnicodeDecodeError is a ValueError
        warnings.warn(cache.CacheWarning(f"the tuned configuration {path} is not one ocannl wrote: measuring again"),
                      stacklevel=2)
        return None


def store(key: DotKey, blocks: DotBlocks, times: dict | None = None) -> Path:
    """Record ``blocks`` as the choice for ``key`` (atomically, with its digest)."""
    path = cache_path(key)
    text = json.dumps({"key": asdict(key), "blocks": asdict(blocks), "seconds": times or {}}, sort_keys=True)
    cache.write_verified(path, text)
    return path


# ---------------------------------------------------------------------------------------------
# The choice


def device_name() -> str | None:
    """The name of the GPU that runs the kernels, or ``None`` (the interpreter, or no GPU)."""
    from ocannl.backends.triton.runtime import interpreting

    if interpreting():
        return None
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def choose(key: DotKey, measure: Callable[[DotBlocks], float] | None) -> DotBlocks:
    """The blocks for ``key``: the table's when tuning is off or there is no GPU (``key.device``
    empty) or nothing to measure with, else the cached choice, else the result of a search over
    :func:`candidates`, cached."""
    if not enabled() or not key.device or measure is None:
        return heuristic(key)
    found = load(key)
    if found is not None:
        return found
    blocks, times = search(candidates(key), measure)
    store(key, blocks, times)
    return blocks


def gpu_time(run: Callable[[], None], repeats: int) -> float:
    """Seconds one call of ``run`` takes on the GPU: the median of ``triton.testing.do_bench``
    over about ``repeats`` milliseconds. GPU only."""
    import torch
    import triton.testing

    torch.cuda.synchronize()
    return triton.testing.do_bench(run, rep=repeats, return_mode="median") / 1e3


def measure_kernel(kernel: Kernel, key: DotKey, timer: Callable[[Callable[[], None], int], float] = gpu_time,
                   repeats: int = 25) -> Callable[[DotBlocks], float]:
    """A function timing ``kernel`` (a partition kernel) planned with given blocks: the module is
    generated for it alone, run once on random operands of its nodes' shapes (which compiles it),
    then timed by ``timer`` (:func:`gpu_time`; the tests pass a fake one and run it under the
    interpreter)."""

    def measure(blocks: DotBlocks) -> float:
        from ocannl.backends.triton import options
        from ocannl.backends.triton.emit import emit_module
        from ocannl.backends.triton.runtime import TorchBuffers, TritonExecutable

        routine = RoutineIR(f"autotune_{key.digest()[:8]}", Seq(tuple(p.stmt for p in kernel.parts)))
        source = emit_module(routine, [kernel], options(), [plan_kernel(kernel, dot_blocks=blocks)])
        owner = TorchBuffers()
        executable = TritonExecutable(source.routine, source, owner)
        buffers = {}
        for node in {p.node for k in source.kernels for p in k.params if p.node is not None}:
            shape = tuple(node.dims) + ((4,) if node.dtype.name == "uint4x32" else ())
            buffers[node] = owner.zeros(shape, node.dtype.storage)
            if buffers[node].is_floating_point():
                buffers[node].uniform_(-1, 1)
        bindings = {s: 0 for s in source.symbols}
        executable.run(buffers, bindings)  # compiles
        return timer(lambda: executable.run(buffers, bindings), repeats)

    return measure


def dot_key(kernel: Kernel, plan: DotPlan) -> DotKey:
    """The key of a contraction kernel of the partition planned as ``plan``, on this machine's
    GPU (``device`` empty without one)."""
    namer = Namer()
    text = "\n".join(format_stmt(p.stmt, namer) for p in kernel.parts)
    dtype = plan.sixteen.name if plan.sixteen is not None else "float32"
    return DotKey(hashlib.sha256(text.encode()).hexdigest()[:16], plan.m, plan.n, plan.k_total,
                  math.prod(plan.batch), dtype, device_name() or "")


def tuned(kernels: Sequence[Kernel], plans: Sequence[Plan]) -> list[Plan]:
    """The plans the kernels run with, the pre-pass of ``TritonBackend.compile``: ``plans`` (the
    table's), except that with tuning on and a GPU running the kernels, each contraction's plan
    takes the blocks :func:`choose` picks."""
    if not enabled() or device_name() is None:
        return list(plans)
    out = []
    for kernel, plan in zip(kernels, plans):
        if isinstance(plan, DotPlan):
            key = dot_key(kernel, plan)
            plan = plan_kernel(kernel, dot_blocks=choose(key, measure_kernel(kernel, key)))
        out.append(plan)
    return out


__all__ = ["DotKey", "candidates", "choose", "dot_key", "heuristic", "load", "measure_kernel", "search", "store",
           "tuned"]
