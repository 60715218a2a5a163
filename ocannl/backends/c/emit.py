"""A routine as one C source file: includes, the builtins it uses, helper functions for its
register-tiled contractions and its loop nests, a function named after the routine
and its exported entry point::

    static int compose_fwd(
        const float *restrict a,
        const float *restrict b,
        float *restrict c,
        int64_t _s_batch_n) {
      ...
      return 0;
    }

Parameters: one pointer per buffer the routine touches (``const`` when it only reads it), sorted
by name, then one ``int64_t`` per static index symbol (bindings are 64-bit), sorted by name. The
function returns 0, or the number of the runtime check (:class:`~ocannl.backends.codegen.Site`)
that failed.

A contraction the CPU plan runs as a packed GEMM (ocannl/lowlevel/cpu_schedule.py) is a helper
function of its own too, calling a micro-kernel (``gemm.py``) printed once per source.

The routine's function calls one helper function per top-level loop nest, and a routine of many
nests runs them in parts, a helper function each that calls its nests' functions
(``target.py``). The helpers are ``noinline``: the C compiler
then optimizes one short function at a time, so compiling a routine takes time linear in its
length (a 200-layer MLP's training step compiles in a few seconds, not minutes; the figures are
in the README, "C compile time"). A call costs nanoseconds next to a nest's work. Helpers that
differ only in their names are printed once (``shared_helpers.py``), and a long source is
compiled as several :func:`translation_units` at the same time (``compiler.py``).

The runtime calls it through the one exported function, ``<function>_packed(void *const
*_buffers, const int64_t *_symbols)``, which passes ``_buffers[k]`` and ``_symbols[k]`` on in
parameter order (through the static ``<function>_unpacked``): one call through ctypes takes at
most 1024 arguments, and a deep network's training routine touches thousands of buffers. The
routine's function is ``static``, so that call binds to it even when a library loaded earlier
exports a function of the same name. A routine run in parts is marked ``OCANNL_CALLS_FN``
(``target.py``): it only calls its parts, and takes the two arrays itself, its calls passing
their elements (:func:`_calls_reading_arrays`).

``Routine.run_many`` runs the routine for many steps in one call, through a second exported
function, ``<function>_steps(_buffers, _steps, _n, _n_records, _record_src, _record_dst,
_record_bytes, _failed_step)``: step ``i`` calls the routine's function as the packed entry does,
with row ``i`` of the ``_n`` by ``len(symbols)`` array ``_steps`` as its bindings, then copies
each recorded buffer (``_record_bytes[r]`` bytes from ``_record_src[r]``) to ``_record_dst[r] +
i * _record_bytes[r]``. A failed check stops the loop: it returns the check's number and stores
the step in ``*_failed_step``. The loop is the n calls of ``run`` without their Python, so the
steps compute the same bits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ocannl.backends.c.gemm import GEMM_FN, GEMM_FN_DEFINITION
from ocannl.backends.c.shared_helpers import CALL, share_identical_helpers
from ocannl.backends.c.syntax import CSyntax
from ocannl.backends.c.target import (
    CALLS_FN, CALLS_FN_DEFINITION, NEST_FN, NEST_FN_DEFINITION, PART_FN, PART_FN_DEFINITION, TILE_FN,
    TILE_FN_DEFINITION, CTarget, pointer_param,
)
from ocannl.backends.codegen import Emitter, Site, comment_text
from ocannl.lowlevel.indexing import IndexSymbol
from ocannl.lowlevel.cost import timed_statements
from ocannl.lowlevel.ir import RoutineIR
from ocannl.lowlevel.identifiers import Namespace, sanitize_identifier
from ocannl.lowlevel.tnode import TNode

INCLUDES = ("math.h", "stdint.h", "string.h")

_LINKER_NAMES = frozenset(
    """memset memcpy memmove malloc calloc realloc aligned_alloc free abort exit atexit __stack_chk_fail
    omp_get_num_threads omp_get_thread_num errno""".split()
)
"""Functions the compiled code may call behind the scenes: an exported function of the same name
would take their place."""


@dataclass(frozen=True)
class CSource:
    """A routine's C source and how to call it: ``nodes`` and ``symbols`` in parameter order;
    ``entry`` takes them as two arrays, ``steps_entry`` runs many steps (see the module
    docstring)."""

    name: str
    function: str
    entry: str
    steps_entry: str
    text: str
    nodes: tuple[TNode, ...]
    symbols: tuple[IndexSymbol, ...]
    sites: tuple[Site, ...]
    profile_entry: str | None = None
    timers: int = 0


def function_name(routine_name: str) -> str:
    """The C name of a routine's function: its sanitized name, with ``_routine`` appended when
    that is reserved (ocannl/lowlevel/identifiers.py) or a function the linker may bring in."""
    return Namespace(_LINKER_NAMES).claim(sanitize_identifier(routine_name) or "routine", "routine")


def emit_c(routine: RoutineIR, *, parallel: bool = True, vector_bytes: int | None = None,
           profile: bool = False) -> CSource:
    """The C source of ``routine``; ``parallel`` allows OpenMP pragmas on big parallel loops;
    ``vector_bytes`` (the target's vector width, 0 for none) runs GEMM-class contractions as
    packed GEMMs (``gemm.py``; ``None``: as register tiles); ``profile`` times the routine's
    nests (:func:`_profile_counters`)."""
    syntax = CSyntax()
    fn = function_name(routine.name)
    target = CTarget(vector_bytes)
    emitter = Emitter(syntax, routine, function_name=fn, parallel=parallel, target=target)
    timers = len(timed_statements(routine.body)) if profile else 0
    helpers, body = share_identical_helpers(target.functions, target.body(emitter, _timer if profile else None))
    nodes = tuple(emitter.nodes)
    symbols = tuple(emitter.symbols)
    checks = bool(emitter.sites or target.functions)
    entry, steps_entry, unpacking = f"{fn}_packed", f"{fn}_steps", f"{fn}_unpacked"
    calls = _calls_reading_arrays(body, emitter) if target.in_parts else None
    if calls is not None:
        body, unpacking = calls, fn
        lines = [f"static {CALLS_FN} int {fn}(void *const *_buffers, const int64_t *_symbols) {{"]
        lines += [f"  (void){array};" for array, n in (("_buffers", nodes), ("_symbols", symbols)) if not n]
    else:
        params = [pointer_param(emitter, n) for n in nodes] + [f"int64_t {emitter.symbols[s]}" for s in symbols]
        lines = [f"static {CALLS_FN} int {fn}(" if target.in_parts else f"static int {fn}("]
        lines += [f"    {p}," for p in params[:-1]] + [f"    {params[-1]}) {{" if params else "    void) {"]
    if checks:
        lines.append("  int _status_cell = 0, *_status = &_status_cell;  /* the failed check, if any */")
    if profile:
        lines.append("  const double _t_routine = ocannl_seconds();")
    lines += body
    if profile:
        lines.append(f"  _profile[{timers}] += ocannl_seconds() - _t_routine;")
        lines.append(f"  _profile[{timers + 1}] += 1;")
    lines.append("  return _status_cell;" if checks else "  return 0;")
    lines.append("}")
    if calls is None:
        lines += ["", *_unpacking_function(unpacking, fn, len(nodes), len(symbols))]
    lines += ["", f"int {entry}(void *const *_buffers, const int64_t *_symbols) {{",
              f"  return {unpacking}(_buffers, _symbols);", "}"]
    lines += ["", *_steps_entry(steps_entry, unpacking, len(symbols))]
    profile_entry = f"{fn}_profile" if profile else None
    if profile_entry:
        lines += ["", *_profile_counters(profile_entry)]
    functions = [line for f in target.types + helpers for line in f + [""]]
    code = "\n".join(functions + lines)
    header = [f"/* {comment_text(routine.name)}: generated by ocannl from the loop IR; do not edit. */"]
    if profile:
        header += ["#define _POSIX_C_SOURCE 200809L  /* clock_gettime */", "#include <time.h>"]
    header += [f"#include <{h}>" for h in INCLUDES]
    text = "\n".join(header) + "\n\n"
    for macro, definition in ((NEST_FN, NEST_FN_DEFINITION), (TILE_FN, TILE_FN_DEFINITION),
                              (CALLS_FN, CALLS_FN_DEFINITION), (PART_FN, PART_FN_DEFINITION),
                              (GEMM_FN, GEMM_FN_DEFINITION)):
        if macro in code or (macro in (NEST_FN, CALLS_FN) and PART_FN in code):  # a part's macro names them
            text += definition + "\n\n"
    builtins = syntax.builtins()
    if builtins:
        text += "\n".join(builtins) + "\n\n"
    if profile:
        text += "\n".join(_profile_clock(timers)) + "\n\n"
    text += code + "\n"
    return CSource(routine.name, fn, entry, steps_entry, text, nodes, symbols, tuple(emitter.sites),
                   profile_entry, timers)


_GATE = "if (_status_cell) return _status_cell;"


def _calls_reading_arrays(body: list[str], emitter: Emitter) -> list[str] | None:
    """A routine's ``body`` run in parts, its calls passing each buffer as its element of
    ``_buffers`` and each index symbol as its element of ``_symbols`` (in parameter order), where
    its lines are only calls, comments and the return after a failed check (``None`` if not).

    The routine's function then takes the two arrays itself: as a function of one parameter per
    buffer, called by an unpacking function, a 12-block GPT's training routine (1649 buffers)
    took GCC 0.44 s to compile, reading the arrays 0.18 s. The body only calls, so it loses
    nothing the ``restrict`` parameters told the optimizer."""
    names = {name: f"_buffers[{k}]" for k, name in enumerate(emitter.nodes.values())}
    names.update((name, f"_symbols[{k}]") for k, name in enumerate(emitter.symbols.values()))
    out = []
    for line in body:
        text = line.lstrip()
        call = CALL.match(line)
        if call is not None:
            args = ", ".join(names.get(a, a) for a in call.group(3).split(", "))
            out.append(f"{call.group(1)}{call.group(2)}({args});")
        elif (text.startswith("/*") and text.endswith("*/")) or text.startswith(_GATE):
            out.append(line)
        else:
            return None
    return out


def _timer(k: int) -> tuple[str, str]:
    """The lines around timed statement ``k`` of a profiling build."""
    return f"const double _t{k} = ocannl_seconds();", f"_profile[{k}] += ocannl_seconds() - _t{k};"


def _profile_clock(timers: int) -> list[str]:
    """A profiling build's counters: ``_profile[k]`` the seconds of timed statement ``k``, then
    the seconds of the routine, then its number of runs; and the clock they read."""
    return [
        f"static double _profile[{timers + 2}];",
        "static double ocannl_seconds(void) {",
        "  struct timespec t;",
        "  clock_gettime(CLOCK_MONOTONIC, &t);",
        "  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;",
        "}",
    ]


def _profile_counters(name: str) -> list[str]:
    """``name(out)``: copies the counters of :func:`_profile_clock` to ``out``, then zeroes them."""
    return [
        f"void {name}(double *_out) {{",
        "  memcpy(_out, _profile, sizeof(_profile));",
        "  memset(_profile, 0, sizeof(_profile));",
        "}",
    ]


def _unpacking_function(name: str, fn: str, n_buffers: int, n_symbols: int) -> list[str]:
    """``name(buffers, symbols)``, static: calls ``fn`` with the arrays' elements as its
    arguments, an argument a line. Both entries call it: a call of thousands of arguments
    (a deep network's training routine) is printed once, since the C compiler's front end takes
    a quarter of a second over each."""
    lines = [f"static int {name}(void *const *_buffers, const int64_t *_symbols) {{"]
    lines += [f"  (void){array};" for array, n in (("_buffers", n_buffers), ("_symbols", n_symbols)) if not n]
    args = [f"_buffers[{k}]" for k in range(n_buffers)] + [f"_symbols[{k}]" for k in range(n_symbols)]
    if not args:
        return lines + [f"  return {fn}();", "}"]
    return lines + [f"  return {fn}("] + [f"      {a}," for a in args[:-1]] + [f"      {args[-1]});", "}"]


def _steps_entry(name: str, unpacking: str, n_symbols: int) -> list[str]:
    """``name(...)``: the routine run ``_n`` times through ``unpacking``
    (:func:`_unpacking_function`), each step's bindings a row of ``_steps``, the recorded buffers
    copied out after every step (see the module docstring). It calls static functions, as the
    packed entry does, never an exported name another library could provide."""
    return [
        f"int {name}(void *const *_buffers, const int64_t *_steps, int64_t _n, int64_t _n_records,",
        "    void *const *_record_src, char *const *_record_dst, const int64_t *_record_bytes,",
        "    int64_t *_failed_step) {",
        "  for (int64_t _i = 0; _i < _n; ++_i) {",
        f"    int _status = {unpacking}(_buffers, {f'_steps + _i * {n_symbols}' if n_symbols else '_steps'});",
        "    if (_status) {",
        "      *_failed_step = _i;",
        "      return _status;",
        "    }",
        "    for (int64_t _r = 0; _r < _n_records; ++_r)",
        "      memcpy(_record_dst[_r] + _i * _record_bytes[_r], _record_src[_r], (size_t)_record_bytes[_r]);",
        "  }",
        "  return 0;",
        "}",
    ]


HIDDEN = '__attribute__((visibility("hidden")))'
"""How a helper function compiled in its own translation unit is declared instead of ``static``:
seen by the library's other units, never exported, so no other library's symbol takes its place."""
_HELPER_START = re.compile(rf"^static (?={NEST_FN} |{TILE_FN} |{GEMM_FN} |{PART_FN} )", re.MULTILINE)
_ROUTINE_START = re.compile(rf"^static (?:{CALLS_FN} )?int \w+\((?:$|void \*const \*_buffers, )", re.MULTILINE)


def translation_units(text: str, count: int) -> list[str]:
    """``text``, a source of :func:`emit_c`, as about ``count`` translation units that the C
    compiler can build at the same time and link into one library computing the same: the
    helper functions spread over ``count - 1`` units of about equal length, each unit declaring
    the helpers of the others, and one unit for the routine's function and its entry points.
    Every unit repeats the source's preamble (includes, macros, builtins, vector types; the
    GEMM micro-kernels, ``static inline``, where they are printed). ``[text]`` when the source has
    fewer than two helpers to spread or ``count < 3``."""
    starts = [m.start() for m in _HELPER_START.finditer(text)]
    routine = _ROUTINE_START.search(text)
    if count < 3 or len(starts) < 2 or routine is None:
        return [text]
    spans = [(s, text.index("\n}\n", s) + 3) for s in starts]
    declarations = [text[s : text.index(") {\n", s)].replace("static ", f"{HIDDEN} ", 1) + ");\n"
                    for s, _ in spans]
    total = sum(e - s for s, e in spans)
    groups: list[list[int]] = [[]]
    size = 0
    for k, (s, e) in enumerate(spans):
        if size >= total / (count - 1) and len(groups) < count - 1:
            groups.append([])
            size = 0
        groups[-1].append(k)
        size += e - s

    def unit(defined: set[int], end: int) -> str:
        parts, at = [], 0
        for k, (s, e) in enumerate(spans):
            if s >= end:
                break
            helper = text[s:e].replace("static ", f"{HIDDEN} ", 1) if k in defined else declarations[k]
            parts += [text[at:s], helper]
            at = e
        return "".join(parts) + text[at:end]

    return [unit(set(g), routine.start()) for g in groups] + [unit(set(), len(text))]
