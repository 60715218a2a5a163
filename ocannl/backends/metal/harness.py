"""Running emitted MSL on the CPU: the C++ translation unit, the compiler, the kernel cache, and
the sanitizer builds (docs/codegen.md, "Metal").

**The translation unit** of a routine is its ``.metal`` text, unchanged, compiled as C++20 with
``shim/`` on the include path (so ``#include <metal_stdlib>`` is ``shim/metal_shim.hpp``),
followed by host code the harness appends: one thunk per kernel, calling it as thread ``lane``
of threadgroup ``group`` with its arguments unpacked, and ``ocannl_routine(buffers, symbols)``,
which dispatches the kernels in order through ``shim/launcher.cpp`` and returns the status (0,
or the number of the first runtime check that failed). A kernel taking an argument buffer
(emit.py) gets what a Metal host encodes: its struct, filled with the buffers' addresses and the
symbols' values, passed as its one buffer.

**The compiler** is ``OCANNL_METAL_CXX`` (a command line), else ``CXX``, else the first of
``g++``, ``clang++``, ``c++`` on ``PATH``; it needs C++20 and ``<barrier>`` (g++ 11, clang 14
with libstdc++ 11 or later). Flags: ``-std=c++20 -O2 -pthread -fwrapv -ffp-contract=off
-fno-math-errno -fno-builtin-powf`` (integers wrap and no multiply-add is fused, as the
interpreter computes; ``pow`` stays the C library's call, which the compiler would otherwise
rewrite for constant exponents: ``x * x`` for 2, ``sqrt`` in vector code for 0.5), unknown
attributes silenced (the Metal ones). The launcher is compiled once per toolchain into an object file.

**The cache**: ``<cache>/metal/<key>.so`` in the shared kernel cache (``ocannl/backends/cache.py``:
private directories, each file verified against its recorded sha256 before use), keyed as
every compiled library (``ocannl/backends/toolchain.py``: sha256 of the source, which here
includes the shim and the launcher, the compiler's path and version, and the flags).

**The probe** builds the launcher and a small C++20 library using ``<barrier>``, loads it and
checks what it computes (the mechanism of ``ocannl/backends/toolchain.py``); the verdict is
remembered per compiler command, executable identity, sanitizer setting and cache directory.

**Sanitizers** (``OCANNL_METAL_SANITIZE=address,undefined`` or ``=thread``): a sanitizer runtime
cannot join the Python process, so the routine is linked with ``shim/driver.cpp`` into an
executable of its own; each run writes the buffers to a file, runs it, and reads them back. Any
sanitizer report is a :class:`SanitizerError` carrying the report.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Sequence

import numpy as np

from ocannl import config
from ocannl.backends import cache
from ocannl.backends.metal.emit import Kernel, MetalProgram, Param
from ocannl.backends.shared_library import SharedLibrary
from ocannl.backends.toolchain import (
    LINK_FLAGS, Toolchain, cache_key, check_probe, compiler_version, find_compiler, probed,
)
from ocannl.errors import BackendUnavailable, CompileError, OcannlError
from ocannl.lowlevel.indexing import IndexSymbol
from ocannl.lowlevel.tnode import TNode, sanitize_identifier

SHIM_DIR = Path(__file__).resolve().parent / "shim"
CANDIDATES = ("g++", "clang++", "c++")
BASE_FLAGS = ("-std=c++20", "-O2", "-pthread", "-fwrapv", "-ffp-contract=off", "-fno-math-errno", "-fno-builtin-powf")
SANITIZERS = {
    "address,undefined": ("-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"),
    "thread": ("-fsanitize=thread",),
}
"""The sanitizer builds: their ``-fsanitize`` flags (added to ``-O1 -g``)."""

FIX = (
    "the metal backend runs MSL on the CPU through a C++20 shim and needs g++ >= 11 or clang++ >= 14 "
    "(e.g. `apt install g++`; point OCANNL_METAL_CXX at another compiler)"
)


class SanitizerError(OcannlError):
    """A sanitizer build of a routine reported an error (the message holds the report)."""


@dataclass(frozen=True)
class ShimToolchain(Toolchain):
    """A C++ compiler for the shim and its flags; ``sanitize``: the sanitizer build it makes."""

    sanitize: str | None = None

    what: ClassVar[str] = "C++ compiler"
    language: ClassVar[str] = "c++"


def sanitize_setting() -> str | None:
    """The ``metal_sanitize`` setting: ``None``, ``"address,undefined"`` or ``"thread"``."""
    value = (config.get("metal_sanitize") or "").strip().lower().replace(" ", "")
    if value in ("", "0", "off", "no", "none"):
        return None
    if value in ("address", "undefined", "undefined,address", "asan", "ubsan"):
        value = "address,undefined"
    if value not in SANITIZERS:
        raise OcannlError(f"setting metal_sanitize must be one of {', '.join(SANITIZERS)}, got {value!r}")
    return value


def toolchain(sanitize: str | None = None) -> ShimToolchain:
    """The compiler for the current settings (the ``metal_cxx`` setting, else ``CXX``, else the
    first of :data:`CANDIDATES` on ``PATH``), probed once per process and setting (building the
    launcher checks C++20 and ``<barrier>``); :class:`BackendUnavailable` when none works."""
    settings = [("OCANNL_METAL_CXX", config.get("metal_cxx")), ("CXX", os.environ.get("CXX"))]
    command = find_compiler(settings, CANDIDATES, "C++ compiler", FIX)
    return probed("metal", command, (sanitize,), lambda: _probe(command, sanitize))


def _probe(command: tuple[str, ...], sanitize: str | None) -> ShimToolchain:
    version = compiler_version(command, "C++ compiler", FIX)
    silence = "-Wno-unknown-attributes" if "clang" in version.lower() else "-Wno-attributes"
    flags = BASE_FLAGS + (silence,)
    if sanitize:
        flags = tuple(f for f in flags if f != "-O2") + ("-O1", "-g") + SANITIZERS[sanitize]
    tc = ShimToolchain(command, shutil.which(command[0]) or command[0], version, flags, sanitize)
    try:
        support_object(tc, "launcher.cpp")
        if sanitize:
            support_object(tc, "driver.cpp")  # a sanitizer runtime cannot be loaded here: no load check
        else:
            check_probe(tc, PROBE, 13, 40, cache.directory("metal", "probes"))
    except CompileError as e:
        raise BackendUnavailable(f"{tc.name} cannot build the Metal shim: {e}; {FIX}") from None
    return tc


PROBE = """#include <atomic>
#include <barrier>
extern "C" int ocannl_probe(int x) {
  std::atomic<int> n{x};
  std::barrier<> sync(1);
  sync.arrive_and_wait();
  return 3 * n.load() + 1;
}
"""


def support_object(tc: ShimToolchain, file: str) -> Path:
    """``shim/<file>`` compiled into an object file, once per toolchain (cached)."""
    path = SHIM_DIR / file
    target = cache.directory("metal", "support") / f"{path.stem}-{cache_key(path.read_text(), tc)}.o"
    if not cache.verified(target):
        cache.build_atomically([*tc.command, *tc.flags, "-fPIC", "-c", str(path), "-o", "{tmp}"], None, target, tc.name)
    return target


def shim_text() -> str:
    """The shim's sources, part of every cache key: editing the shim rebuilds the kernels."""
    return "".join((SHIM_DIR / f).read_text() for f in ("metal_shim.hpp", "metal_stdlib", "launcher.cpp", "driver.cpp"))


