"""Finding the C compiler and its flags, and building C sources into the kernel cache.

**Compiler.** ``CC`` (a command line, e.g. ``"ccache gcc"``) when set, else the first of ``cc``,
``gcc``, ``clang`` on ``PATH``.

**Flags.** The default is deterministic: ``-O2 -ffp-contract=off -fno-math-errno -fwrapv -shared
-fPIC`` computes the interpreter's bits (no fused multiply-add the IR did not ask for, integer
overflow wraps as the interpreter's does; ``-fno-math-errno`` only lets ``sqrtf`` be one
instruction; ``-fno-builtin-pow -fno-builtin-powf`` keep ``pow`` the C library's: GCC's
vectorizer otherwise computes ``pow(x, 0.5)`` as ``sqrt(x)``, which differs at -0.0 and -inf). ``-ffast-math`` is never used: it reassociates sums. The fast setting,
``OCANNL_C_FAST=1`` (or ``c_fast=1`` in ``ocannl_config``), adds ``-march=native
-ffp-contract=fast``: multiply-adds fuse, so float results may differ from the interpreter in
the last bits, and the kernels only run on CPUs like this one. ``-fopenmp`` is added when the
compiler supports it (``OCANNL_C_OPENMP=0`` turns it off); the generated code asks for threads
only on loops whose iterations write disjoint cells (codegen.py), so results do not depend on the
thread count (``OMP_NUM_THREADS``).

**Cache.** A compiled kernel is ``<cache>/c/<key>.so`` (the compiler checks' own in
``<cache>/c/probes/``), ``key = sha256(source, compiler path and version, flags)``; where
``<cache>`` is, who may write it and how each library is verified before it is loaded is
``ocannl/backends/cache.py``.

**Probe.** The compiler must build a tiny library that loads and computes the right value, and,
unless ``OCANNL_C_OPENMP=0``, a second one with an OpenMP loop (else the kernels are built
without OpenMP). How compilers are found and probed, and when a verdict is reused, is
``ocannl/backends/toolchain.py``; the C setting is the compiler command, fast mode and OpenMP.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ocannl import config
from ocannl.backends import cache
from ocannl.backends.toolchain import (
    Toolchain, build_shared, check_probe, compiler_version, find_compiler, probed,
)
from ocannl.errors import BackendUnavailable, CompileError

BASE_FLAGS = ("-O2", "-ffp-contract=off", "-fno-math-errno", "-fwrapv", "-fno-builtin-pow", "-fno-builtin-powf")
"""``-O2``, not ``-O3``: the kernels run as fast (the register-tiled contractions are already
unrolled by hand; GCC 12's ``-O2`` vectorizes too), while ``-O3`` peels and unrolls every loop
with a small constant trip count, which makes compiling a training routine several times slower
(the figures are in the README, "C compile time")."""
FAST_FLAGS = ("-march=native", "-ffp-contract=fast")
CANDIDATES = ("cc", "gcc", "clang")

FIX = (
    "install a C compiler (e.g. `apt install gcc`, `xcode-select --install`) or point CC at one; "
    "meanwhile OCANNL_BACKEND=interp runs everything in the interpreter"
)


@dataclass(frozen=True)
class CToolchain(Toolchain):
    """A working C compiler and its flags; ``openmp``: ``-fopenmp`` is among them."""

    openmp: bool
    fast: bool

    what: ClassVar[str] = "C compiler"
    language: ClassVar[str] = "c"
    libraries: ClassVar[tuple[str, ...]] = ("-lm",)


def fast_mode() -> bool:
    return config.flag("c_fast", default=False)


def toolchain() -> CToolchain:
    """The compiler and flags for the current settings, probed once per process per setting
    (module docstring); :class:`BackendUnavailable` when none works."""
    fast, openmp = fast_mode(), config.flag("c_openmp", default=True)
    command = find_compiler([("CC", os.environ.get("CC"))], CANDIDATES, "C compiler", FIX)
    return probed("c", command, (fast, openmp), lambda: _probe(command, fast, openmp))


PROBE = "int ocannl_probe(int x) { return 3 * x + 1; }\n"
OPENMP_PROBE = (
    "int ocannl_probe(int n) {\n  int s = 0;\n#pragma omp parallel for reduction(+:s)\n"
    "  for (int i = 0; i < n; ++i) s += i;\n  return s;\n}\n"
)


def _probe(command: tuple[str, ...], fast: bool, openmp: bool) -> CToolchain:
    version = compiler_version(command, "C compiler", FIX)
    if fast:  # -march=native code runs only on CPUs like this one: key the cache by the CPU
        version += "\n" + _cpu_identity()
    flags = BASE_FLAGS + (FAST_FLAGS if fast else ())
    path = shutil.which(command[0]) or command[0]
    plain = CToolchain(command, path, version, flags, False, fast)
    try:
        check_probe(plain, PROBE, 13, 40, cache.directory("c", "probes"))
    except CompileError as e:
        raise BackendUnavailable(f"{plain.name} cannot build working shared libraries: {e}; {FIX}") from None
    if not openmp:
        return plain
    with_openmp = CToolchain(command, path, version, flags + ("-fopenmp",), True, fast)
    # Read once, when the OpenMP runtime loads, which this probe does first (backend.py).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        check_probe(with_openmp, OPENMP_PROBE, 100, 4950, cache.directory("c", "probes"))
    except CompileError:
        return plain
    return with_openmp


def _cpu_identity() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return hashlib.sha256(line.encode()).hexdigest()[:16]
    except OSError:
        pass
    return platform.processor() or platform.machine()


def compile_shared(source: str, tc: CToolchain) -> Path:
    """The shared library built from ``source``: from ``<cache>/c`` when its digest checks, else
    compiled into it."""
    return build_shared(source, tc, cache.directory("c"))
