"""Finding the C compiler and its flags, and building C sources into the kernel cache.

**Compiler.** ``CC`` (a command line, e.g. ``"ccache gcc"``) when set, else the first of ``cc``,
``gcc``, ``clang`` on ``PATH``.

**Flags.** The default is deterministic: ``-O2 -ffp-contract=off -fno-math-errno -fwrapv -shared
-fPIC`` computes the interpreter's bits (no fused multiply-add the IR did not ask for, integer
overflow wraps as the interpreter's does; ``-fno-math-errno`` only lets ``sqrtf`` be one
instruction; ``-fno-builtin-pow -fno-builtin-powf`` keep ``pow`` the C library's: GCC's
vectorizer otherwise computes ``pow(x, 0.5)`` as ``sqrt(x)``, which differs at -0.0 and -inf).
``-ffast-math`` is never used: it reassociates sums, and it is also what would let GCC replace
``expf`` and its kin in vectorized loops by the C library's vector variants, whose results differ.

**Target ISA.** ``OCANNL_C_ISA`` (or ``c_isa`` in ``ocannl_config``) chooses the instructions the
kernels may use:

- ``native``, the default: ``-march=native``, the vector unit of the CPU compiling them (AVX2 on
  a Zen 3, for instance, where the baseline x86-64 target has only SSE2). Results are unchanged:
  contraction stays off, so a vector multiply and add round as the interpreter's scalar ones do,
  and the math library calls are the same. A library built this way runs only on CPUs like this
  one, so its cache key includes the CPU's feature list (``/proc/cpuinfo``); a cache shared between
  machines never hands one CPU's library to another. A compiler that does not know
  ``-march=native`` builds for ``portable`` instead.
- ``portable``: no ``-march``, the compiler's default target: the libraries run on any CPU of the
  architecture, for building once and shipping. Its GEMM micro-kernels are scalar C.
- a target name (``x86-64-v3``, ``znver3``, ``armv8.2-a``, ...): passed as ``-march=<name>``. The
  compiler must accept it, and every instruction set it enables must be one this CPU has (else
  the kernels it builds could not run here): otherwise an :class:`OcannlError` naming the setting.

The target's vector width, read from the instruction-set macros the compiler defines for it
(``__AVX512F__``, ``__AVX__``, ``__SSE2__``, ``__ARM_NEON``), sizes the micro-kernels of the
packed GEMMs (``gemm.py``); the source, and so the cache key, carries it.

The fast setting, ``OCANNL_C_FAST=1`` (or ``c_fast=1``), adds ``-ffp-contract=fast``: multiply-adds
fuse where the target has FMA, so float results may differ from the interpreter in the last bits.
``-fopenmp`` is added when the compiler supports it (``OCANNL_C_OPENMP=0`` turns it off); the
generated code asks for threads only on loops whose iterations write disjoint cells (codegen.py),
so results do not depend on the thread count, which each run takes from the cores other processes
leave free, at most ``OMP_NUM_THREADS`` (``threads.py``).

**Cache.** A compiled kernel is ``<cache>/c/<key>.so`` (the compiler checks' own in
``<cache>/c/probes/``), ``key = sha256(source, compiler path and version, flags)``, the version
carrying the CPU's identity under ``native``; where ``<cache>`` is, who may write it and how each
library is verified before it is loaded is ``ocannl/backends/cache.py``. A source longer than
:data:`PARALLEL_BYTES` is compiled as :data:`UNITS_PER_CORE` translation units per core for its
helper functions and one for the routine (``emit.translation_units``), by as many compiler processes at once, into
object files in a temporary folder, then linked into that one library under the same key.

**Probe.** The compiler must build a tiny library that loads and computes the right value:
unless ``OCANNL_C_OPENMP=0``, one with an OpenMP loop, and where that fails (the kernels are then
built without OpenMP) or OpenMP is off, one without (a cold start compiles one probe, not two). How compilers are found and probed, and when a verdict is reused, is
``ocannl/backends/toolchain.py``; the C setting is the compiler command, the target ISA, fast
mode and OpenMP.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import platform
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ocannl import config
from ocannl.backends import cache
from ocannl.backends.c.emit import translation_units
from ocannl.backends.c.threads import usable_cores
from ocannl.backends.toolchain import (
    LINK_FLAGS, Toolchain, build_shared, cache_key, check_probe, compiler_version, find_compiler, probed,
)
from ocannl.errors import BackendUnavailable, CompileError, OcannlError

BASE_FLAGS = ("-O2", "-ffp-contract=off", "-fno-math-errno", "-fwrapv", "-fno-builtin-pow", "-fno-builtin-powf")
"""``-O2``, not ``-O3``: the kernels run as fast (the register-tiled contractions are already
unrolled by hand; GCC 12's ``-O2`` vectorizes too), while ``-O3`` peels and unrolls every loop
with a small constant trip count, which makes compiling a training routine several times slower
(the figures are in the README, "C compile time")."""
RUN_ONCE_OPTIMIZATION = "-O1"
"""What replaces ``-O2`` for a routine that runs once (a context's init routine,
``CBackend.compile_init``): the 2-block GPT's init routine compiles in 0.15 s of compiler time
instead of 0.22, and its Threefry calls take 16 ns instead of 14 (GCC 12). The flags that fix the
arithmetic stay, so the bits are the same at either level."""
FAST_FLAGS = ("-ffp-contract=fast",)
"""After ``BASE_FLAGS``, so that it overrides their ``-ffp-contract=off``."""
NATIVE, PORTABLE = "native", "portable"
ISA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*\Z")
"""What a target name given to ``c_isa`` may look like: one ``-march`` value, never another flag."""
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
    isa: str
    """The target the kernels are built for: ``native``, ``portable`` or a ``-march`` name (module
    docstring, "Target ISA"); ``portable`` too where ``native`` was asked of a compiler without it."""
    vector_bytes: int = 0
    """The width of the target's float vector registers (32 for AVX2, 64 for AVX-512, 16 for SSE or
    NEON), which sizes the GEMM micro-kernels (ocannl/lowlevel/cpu_schedule.py); 0 under
    ``portable``, whose micro-kernels are scalar C for any compiler and CPU."""

    what: ClassVar[str] = "C compiler"
    language: ClassVar[str] = "c"
    libraries: ClassVar[tuple[str, ...]] = ("-lm",)


OPENMP_SPIN_COUNT = 10_000
"""How long (in libgomp's spins, about a tenth of a millisecond) an OpenMP thread waits for the
next parallel region before it sleeps: the regions of one training step, and the steps of a
loop, follow each other within microseconds, and waking a sleeping thread costs tens of them (a
64 x 256 x 256 product ran in 123 µs on two threads that slept between runs, 72 µs on two that
spun this long, 120 µs on one). A thread never spins longer than this, so numpy's or torch's
thread pools get the core back soon after the last kernel."""


def openmp_wait_settings() -> None:
    """The OpenMP runtime's wait settings, unless the environment sets them (read once, when the
    runtime loads): threads spin :data:`OPENMP_SPIN_COUNT` times (libgomp), then sleep
    (``OMP_WAIT_POLICY=PASSIVE``, which LLVM's runtime follows at once)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("GOMP_SPINCOUNT", str(OPENMP_SPIN_COUNT))


def fast_mode() -> bool:
    return config.flag("c_fast", default=False)


def isa_setting() -> str:
    """The ``c_isa`` setting: ``native`` (the default), ``portable`` or a target name; a value
    that cannot be one ``-march`` name is an :class:`OcannlError` naming the setting."""
    value = (config.get("c_isa") or NATIVE).strip()
    if value.lower() in (NATIVE, PORTABLE):
        return value.lower()
    if not ISA_NAME.match(value):
        raise OcannlError(f"setting c_isa (from {config.origin('c_isa')}) must be {NATIVE}, {PORTABLE} or a "
                          f"target name such as x86-64-v3, got {value!r}")
    return value


def toolchain() -> CToolchain:
    """The compiler and flags for the current settings, probed once per process per setting
    (module docstring); :class:`BackendUnavailable` when none works, :class:`OcannlError` when
    the ``c_isa`` target cannot be built or run here."""
    fast, openmp, isa = fast_mode(), config.flag("c_openmp", default=True), isa_setting()
    command = find_compiler([("CC", os.environ.get("CC"))], CANDIDATES, "C compiler", FIX)
    return probed("c", command, (fast, openmp, isa), lambda: _probe(command, fast, openmp, isa))


def run_once(tc: CToolchain) -> CToolchain:
    """``tc`` building a routine that runs once: at :data:`RUN_ONCE_OPTIMIZATION`."""
    return dataclasses.replace(tc, flags=tuple(RUN_ONCE_OPTIMIZATION if f == "-O2" else f for f in tc.flags))


PROBE = "int ocannl_probe(int x) { return 3 * x + 1; }\n"
OPENMP_PROBE = (
    "int ocannl_probe(int n) {\n  int s = 0;\n#pragma omp parallel for reduction(+:s)\n"
    "  for (int i = 0; i < n; ++i) s += i;\n  return s;\n}\n"
)


def _probe(command: tuple[str, ...], fast: bool, openmp: bool, isa: str) -> CToolchain:
    version = compiler_version(command, "C compiler", FIX)
    isa, isa_flags, macros = _target(command, isa)
    vector_bytes = _vector_bytes(macros)
    if isa == NATIVE:  # -march=native code runs only on CPUs like this one: key the cache by the CPU
        version += "\n" + _cpu_identity()
    flags = BASE_FLAGS + isa_flags + (FAST_FLAGS if fast else ())
    path = shutil.which(command[0]) or command[0]
    if openmp:  # a working OpenMP build proves the compiler works: the plain probe only if it fails
        with_openmp = CToolchain(command, path, version, flags + ("-fopenmp",), True, fast, isa, vector_bytes)
        # Read once, when the OpenMP runtime loads, which this probe does first (backend.py).
        openmp_wait_settings()
        try:
            check_probe(with_openmp, OPENMP_PROBE, 100, 4950, cache.directory("c", "probes"))
            return with_openmp
        except CompileError:
            pass
    plain = CToolchain(command, path, version, flags, False, fast, isa, vector_bytes)
    try:
        check_probe(plain, PROBE, 13, 40, cache.directory("c", "probes"))
    except CompileError as e:
        raise BackendUnavailable(f"{plain.name} cannot build working shared libraries: {e}; {FIX}") from None
    return plain


def _target(command: tuple[str, ...], isa: str) -> tuple[str, tuple[str, ...], frozenset[str] | None]:
    """The target actually built for, its flags and its instruction-set macros (``None`` for
    ``portable``, whose kernels are scalar), for the ``c_isa`` value ``isa``: ``native`` falls
    back to ``portable`` when the compiler lacks ``-march=native``; a named target must be known
    to the compiler and enable no instruction set this CPU lacks (:class:`OcannlError`). Each
    ``-march`` is asked of the preprocessor once: a run costs 10-40 ms of a cold start."""
    if isa == PORTABLE:
        return PORTABLE, (), None
    host = _isa_macros(command, "-march=native")
    if isa == NATIVE:
        return (NATIVE, ("-march=native",), host) if host is not None else (PORTABLE, (), None)
    flag = f"-march={isa}"
    enabled = _isa_macros(command, flag)
    where = f"setting c_isa={isa} (from {config.origin('c_isa')})"
    if enabled is None:
        raise OcannlError(f"{where}: the C compiler {' '.join(command)} does not know {flag}; use {NATIVE}, "
                          f"{PORTABLE} or a target it lists (e.g. `gcc --help=target`)")
    missing = sorted(enabled - host) if host is not None else []  # None: nothing to check against
    if missing:
        raise OcannlError(f"{where}: this CPU lacks {', '.join(m.strip('_').lower() for m in missing)}, "
                          f"so kernels built for {isa} could not run here; choose a target this CPU has "
                          f"({NATIVE} is one)")
    return isa, (flag,), enabled


def _isa_macros(command: tuple[str, ...], flag: str) -> frozenset[str] | None:
    """The instruction-set macros (``__AVX2__``, ``__ARM_FEATURE_FMA``, ...) the compiler defines
    under ``flag``, from its preprocessor; ``None`` when it refuses the flag."""
    try:
        result = subprocess.run([*command, flag, "-x", "c", "-E", "-dM", "-"], input="", capture_output=True,
                                text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    names = (line.split()[1] for line in result.stdout.splitlines() if line.startswith("#define "))
    return frozenset(n for n in names if _ISA_MACRO.match(n))


_ISA_MACRO = re.compile(r"__(SSE\w*|AVX\w*|FMA\w*|F16C|BMI\w*|POPCNT|LZCNT|MOVBE|AES|PCLMUL|SHA|VAES|VPCLMULQDQ|"
                        r"GFNI|ADX|RDRND|RDSEED|XSAVE\w*|ARM_FEATURE_\w+|ARM_NEON\w*|riscv_\w+)__\Z")
"""The predefined macros that say which instruction sets a target has, on x86, ARM and RISC-V."""


def _vector_bytes(macros: frozenset[str] | None) -> int:
    """The float vector width of a target from its instruction-set macros; 0 when the compiler
    names none it has (the micro-kernels are then scalar)."""
    if not macros:
        return 0
    if "__AVX512F__" in macros:
        return 64
    if "__AVX__" in macros:
        return 32
    if macros & {"__SSE2__", "__ARM_NEON", "__ARM_NEON__"}:
        return 16
    return 0


def _cpu_identity() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return hashlib.sha256(line.encode()).hexdigest()[:16]
    except OSError:
        pass
    return platform.processor() or platform.machine()


PARALLEL_BYTES = 100_000
"""The length of source above which it is compiled as several translation units at the same
time: below it, a second compiler process would cost more than it saves."""

UNITS_PER_CORE = 2
"""Helper units per core. Units of equal length do not take the compiler equally long (a GEMM
driver takes longer than a loop of the same length), and the compile lasts as long as its
slowest unit: with two a core, one that finishes early leaves its core to another. The GPT
source of ``bench/cpu_steps.py`` (2 blocks, two cores): 1.31 s in one unit a core, 1.20 in two,
1.35 in four (each unit repeats the source's preamble); best of three."""


def compile_shared(source: str, tc: CToolchain) -> Path:
    """The shared library built from ``source``: from ``<cache>/c`` when its digest checks, else
    compiled into it. A long source is compiled as :func:`~ocannl.backends.c.emit.translation_units`
    (:func:`parallel_units`), at the same time, then linked; the cache entry is still one library under the
    whole source's key."""
    units = parallel_units(source)
    if len(units) == 1:
        return build_shared(source, tc, cache.directory("c"))
    target = cache.directory("c") / f"{cache_key(source, tc)}.so"
    if not cache.verified(target):
        with tempfile.TemporaryDirectory(prefix="ocannl-units-") as folder:
            objects = compile_objects(units, tc, Path(folder))
            cache.build_atomically([*tc.command, *objects, *tc.flags, *LINK_FLAGS, "-o", "{tmp}", *tc.libraries],
                                   None, target, tc.name)
    return target


def parallel_units(source: str) -> list[str]:
    """The translation units ``source`` is compiled as: one for the routine and
    :data:`UNITS_PER_CORE` a core for its helper functions, or the whole source when it is short
    (:data:`PARALLEL_BYTES`) or one core compiles it."""
    cores = len(usable_cores())
    if len(source) <= PARALLEL_BYTES or cores < 2:
        return [source]
    return translation_units(source, UNITS_PER_CORE * cores + 1)


def compile_objects(units: list[str], tc: CToolchain, folder: Path) -> list[str]:
    """The object files of ``units``, compiled into ``folder`` by as many compiler processes at
    once; a unit that fails to compile is a :class:`CompileError` quoting the compiler."""
    objects = [str(folder / f"unit{k}.o") for k in range(len(units))]
    running = []
    for unit, obj in zip(units, objects):
        path = folder / f"{Path(obj).stem}.c"
        path.write_text(unit)
        command = [*tc.command, "-c", str(path), *tc.flags, "-fPIC", "-o", obj]
        running.append((command, subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                                  text=True, **cache.dying_with_parent())))
    failed = None
    for command, process in running:
        try:
            _, stderr = process.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            stderr = "timed out after 600 s"
        if process.returncode != 0 and failed is None:
            failed = f"`{shlex.join(command)}` failed with exit code {process.returncode}:\n{stderr.strip()[:6000]}"
    if failed:
        raise CompileError(failed)
    return objects