def build(program: MetalProgram, tc: ShimToolchain, text: str | None = None) -> Path:
    """The routine compiled for the CPU: a shared object, or with ``tc.sanitize`` an executable
    (from the cache when already built). ``text`` replaces the program's ``.metal`` text (the
    tests mutate kernels this way); the launch plan stays the program's."""
    source = translation_unit(program, program.text if text is None else text)
    key = cache_key(source + shim_text(), tc)
    suffix = f"-{tc.sanitize.replace(',', '-')}" if tc.sanitize else ".so"
    target = cache.directory("metal") / f"{key}{suffix}"
    if cache.verified(target):
        return target
    objects = [str(support_object(tc, "launcher.cpp"))]
    if tc.sanitize:
        objects.append(str(support_object(tc, "driver.cpp")))
        link = []
    else:
        link = list(LINK_FLAGS)
    cmd = [*tc.command, *tc.flags, *link, "-I", str(SHIM_DIR), "-x", "c++", "-", "-x", "none", *objects, "-o", "{tmp}"]
    cache.build_atomically(cmd, source, target, tc.name)
    return target


def parse_only(text: str, tc: ShimToolchain) -> None:
    """Checks that ``text`` (a ``.metal`` source) parses as C++20 against the shim."""
    cmd = [*tc.command, *tc.flags, "-fsyntax-only", "-I", str(SHIM_DIR), "-x", "c++", "-"]
    result = subprocess.run(cmd, input=text, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise CompileError(f"`{shlex.join(cmd)}` failed:\n{result.stderr.strip()[:6000]}")


# ---------------------------------------------------------------------------------------------
# The host code appended to the MSL text


def translation_unit(program: MetalProgram, text: str) -> str:
    """``text`` followed by the thunks and ``ocannl_routine`` (module docstring)."""
    slots = {node: k for k, node in enumerate(program.nodes)}
    symbols = {s: k for k, s in enumerate(program.symbols)}
    name = sanitize_identifier(program.name) or "routine"
    lines = [f'#line 1 "{name}.metal"', text.rstrip("\n"), f'#line 1 "{name}.harness.cpp"',
             "/* ---- host code of the CPU harness (not MSL) ---- */",
             'extern "C" void ocannl_shim_dispatch(void (*)(void* const*, unsigned, unsigned), void* const*, unsigned,',
             "                                     unsigned, int);", ""]
    for k, kernel in enumerate(program.kernels):
        lines.append(f"static void ocannl_thunk_{k}(void* const* a, unsigned group, unsigned lane) {{")
        if kernel.argument_buffer:
            args = [f"*(const {kernel.argument_buffer}*)a[0]"]
        else:
            args = [_argument(p.kind, p.msl_type, j) for j, p in enumerate(kernel.params)]
        args += [_position(attribute, kernel) for attribute in kernel.positions]
        lines.append(f"  {kernel.name}({', '.join(args)});")
        lines.append("}")
    lines.append('static_assert(sizeof(long) == 8, "index symbol bindings are 64-bit, as MSL\'s long");')
    lines.append('extern "C" int ocannl_routine(void* const* buffers, const long* symbols) {')
    lines.append("  atomic_int status = {0};")
    for k, kernel in enumerate(program.kernels):
        lines.append(f"  {{  /* {kernel.name} */")
        if kernel.argument_buffer:
            # What a Metal host encodes: each buffer's address (a symbol's value) in its member,
            # the struct bound as the kernel's one buffer.
            members = [_member(p, slots, symbols) for p in kernel.params]
            lines.append(f"    const {kernel.argument_buffer} arguments = {{{', '.join(members)}}};")
            pointers = ["(void*)&arguments"]
        else:
            pointers = [_pointer(p, slots, symbols) for p in kernel.params]
        lines.append(f"    void* const args[] = {{{', '.join(pointers) or 'nullptr'}}};")
        lines.append(f"    ocannl_shim_dispatch(&ocannl_thunk_{k}, args, {kernel.threadgroups}u, "
                     f"{kernel.threads_per_threadgroup}u, {int(kernel.cooperative)});")
        lines.append("  }")
    lines.append("  return atomic_load_explicit(&status, memory_order_relaxed);")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _pointer(p: Param, slots: dict[TNode, int], symbols: dict[IndexSymbol, int]) -> str:
    """The address the host passes for kernel argument ``p``."""
    if p.kind == "buffer":
        return f"buffers[{slots[p.node]}]"
    if p.kind == "symbol":
        return f"(void*)&symbols[{symbols[p.symbol]}]"
    return "(void*)&status"


def _member(p: Param, slots: dict[TNode, int], symbols: dict[IndexSymbol, int]) -> str:
    """The value of ``p``'s member of an argument buffer: a typed address, or a symbol's value."""
    if p.kind == "symbol":
        return f"symbols[{symbols[p.symbol]}]"
    const = "" if p.writable else "const "
    return f"({const}{p.msl_type}*){_pointer(p, slots, symbols)}"


def _argument(kind: str, msl_type: str, j: int) -> str:
    if kind == "symbol":
        return f"*(const long*)a[{j}]"
    return f"({msl_type}*)a[{j}]"


def _position(attribute: str, kernel: Kernel) -> str:
    if attribute == "thread_position_in_grid":
        return f"uint3(group * {kernel.threads_per_threadgroup}u + lane, 0u, 0u)"
    if attribute == "threadgroup_position_in_grid":
        return "uint3(group, 0u, 0u)"
    return "uint3(lane, 0u, 0u)"


# ---------------------------------------------------------------------------------------------
# Running


class Library:
    """A routine built into a shared object, called in this process."""

    def __init__(self, path: Path):
        # The only reference to the library's code: unmapped when this object is collected.
        self._routine = SharedLibrary(path, "the C++ compiler").function(
            "ocannl_routine", ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p])
        self._no_symbols = np.zeros(1, np.int64)

    def __call__(self, addresses: ctypes.Array, symbols: np.ndarray, arrays: Sequence[np.ndarray]) -> int:
        return self._routine(addresses, (symbols if symbols.size else self._no_symbols).ctypes.data)


