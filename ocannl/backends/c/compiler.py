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

**Probe.** A toolchain is accepted once it has built a tiny library that loads and computes the
right value (a command that exits 0 without compiling, like ``CC=true``, is refused). The result
is remembered per setting: the compiler command, the identity of its executable (reinstalling it
retries), fast mode, OpenMP and the cache directory; a compiler that is not found is looked for
again on every use.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from ocannl import config
from ocannl.backends import cache
from ocannl.backends.cache import CacheError, build_atomically
from ocannl.backends.shared_library import SharedLibrary
from ocannl.errors import BackendUnavailable, CompileError

BASE_FLAGS = ("-O2", "-ffp-contract=off", "-fno-math-errno", "-fwrapv", "-fno-builtin-pow", "-fno-builtin-powf")
"""``-O2``, not ``-O3``: the kernels run as fast (the register-tiled contractions are already
unrolled by hand; GCC 12's ``-O2`` vectorizes too), while ``-O3`` peels and unrolls every loop
with a small constant trip count, which makes compiling a training routine several times slower
(the figures are in the README, "C compile time")."""
FAST_FLAGS = ("-march=native", "-ffp-contract=fast")
LINK_FLAGS = ("-shared", "-fPIC")
CANDIDATES = ("cc", "gcc", "clang")

FIX = (
    "install a C compiler (e.g. `apt install gcc`, `xcode-select --install`) or point CC at one; "
    "meanwhile OCANNL_BACKEND=interp runs everything in the interpreter"
)


@dataclass(frozen=True)
class Toolchain:
    """A working compiler: its command line, resolved path, ``--version`` text, and flags."""

    command: tuple[str, ...]
    path: str
    version: str
    flags: tuple[str, ...]
    openmp: bool
    fast: bool

    @property
    def description(self) -> str:
        first = self.version.splitlines()[0] if self.version else "unknown version"
        return f"{' '.join(self.command)}: {first}"


_lock = threading.Lock()
_toolchains: dict[tuple, Toolchain | BackendUnavailable] = {}
_probe_libraries: list[SharedLibrary] = []
"""The probes' libraries stay loaded: the OpenMP one keeps the OpenMP runtime mapped, whose idle
threads would otherwise lose their code when the last kernel using it is unloaded."""


def find_compiler() -> tuple[str, ...]:
    """The compiler command: ``CC``, else ``cc``/``gcc``/``clang`` found on ``PATH``."""
    cc = os.environ.get("CC", "").strip()
    if cc:
        command = tuple(shlex.split(cc))
        if shutil.which(command[0]) is None:
            raise BackendUnavailable(f"CC={cc!r} names no executable: set CC to a C compiler, or unset it to use cc/gcc/clang; {FIX}")
        return command
    for name in CANDIDATES:
        if shutil.which(name) is not None:
            return (name,)
    raise BackendUnavailable(f"no C compiler found (CC is unset and none of {', '.join(CANDIDATES)} is on PATH): {FIX}")


def fast_mode() -> bool:
    return config.flag("c_fast", default=False)


def toolchain() -> Toolchain:
    """The compiler and flags for the current settings, probed once per process per setting
    (module docstring); :class:`BackendUnavailable` when none works."""
    fast, openmp = fast_mode(), config.flag("c_openmp", default=True)
    command = find_compiler()
    key = (command, executable_identity(command[0]), fast, openmp, str(cache.root()))
    with _lock:
        found = _toolchains.get(key)
        if found is None:
            try:
                found = _probe(command, fast, openmp)
            except CacheError:
                raise  # about the cache, not the compiler: not remembered
            except BackendUnavailable as e:
                found = e
            _toolchains[key] = found
    if isinstance(found, BackendUnavailable):
        raise found
    return found


def executable_identity(name: str) -> tuple:
    """The resolved path of executable ``name`` and its file's identity: a compiler replaced or
    installed under the same name is a new setting."""
    path = shutil.which(name)
    if path is None:
        return (name,)
    try:
        info = os.stat(path)
    except OSError:
        return (path,)
    return path, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


PROBE = "int ocannl_probe(int x) { return 3 * x + 1; }\n"
OPENMP_PROBE = (
    "int ocannl_probe(int n) {\n  int s = 0;\n#pragma omp parallel for reduction(+:s)\n"
    "  for (int i = 0; i < n; ++i) s += i;\n  return s;\n}\n"
)


def _probe(command: tuple[str, ...], fast: bool, openmp: bool) -> Toolchain:
    name = " ".join(command)
    try:
        result = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BackendUnavailable(f"the C compiler {name} cannot run ({e}): {FIX}") from None
    if result.returncode != 0:
        raise BackendUnavailable(f"`{name} --version` failed: {result.stderr.strip()[:200]}; {FIX}")
    version = result.stdout.strip()
    if fast:  # -march=native code runs only on CPUs like this one: key the cache by the CPU
        version += "\n" + _cpu_identity()
    flags = BASE_FLAGS + (FAST_FLAGS if fast else ())
    path = shutil.which(command[0]) or command[0]
    plain = Toolchain(command, path, version, flags, False, fast)
    try:
        _check_probe(plain, PROBE, 13, 40)
    except CompileError as e:
        raise BackendUnavailable(f"the C compiler {name} cannot build working shared libraries: {e}; {FIX}") from None
    if not openmp:
        return plain
    with_openmp = Toolchain(command, path, version, flags + ("-fopenmp",), True, fast)
    try:
        _check_probe(with_openmp, OPENMP_PROBE, 100, 4950)
    except CompileError:
        return plain
    return with_openmp


def _check_probe(tc: Toolchain, source: str, argument: int, expected: int) -> None:
    """Builds ``source`` with ``tc``, loads it and checks ``ocannl_probe(argument)``."""
    if tc.openmp:  # read once, when the OpenMP runtime loads: this probe loads it first (backend.py)
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    library = SharedLibrary(compile_shared(source, tc, kind="probes"), f"the C compiler {' '.join(tc.command)}")
    got = library.function("ocannl_probe", ctypes.c_int, [ctypes.c_int])(argument)
    if got != expected:
        raise CompileError(f"its probe library {library.path} computed ocannl_probe({argument}) = {got}, not {expected}")
    _probe_libraries.append(library)


def _cpu_identity() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return hashlib.sha256(line.encode()).hexdigest()[:16]
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_key(source: str, tc: Toolchain) -> str:
    h = hashlib.sha256()
    for part in (source, tc.path, " ".join(tc.command), tc.version, " ".join(tc.flags + LINK_FLAGS)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def compile_shared(source: str, tc: Toolchain, *, kind: str = "") -> Path:
    """The shared library built from ``source``: from the cache when its digest checks, else
    compiled into it (into the subdirectory ``kind`` of ``<cache>/c``, e.g. ``probes`` for the
    compiler checks)."""
    directory = cache.directory("c", kind) if kind else cache.directory("c")
    target = directory / f"{cache_key(source, tc)}.so"
    if not cache.verified(target):
        build_atomically([*tc.command, "-x", "c", "-", *tc.flags, *LINK_FLAGS, "-o", "{tmp}", "-lm"], source, target,
                         f"the C compiler {' '.join(tc.command)}")
    return target
