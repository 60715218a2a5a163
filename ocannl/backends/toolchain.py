"""The system compilers the compiled backends run (the C compiler of the ``c`` backend, the C++
compiler of the Metal shim), found, probed and used by one mechanism. Each backend says which
settings name its compiler, which flags it wants and what its probe computes; what is done with
them is here.

**Finding.** A compiler is a command line (``"ccache gcc"``): the first of the backend's
settings that is set (``CC``; ``OCANNL_METAL_CXX``, then ``CXX``), else the first of its
candidate names found on ``PATH``. A setting naming no executable is an error naming the
setting, not a reason to look further: the user asked for that compiler.

**Probing.** A toolchain is accepted once it has built a tiny shared library (into the
backend's ``probes`` directory of the kernel cache) that loads and whose ``ocannl_probe``
computes the expected value: a command that exits 0 without compiling (``CC=true``) or builds
something else is refused. The verdict, the toolchain or the :class:`BackendUnavailable`
saying why there is none, is remembered per backend, compiler command, identity of the
compiler's executable (reinstalling or replacing it probes again), backend settings and cache
directory. A problem of the cache itself (an unusable folder, a write that failed on a full
disk) is not remembered: it is the user's to fix, and the next call sees the fix. A compiler that
is not found is looked for again on every call.

**Building.** A shared library is ``<directory>/<key>.so`` with ``key`` the sha256 of the source,
the compiler's path, command line and version and the flags (:func:`cache_key`), built by
``cache.build_atomically`` (a cache file is complete and sealed to its key, or absent) and
loaded only once verified (``SharedLibrary``). The key is predictable (a probe's depends only on
the compiler and flags), which is why what a cache entry holds is trusted by its seal, never by
its name.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar, Sequence, TypeVar

from ocannl.backends import cache
from ocannl.backends.cache import CacheError
from ocannl.backends.shared_library import SharedLibrary
from ocannl.errors import BackendUnavailable, CompileError

LINK_FLAGS = ("-shared", "-fPIC")
"""What makes a shared library of a translation unit, with every compiler here."""


@dataclass(frozen=True)
class Toolchain:
    """A working compiler: its command line, resolved path, ``--version`` text and flags (a
    backend's subclass adds its own settings and says what the compiler is for)."""

    command: tuple[str, ...]
    path: str
    version: str
    flags: tuple[str, ...]

    what: ClassVar[str] = "compiler"
    """What the compiler is, for messages: ``"C compiler"``, ``"C++ compiler"``."""
    language: ClassVar[str] = "c"
    """The ``-x`` language of the sources it builds."""
    libraries: ClassVar[tuple[str, ...]] = ()
    """Linked into every shared library it builds (``-lm``)."""

    @property
    def name(self) -> str:
        return f"the {self.what} {' '.join(self.command)}"

    @property
    def description(self) -> str:
        first = self.version.splitlines()[0] if self.version else "unknown version"
        return f"{' '.join(self.command)}: {first}"

    @property
    def is_clang(self) -> bool:
        return "clang" in self.version.lower()


T = TypeVar("T", bound=Toolchain)

_lock = threading.Lock()
_verdicts: dict[tuple, Toolchain | BackendUnavailable] = {}
_probe_libraries: list[SharedLibrary] = []
"""The probes' libraries stay loaded: they keep the runtimes they pulled in (the C++ runtime,
OpenMP's) mapped for the process, whose threads would otherwise lose their code when the last
kernel using them is unloaded."""


def find_compiler(settings: Sequence[tuple[str, str | None]], candidates: Sequence[str], what: str,
                  fix: str) -> tuple[str, ...]:
    """The command of the first of ``settings`` (pairs of a setting's name and value) that is
    set, else the first of ``candidates`` on ``PATH``; :class:`BackendUnavailable` when none
    is found (``what`` names the compiler, ``fix`` says how to get one)."""
    for variable, value in settings:
        line = (value or "").strip()
        if line:
            command = tuple(shlex.split(line))
            if shutil.which(command[0]) is None:
                raise BackendUnavailable(f"{variable}={line!r} names no executable: point it at a {what} or unset it; "
                                         f"{fix}")
            return command
    for name in candidates:
        if shutil.which(name) is not None:
            return (name,)
    unset = " and ".join(variable for variable, _ in settings)
    raise BackendUnavailable(f"no {what} found ({unset} unset and none of {', '.join(candidates)} on PATH): {fix}")


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


def compiler_version(command: tuple[str, ...], what: str, fix: str) -> str:
    """The ``--version`` text of ``command``; :class:`BackendUnavailable` when it cannot run."""
    name = " ".join(command)
    try:
        result = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BackendUnavailable(f"the {what} {name} cannot run ({e}): {fix}") from None
    if result.returncode != 0:
        raise BackendUnavailable(f"`{name} --version` failed: {result.stderr.strip()[:200]}; {fix}")
    return result.stdout.strip()


def probed(backend: str, command: tuple[str, ...], settings: tuple, probe: Callable[[], T]) -> T:
    """The toolchain ``probe()`` accepts for ``backend``'s compiler ``command`` under its
    ``settings``, probed once per process for each (module docstring, "Probing"); the
    :class:`BackendUnavailable` it raised, raised again."""
    key = (backend, command, executable_identity(command[0]), settings, str(cache.root()))
    with _lock:
        found = _verdicts.get(key)
        if found is None:
            try:
                found = probe()
            except CacheError:
                raise  # about the cache, not the compiler: not remembered
            except BackendUnavailable as e:
                found = e
            _verdicts[key] = found
    if isinstance(found, BackendUnavailable):
        raise found
    return found


def check_probe(tc: Toolchain, source: str, argument: int, expected: int, directory: Path) -> None:
    """Builds ``source`` with ``tc`` into ``directory``, loads it and checks that its
    ``int ocannl_probe(int)`` returns ``expected`` for ``argument``: a :class:`CompileError`
    saying what it did instead. The library stays loaded (:data:`_probe_libraries`)."""
    library = SharedLibrary(build_shared(source, tc, directory), tc.name)
    got = library.function("ocannl_probe", ctypes.c_int, [ctypes.c_int])(argument)
    if got != expected:
        raise CompileError(f"its probe library {library.path} computed ocannl_probe({argument}) = {got}, "
                           f"not {expected}")
    _probe_libraries.append(library)


def cache_key(source: str, tc: Toolchain) -> str:
    """The name of what ``tc`` builds from ``source`` in the kernel cache."""
    h = hashlib.sha256()
    for part in (source, tc.path, " ".join(tc.command), tc.version, " ".join(tc.flags + LINK_FLAGS)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def build_shared(source: str, tc: Toolchain, directory: Path) -> Path:
    """The shared library ``tc`` builds from ``source``: from ``directory`` (of the kernel
    cache) when its digest checks, else compiled into it."""
    target = directory / f"{cache_key(source, tc)}.so"
    if not cache.verified(target):
        command = [*tc.command, "-x", tc.language, "-", *tc.flags, *LINK_FLAGS, "-o", "{tmp}", *tc.libraries]
        cache.build_atomically(command, source, target, tc.name)
    return target
