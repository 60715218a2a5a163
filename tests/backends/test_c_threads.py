"""The C backend's thread count follows the cores other processes leave free
(``ocannl/backends/c/threads.py``, docs/codegen.md "Threads"): the decision from two samples of
``/proc/stat``, the settings that bound or fix it, and a routine run with it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import ocannl as oc
from ocannl.backends.c import compiler, threads
from ocannl.backends.c.threads import FreeCores

STAT = """cpu  {total} 0 0 0 0 0 0 0 0 0
cpu0 {a} 0 {a} 900 7 1 0 0 0 0
cpu1 {b} 0 0 900 7 0 0 0 0 0
intr 12345
"""


def cores(tmp_path, monkeypatch, ticks=(0, 0), limit: str | None = None) -> FreeCores:
    """A sampler of two cores reading a written ``/proc/stat`` (``ticks``: user ticks of each)."""
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    if limit is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", limit)
    path = tmp_path / "stat"
    path.write_text(STAT.format(total=sum(ticks), a=ticks[0], b=ticks[1]))
    return FreeCores(str(path))


def test_a_core_another_process_keeps_busy_is_left_to_it(tmp_path, monkeypatch):
    free = cores(tmp_path, monkeypatch)
    assert free.count == 2
    # One second of wall time: others kept 0.9 of a core busy beside our 0.5 s of CPU.
    assert free.decide((0.0, 0.0, 0.0), (1.0, 1.4, 0.5)) == 1
    # Only our own work (1.9 s over two cores) or others' brief use: both cores stay ours.
    assert free.decide((0.0, 0.0, 0.0), (1.0, 1.9, 1.9)) == 2
    assert free.decide((0.0, 0.0, 0.0), (1.0, 0.3, 0.0)) == 2
    # Never below one thread, whatever the others take.
    assert free.decide((0.0, 0.0, 0.0), (1.0, 2.0, 0.0)) == 1


def test_the_processor_time_of_ended_children_is_the_process_own(tmp_path, monkeypatch):
    """A routine's build runs the C compiler as a child, which keeps a core busy; once it has
    ended, that busy time is the process's own, not another process's load."""
    free = cores(tmp_path, monkeypatch)
    before = free._read()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    own = free._read()[2] - before[2]
    assert own >= 0.29, "the child's processor time counts as the process's own"
    ticks = round((before[1] + own) * threads._TICKS_PER_SECOND)  # cpu0 was busy with the child
    (tmp_path / "stat").write_text(STAT.format(total=ticks, a=ticks // 2, b=0))
    after = free._read()
    assert free.decide(before, (before[0] + 0.4, after[1], after[2])) == 2


def test_omp_num_threads_bounds_the_count(tmp_path, monkeypatch):
    free = cores(tmp_path, monkeypatch, limit="1")
    assert free.limit == free.count == 1
    free.free = free.decide((0.0, 0.0, 0.0), (1.0, 0.0, 0.0))
    assert free.free == 2 and free.count == 1


def test_a_count_another_library_sets_in_the_process_bounds_it(tmp_path, monkeypatch):
    """``threadpoolctl.threadpool_limits(1)`` calls ``omp_set_num_threads(1)``: OpenMP then holds
    a count other than the one set for the last run, which becomes the limit; leaving the limits
    restores the count seen on entry, and the limit with it."""
    free = cores(tmp_path, monkeypatch)
    assert free.for_run(current=2) == 2
    assert free.for_run(current=1) == 1, "someone set 1 since the last run"
    assert free.for_run(current=1) == 1, "1 is what was set for the last run: the limit stays"
    assert free.for_run(current=2) == 2, "the 2 restored on leaving the limits"


def test_busy_ticks_of_the_process_cores_are_read(tmp_path, monkeypatch):
    """user + system (+ irq) of cpu0 and cpu1, not idle or iowait: (30 + 30 + 1) + 20 ticks."""
    free = cores(tmp_path, monkeypatch, ticks=(30, 20))
    _, busy, _ = free._read()
    assert busy == pytest.approx(81 / threads._TICKS_PER_SECOND)


def test_an_unreadable_stat_keeps_the_configured_count(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    free = FreeCores(str(tmp_path / "missing"))
    assert free.threads() == free.count == min(free.limit, len(free.cores))


def test_omp_dynamic_false_fixes_the_count(monkeypatch):
    monkeypatch.setenv("OMP_DYNAMIC", "false")
    assert not threads.adapts()
    monkeypatch.setenv("OMP_DYNAMIC", "true")
    assert threads.adapts()


def test_a_routine_runs_on_the_free_cores_with_the_same_bits(monkeypatch):
    """Each run sets the count the sampler gives (here 1, then 2) through OpenMP, and a product
    run on threads (a packed GEMM) keeps its bits."""
    monkeypatch.delenv("OMP_DYNAMIC", raising=False)
    counts = iter([1, 2])
    monkeypatch.setattr(threads.free_cores(), "for_run", lambda current: next(counts))
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((300, 200)).astype(np.float32), rng.standard_normal((200, 300)).astype(np.float32)
    y = oc.tensor(a, input=1) @ oc.tensor(b, input=1)
    ctx = oc.Context("c")
    forward = ctx.compile(y)
    assert (forward._executable._set_threads is not None) == compiler.toolchain().openmp
    results = []
    for _ in range(2):
        forward.run()
        results.append(ctx.get(y.value).copy())
    assert np.array_equal(results[0].view(np.uint32), results[1].view(np.uint32))
    if compiler.toolchain().openmp:
        assert next(counts, None) is None  # each run asked the sampler for its count


def test_a_count_set_by_the_caller_holds_for_the_next_runs(monkeypatch):
    """A caller limiting OpenMP in the process (``threadpoolctl``'s ``threadpool_limits(1)`` calls
    ``omp_set_num_threads(1)``) is not overridden by the next run's count."""
    monkeypatch.delenv("OMP_DYNAMIC", raising=False)
    if not compiler.toolchain().openmp:
        pytest.skip("the C compiler here has no OpenMP")
    monkeypatch.setattr(threads, "_free_cores", None)  # a sampler of this test's own, its limit too
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((300, 200)).astype(np.float32), rng.standard_normal((200, 300)).astype(np.float32)
    forward = oc.Context("c").compile(oc.tensor(a, input=1) @ oc.tensor(b, input=1))
    get_threads, set_threads = forward._executable._set_threads
    forward.run()
    before = get_threads()
    set_threads(1)  # what threadpool_limits(1) does
    forward.run()
    assert get_threads() == 1
    set_threads(before)  # and what it does on leaving
    forward.run()
    assert get_threads() == min(before, threads.free_cores().free)
