"""Finding the C compiler, its flags, and the on-disk kernel cache (spec/backend.md §7.3,
shared/DESIGN.md §5).

**Compiler.** ``CC`` (a command line, e.g. ``"ccache gcc"``) when set, else the first of ``cc``,
``gcc``, ``clang`` on ``PATH``.

**Flags.** The default is deterministic: ``-O3 -ffp-contract=off -fno-math-errno -fwrapv -shared
-fPIC`` computes the interpreter's bits (no fused multiply-add the IR did not ask for, integer
overflow wraps as the interpreter's does; ``-fno-math-errno`` only lets ``sqrtf`` be one
instruction). ``-ffast-math`` is never used: it reassociates sums. The fast setting,
``OCANNL_C_FAST=1`` (or ``c_fast=1`` in ``ocannl_config``), adds ``-march=native
-ffp-contract=fast``: multiply-adds fuse, so float results may differ from the interpreter in
the last bits, and the kernels only run on CPUs like this one. ``-fopenmp`` is added when the
compiler supports it (``OCANNL_C_OPENMP=0`` turns it off); the generated code asks for threads
only on loops whose iterations write disjoint cells (codegen.py), so results do not depend on the
thread count (``OMP_NUM_THREADS``).

**Cache.** A compiled kernel is ``<cache>/c/<key>.so`` (the compiler checks' own in
``<cache>/c/probes/``), where ``<cache>`` is ``OCANNL_CACHE_DIR``
(or ``cache_dir`` in ``ocannl_config``), else ``$XDG_CACHE_HOME/ocannl``, else
``~/.cache/ocannl``, and ``key = sha256(source, compiler path and version, flags)``. A compilation
writes a temporary file in the same directory and renames it into place (``os.replace``), so
concurrent processes compiling the same routine never load a half-written file; the last rename
wins, with identical contents. Deleting the directory is always safe.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from ocannl import config
from ocannl.errors import BackendUnavailable, OcannlError

BASE_FLAGS = ("-O3", "-ffp-contract=off", "-fno-math-errno", "-fwrapv")
FAST_FLAGS = ("-march=native", "-ffp-contract=fast")
LINK_FLAGS = ("-shared", "-fPIC")
CANDIDATES = ("cc", "gcc", "clang")

FIX = (
    "install a C compiler (e.g. `apt install gcc`, `xcode-select --install`) or point CC at one; "
    "meanwhile OCANNL_BACKEND=interp runs everything in the interpreter"
)


class CompileError(OcannlError):
    """The C compiler rejected a generated source (a bug in ocannl: please report it)."""


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
    (``CC``, ``PATH``, fast mode, OpenMP); :class:`BackendUnavailable` when none works."""
    fast, openmp = fast_mode(), config.flag("c_openmp", default=True)
    key = (os.environ.get("CC"), os.environ.get("PATH"), fast, openmp, str(cache_dir()))
    with _lock:
        found = _toolchains.get(key)
        if found is None:
            try:
                found = _probe(fast, openmp)
            except BackendUnavailable as e:
                found = e
            _toolchains[key] = found
    if isinstance(found, BackendUnavailable):
        raise found
    return found


def _probe(fast: bool, openmp: bool) -> Toolchain:
    command = find_compiler()
    try:
        result = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise BackendUnavailable(f"the C compiler {' '.join(command)} cannot run ({e}): {FIX}") from None
    if result.returncode != 0:
        raise BackendUnavailable(f"`{' '.join(command)} --version` failed: {result.stderr.strip()[:200]}; {FIX}")
    version = result.stdout.strip()
    if fast:  # -march=native code runs only on CPUs like this one: key the cache by the CPU
        version += "\n" + _cpu_identity()
    flags = BASE_FLAGS + (FAST_FLAGS if fast else ())
    path = shutil.which(command[0]) or command[0]
    plain = Toolchain(command, path, version, flags, False, fast)
    try:
        compile_shared("int ocannl_probe(void) { return 0; }\n", plain, kind="probes")
    except CompileError as e:
        raise BackendUnavailable(f"the C compiler {' '.join(command)} cannot build shared libraries: {e}; {FIX}") from None
    if not openmp:
        return plain
    with_openmp = Toolchain(command, path, version, flags + ("-fopenmp",), True, fast)
    probe = "int ocannl_probe(int n) {\n  int s = 0;\n#pragma omp parallel for reduction(+:s)\n  for (int i = 0; i < n; ++i) s += i;\n  return s;\n}\n"
    try:
        compile_shared(probe, with_openmp, kind="probes")
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


def cache_dir() -> Path:
    """Where compiled kernels live (see the module docstring)."""
    configured = config.get("cache_dir")
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "ocannl"


def cache_key(source: str, tc: Toolchain) -> str:
    h = hashlib.sha256()
    for part in (source, tc.path, " ".join(tc.command), tc.version, " ".join(tc.flags + LINK_FLAGS)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def build_atomically(cmd: list[str], source: str | None, target: Path, compiler: str) -> None:
    """Runs ``cmd`` (``source`` on its standard input), which writes its output where ``{tmp}``
    stands: a temporary file beside ``target``, renamed to ``target`` only once complete, so a
    concurrent process never loads a half-written file (the cache of every compiled backend)."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem[:16]}-", suffix=".tmp")
    os.close(fd)
    try:
        cmd = [tmp if part == "{tmp}" else part for part in cmd]
        result = subprocess.run(cmd, input=source, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise CompileError(
                f"`{shlex.join(cmd)}` failed with exit code {result.returncode}:\n{result.stderr.strip()[:6000]}"
            )
        os.replace(tmp, target)
    except OSError as e:
        raise CompileError(f"running {compiler} failed: {e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def compile_shared(source: str, tc: Toolchain, *, kind: str = "") -> Path:
    """The shared library built from ``source``: from the cache, or compiled into it (into the
    subdirectory ``kind`` of ``<cache>/c``, e.g. ``probes`` for the compiler checks)."""
    directory = cache_dir() / "c" / kind if kind else cache_dir() / "c"
    target = directory / f"{cache_key(source, tc)}.so"
    if target.exists():
        return target
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BackendUnavailable(
            f"cannot create the kernel cache {directory} ({e}): set OCANNL_CACHE_DIR to a writable directory"
        ) from None
    build_atomically([*tc.command, "-x", "c", "-", *tc.flags, *LINK_FLAGS, "-o", "{tmp}", "-lm"], source, target,
                     f"the C compiler {' '.join(tc.command)}")
    return target
