"""How many OpenMP threads a C routine runs on: as many as there are cores no other process keeps
busy (docs/codegen.md, "Threads").

A thread on a core another process keeps busy gets half of it, and every parallel loop ends at a
barrier where the other threads wait for it: measured on two cores with a busy loop pinned to
one, the GPT step of ``bench/cpu_steps.py`` took up to 4x its one-thread time on two threads. So
before each run the thread count is set (``omp_set_num_threads``) to the cores of this process's
affinity that other processes leave free, at most ``OMP_NUM_THREADS`` when that is set. What the
others use is sampled at most every :data:`SAMPLE_SECONDS`: the busy time of those cores in
``/proc/stat`` less this process's own CPU time (:func:`own_cpu_seconds`: its children's that
ended, the C compiler's, count as its own), over the wall time between two samples; a core
counts as taken when others use half of it or more. A count set in this process by another
library meanwhile (``omp_set_num_threads``, as ``threadpoolctl``'s limits call it) bounds it
from then on, as ``OMP_NUM_THREADS`` does: before each run the count OpenMP holds is compared with
the one set last. The results never depend on the count (a
parallel loop's iterations write disjoint cells, a packed GEMM's units are whole cells,
docs/codegen.md). ``OMP_DYNAMIC=false`` keeps OpenMP's own fixed count; where ``/proc/stat``
cannot be read the count is the affinity's (or ``OMP_NUM_THREADS``), as OpenMP would choose.
"""

from __future__ import annotations

import os
import threading
import time

SAMPLE_SECONDS = 0.2
"""How often the load of the other processes is sampled: ``/proc/stat`` counts in ticks of
10 ms, so a shorter window cannot tell a busy core from an idle one; reading it takes tens of
microseconds, which once per window costs nothing next to the runs in between."""

_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
"""``user nice system irq softirq steal`` of a ``/proc/stat`` cpu line (idle and iowait are not)."""


def usable_cores() -> list[int]:
    """The cores this process may run on: its affinity mask, where the system has one."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _thread_limit(cores: int) -> int:
    """``OMP_NUM_THREADS``'s first level when it is a positive number, else ``cores``."""
    value = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(value) if value.isdigit() and int(value) > 0 else cores


def own_cpu_seconds() -> float:
    """The processor time of this process and of its children that have ended: a routine's build
    runs the C compiler as children, which kept a core busy until the build returned; counted as
    another process's load, they left the first runs after a build (0.17 s of them, the
    784-1024-1024 MLP's steps on two cores) on one thread. A child still running is counted as
    another process until it ends."""
    times = os.times()
    return time.process_time() + times.children_user + times.children_system


def adapts() -> bool:
    """Whether the thread count follows the free cores: not under ``OMP_DYNAMIC=false``."""
    return os.environ.get("OMP_DYNAMIC", "").strip().lower() not in ("false", "0", "no", "off")


class FreeCores:
    """The thread count for the next run (:meth:`for_run`, :meth:`threads`), from samples of
    ``/proc/stat``: the cores others leave free, at most :attr:`limit`."""

    def __init__(self, stat_path: str = "/proc/stat"):
        self.stat_path = stat_path
        self.cores = usable_cores()
        self.limit = _thread_limit(len(self.cores))
        """``OMP_NUM_THREADS``, or the count set in this process by another library (:meth:`for_run`)."""
        self.free = len(self.cores)
        """The cores the last decision left to this process (:meth:`decide`)."""
        self._sample: tuple[float, float, float] | None = self._read()
        self._lock = threading.Lock()
        self._set: int | None = None
        """The count last set for a run (:meth:`for_run`)."""

    @property
    def count(self) -> int:
        """The count the last decision gives: the free cores, at most :attr:`limit`."""
        return min(self.free, self.limit)

    def for_run(self, current: int) -> int:
        """The count to set for a run starting now, OpenMP holding ``current``: a count that
        differs from the one set last was set by someone else in this process since, and becomes
        the limit (``threadpoolctl``'s limit, and the count it restores on leaving)."""
        with self._lock:
            if self._set is not None and current != self._set and current > 0:
                self.limit = current
        count = self.threads()
        with self._lock:
            self._set = count
        return count

    def threads(self) -> int:
        """The count for a run starting now: the last decision, renewed once its window ends."""
        sample = self._sample
        if sample is None or time.monotonic() - sample[0] < SAMPLE_SECONDS:
            return self.count
        with self._lock:
            now = self._read()
            if now is not None and now[0] - self._sample[0] >= SAMPLE_SECONDS:
                self.free = self.decide(self._sample, now)
                self._sample = now
        return self.count

    def decide(self, before: tuple[float, float, float], after: tuple[float, float, float]) -> int:
        """The free cores from two samples ``(wall seconds, busy seconds of our cores, our CPU
        seconds)``: at least one."""
        wall = after[0] - before[0]
        others = max(0.0, (after[1] - before[1]) - (after[2] - before[2])) / wall
        return max(1, len(self.cores) - int(others + 0.5))

    def _read(self) -> tuple[float, float, float] | None:
        """``(now, busy seconds of this process's cores, this process's CPU seconds with its ended
        children's)``, or
        ``None`` where the kernel does not say (no ``/proc/stat``, or not in its format)."""
        wanted = {f"cpu{c}" for c in self.cores}
        try:
            with open(self.stat_path) as f:
                lines = f.read().splitlines()
            ticks = sum(sum(int(v) for i, v in enumerate(line.split()[1:9]) if i in _BUSY_FIELDS)
                        for line in lines if line.split(maxsplit=1)[0] in wanted)
        except (OSError, ValueError, IndexError):
            return None
        return time.monotonic(), ticks / _TICKS_PER_SECOND, own_cpu_seconds()


_free_cores: FreeCores | None = None


def free_cores() -> FreeCores:
    """The process's one sampler, made on first use (after the environment is final)."""
    global _free_cores
    if _free_cores is None:
        _free_cores = FreeCores()
    return _free_cores