class SanitizedExecutable:
    """A routine built with sanitizers, run as a process of its own on copies of the buffers."""

    def __init__(self, path: Path, sanitize: str):
        self.path = path
        self.sanitize = sanitize

    def __call__(self, addresses: ctypes.Array, symbols: np.ndarray, arrays: Sequence[np.ndarray]) -> int:
        with tempfile.TemporaryDirectory(prefix="ocannl-metal-") as tmp:
            inputs, outputs = Path(tmp) / "in.bin", Path(tmp) / "out.bin"
            with open(inputs, "wb") as f:
                f.write(np.array([len(arrays), len(symbols)], np.uint32).tobytes())
                f.write(np.array([a.nbytes for a in arrays], np.uint64).tobytes())
                for a in arrays:
                    f.write(a.tobytes())
                f.write(symbols.astype(np.int64).tobytes())
            env = dict(os.environ)
            env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
            env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1")
            env.setdefault("TSAN_OPTIONS", "halt_on_error=0:exitcode=66")
            result = subprocess.run([str(self.path), str(inputs), str(outputs)], capture_output=True, text=True,
                                    env=env, timeout=600)
            if result.returncode != 0 or "Sanitizer" in result.stderr or "runtime error" in result.stderr:
                raise SanitizerError(
                    f"the {self.sanitize} build of the routine failed (exit code {result.returncode}):\n"
                    f"{result.stderr.strip()[:20000]}"
                )
            data = outputs.read_bytes()
            offset = 0
            for a in arrays:
                a.reshape(-1).view(np.uint8)[:] = np.frombuffer(data, np.uint8, a.nbytes, offset)
                offset += a.nbytes
            return int(result.stdout.strip() or 0)


def load(program: MetalProgram, tc: ShimToolchain, text: str | None = None) -> Library | SanitizedExecutable:
    path = build(program, tc, text)
    return SanitizedExecutable(path, tc.sanitize) if tc.sanitize else Library(path)

