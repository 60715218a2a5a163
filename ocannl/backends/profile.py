"""Where a routine spends its time: a table of its loop nests, each with its share of the run
time, its FLOPs and bytes (``ocannl/lowlevel/cost.py``), and the GFLOP/s and GB/s it reached
(README, "Profiling").

A backend that can time the nests of a routine (its ``profiles`` attribute is true) compiles a
*profiling* executable on request (``backend.compile(routine, profile=True)``): it computes what
the plain one does, bit for bit, and counts its runs, the seconds spent in the routine and in
each of its :func:`~ocannl.lowlevel.cost.timed_statements`; its ``take_profile()`` returns them
as :class:`Counters` and starts counting again. Two ways to use it:

* ``routine.profile(n, **bindings)`` runs the routine ``n`` times on a profiling executable (the
  runs take effect, as ``n`` calls of ``run`` would) and returns a :class:`Profile`;
* ``OCANNL_PROFILE=1`` compiles every routine that way and prints each routine's profile, over
  all of its runs, on standard error when the process exits (each profiled executable is kept
  until then).
"""

from __future__ import annotations

import atexit
import sys
from dataclasses import dataclass

from ocannl.lowlevel.analysis import accesses, loop_chain
from ocannl.lowlevel.cost import timed_statements, work
from ocannl.lowlevel.ir import RoutineIR, Stmt

DESCRIPTION_WIDTH = 60
"""The longest description a row prints: the table stays readable for nests of many operands."""


@dataclass(frozen=True)
class Counters:
    """What a profiling executable measured since it last reported: its ``runs``, the seconds
    spent in the routine, and in each timed statement."""

    runs: int
    seconds: float
    nest_seconds: tuple[float, ...]


@dataclass(frozen=True)
class NestProfile:
    """One timed statement of a routine: ``seconds`` over all the runs profiled."""

    index: int
    description: str
    seconds: float
    flops: int
    bytes: int


@dataclass(frozen=True)
class Profile:
    """A routine's nests with their measured times over ``runs`` runs; ``seconds`` is the time
    spent in the routine, the nests' and what runs between them."""

    routine: str
    backend: str
    runs: int
    seconds: float
    nests: tuple[NestProfile, ...]

    def __str__(self) -> str:
        return format_profile(self)


def profile_of(ir: RoutineIR, backend: str, counters: Counters) -> Profile:
    """The profile of routine ``ir`` from what its profiling executable measured."""
    statements = timed_statements(ir.body)
    if len(counters.nest_seconds) != len(statements):
        raise AssertionError(f"routine {ir.name}: {len(counters.nest_seconds)} timers for {len(statements)} nests")
    nests = []
    for k, (stmt, t) in enumerate(zip(statements, counters.nest_seconds)):
        w = work(stmt)
        nests.append(NestProfile(k, describe(stmt), t, w.flops, w.bytes))
    return Profile(ir.name, backend, counters.runs, counters.seconds, tuple(nests))


def describe(stmt: Stmt) -> str:
    """``written <- read, ... [extents]``: the nodes a nest writes and reads and its loops."""
    written: dict[str, None] = {}
    read: dict[str, None] = {}
    for a in accesses(stmt, fills=True):
        (written if a.write else read)[a.node.debug_name] = None
    chain, _ = loop_chain(stmt)
    text = ", ".join(written) + (" <- " + ", ".join(n for n in read if n not in written) if read else "")
    if chain:
        text += " [" + "x".join(str(f.extent) for f in chain) + "]"
    return text if len(text) <= DESCRIPTION_WIDTH else text[: DESCRIPTION_WIDTH - 3] + "..."


def format_profile(p: Profile) -> str:
    """The table: a row per nest, slowest first, then the total."""
    runs = max(p.runs, 1)
    in_nests = sum(n.seconds for n in p.nests)
    lines = [
        f"profile of routine {p.routine} on {p.backend}: {p.runs} run(s), {_time(p.seconds / runs)} per run, "
        f"{_time(in_nests / runs)} of it in its {len(p.nests)} nests",
        f"{'#':>4} {'time/run':>10} {'share':>6} {'MFLOP':>9} {'GFLOP/s':>8} {'MB':>8} {'GB/s':>7}  nest",
    ]
    for n in sorted(p.nests, key=lambda n: -n.seconds):
        per_run = n.seconds / runs
        share = n.seconds / p.seconds if p.seconds > 0 else 0.0
        lines.append(
            f"{n.index:>4} {_time(per_run):>10} {share:>6.1%} {n.flops / 1e6:>9.3f} {_rate(n.flops, per_run):>8} "
            f"{n.bytes / 1e6:>8.3f} {_rate(n.bytes, per_run):>7}  {n.description}"
        )
    total_flops, total_bytes = sum(n.flops for n in p.nests), sum(n.bytes for n in p.nests)
    lines.append(
        f"{'all':>4} {_time(in_nests / runs):>10} {in_nests / p.seconds if p.seconds > 0 else 0.0:>6.1%} "
        f"{total_flops / 1e6:>9.3f} {_rate(total_flops, in_nests / runs):>8} {total_bytes / 1e6:>8.3f} "
        f"{_rate(total_bytes, in_nests / runs):>7}"
    )
    return "\n".join(lines)


def _time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.2f} us"


def _rate(amount: int, seconds: float) -> str:
    """``amount`` per second in units of 10^9 (GFLOP/s, GB/s); ``-`` when nothing was timed."""
    return f"{amount / seconds / 1e9:.2f}" if seconds > 0 else "-"


# ---------------------------------------------------------------------------------------------
# OCANNL_PROFILE=1: every routine's profile at exit

_pending: list[tuple[RoutineIR, str, object]] = []
"""The profiling executables compiled under the setting, with their routine and backend."""


def report_at_exit(ir: RoutineIR, backend: str, executable: object) -> None:
    """Print the profile of ``executable`` (a profiling executable of ``ir``) on standard error
    at exit, if it ran."""
    if not _pending:
        atexit.register(_print_profiles)
    _pending.append((ir, backend, executable))


def _print_profiles() -> None:
    for ir, backend, executable in _pending:
        counters = executable.take_profile()
        if counters.runs:
            print(profile_of(ir, backend, counters), file=sys.stderr)
