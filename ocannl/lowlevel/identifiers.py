"""Identifiers of generated code, and the text its comments may carry.

Generated sources are compiled or executed: C (``cc``), MSL (the Metal compiler, or C++20 against
the CPU shim) and Python (the Triton module, run by ``exec``). A label or an index symbol's name is
the user's text, so it reaches generated source only through this module:

* :func:`sanitize_identifier` turns any text into a base name ``[A-Za-z0-9_]`` (accents and
  compatibility characters fold to their ASCII letters: ``ñ`` to ``n``, ``ⅰ`` to ``i``);
* :func:`is_reserved` says whether a name would mean something else in one of the targets: a
  keyword of Python, C, C++ or MSL, a Python builtin, a macro or function of the C and Metal
  headers the sources include, a name the emitters themselves generate or call (``i0``,
  ``XBLOCK``, ``tl``, ``ocannl_index``...), or a keyword argument of a Triton launch;
* :class:`Namespace` hands out names of one scope: a reserved or taken name is renamed, and the
  renamed name is checked again, so every name it gives is unique in the scope and reserved nowhere;
* :func:`string_literal` spells any text as an ASCII Python string literal, and
  :func:`comment_text` makes any text safe inside a C/MSL ``/* */`` comment, a Python ``#``
  comment and a Python ``\"\"\"`` docstring: one line of printable ASCII without quotes,
  backslashes or comment delimiters.

Names are ASCII, so two names are the same identifier exactly when they are the same string (Python
compares identifiers after NFKC normalization; the folding above happens before uniqueness is
checked, so ``ⅰ`` and ``i`` are seen to collide). One reserved set serves every target: a node's
name is printed in IRs and used by every backend, so it must be valid in all of them.
"""

from __future__ import annotations

import itertools
import keyword
import re
import unicodedata
from typing import Iterable, Iterator

_PYTHON = (
    keyword.kwlist
    + keyword.softkwlist
    + ["type", "self", "cls"]
    # The builtins (Python 3.13's, written out so that names do not change with the Python
    # version): generated Python calls range, min, max, float, int..., and reserving them all
    # keeps a node from shadowing one an emitter starts calling later. Then the modules that
    # generated Python has imported.
    + """
    ArithmeticError AssertionError AttributeError BaseException BaseExceptionGroup BlockingIOError
    BrokenPipeError BufferError BytesWarning ChildProcessError ConnectionAbortedError
    ConnectionError ConnectionRefusedError ConnectionResetError DeprecationWarning EOFError
    Ellipsis EncodingWarning EnvironmentError Exception ExceptionGroup FileExistsError
    FileNotFoundError FloatingPointError FutureWarning GeneratorExit IOError ImportError
    ImportWarning IndentationError IndexError InterruptedError IsADirectoryError KeyError
    KeyboardInterrupt LookupError MemoryError ModuleNotFoundError NameError NotADirectoryError
    NotImplemented NotImplementedError OSError OverflowError PendingDeprecationWarning
    PermissionError ProcessLookupError PythonFinalizationError RecursionError ReferenceError
    ResourceWarning RuntimeError RuntimeWarning StopAsyncIteration StopIteration SyntaxError
    SyntaxWarning SystemError SystemExit TabError TimeoutError TypeError UnboundLocalError
    UnicodeDecodeError UnicodeEncodeError UnicodeError UnicodeTranslateError UnicodeWarning
    UserWarning ValueError Warning ZeroDivisionError abs aiter all anext any ascii bin bool
    breakpoint bytearray bytes callable chr classmethod compile complex copyright credits delattr
    dict dir divmod enumerate eval exec exit filter float format frozenset getattr globals hasattr
    hash help hex id input int isinstance issubclass iter len license list locals map max
    memoryview min next object oct open ord pow print property quit range repr reversed round set
    setattr slice sorted staticmethod str sum super tuple vars zip
    math np numpy torch
    """.split()
)

_C_AND_CPP = """
    auto break case char const continue default do double else enum extern float for goto if
    inline int long register restrict return short signed sizeof static struct switch typedef
    union unsigned void volatile while bool true false nullptr constexpr static_assert
    thread_local typeof typeof_unqual alignas alignof noreturn asm fortran complex imaginary
    catch class decltype delete explicit export friend mutable namespace new noexcept operator
    private protected public template this throw try typeid typename using virtual wchar_t
    char8_t char16_t char32_t const_cast dynamic_cast reinterpret_cast static_cast
    concept requires consteval constinit co_await co_return co_yield import module final override
    and and_eq bitand bitor compl not not_eq or or_eq xor xor_eq
    int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t intptr_t uintptr_t intmax_t
    uintmax_t size_t ssize_t ptrdiff_t max_align_t nullptr_t wint_t float_t double_t
    NULL EOF errno assert offsetof unix linux i386 main
    memset memcpy memmove memcmp memchr strlen strcpy strncpy strcat strncat strcmp strncmp strchr
    strrchr strstr strtok strerror strdup strndup malloc calloc realloc free abort exit atexit
    quick_exit qsort bsearch printf fprintf sprintf snprintf puts putchar stdin stdout stderr
    std
    """.split()
"""C23 and C++20 keywords (MSL is C++), the alternative operator spellings, the integer types,
and the library names a generated function might call or the Metal shim poisons."""

_MATH_FUNCTIONS = """
    acos acosh asin asinh atan atan2 atanh cbrt ceil copysign cos cosh erf erfc exp exp2 expm1
    fabs fdim floor fma fmax fmin fmod frexp hypot ilogb ldexp lgamma llrint llround log log10
    log1p log2 logb lrint lround modf nan nearbyint nextafter nexttoward pow remainder remquo
    rint round scalbln scalbn sin sinh sqrt tan tanh tgamma trunc exp10 sincos
    """.split()
"""The standard functions of ``math.h`` (and ``exp10``, ``sincos``, which Metal has too); each
also comes with ``f`` and ``l`` suffixes. A parameter of that name would hide the function from
the code that calls it."""

_MACROS = """
    INFINITY NAN HUGE HUGE_VAL HUGE_VALF HUGE_VALL MAXFLOAT DOMAIN SING OVERFLOW UNDERFLOW TLOSS
    PLOSS EDOM ERANGE EILSEQ FLT_MAX FLT_MIN DBL_MAX DBL_MIN M_PI M_PI_2 M_PI_4 M_1_PI M_2_PI
    M_2_SQRTPI M_E M_LN10 M_LN2 M_LOG10E M_LOG2E M_SQRT1_2 M_SQRT2 M_PI_F M_PI_H
    fpclassify isfinite isgreater isgreaterequal isinf isless islessequal islessgreater isnan
    isnormal isunordered signbit math_errhandling
    """.split()
"""Macros of ``math.h`` (glibc, macOS, Metal) and ``float.h``. Every name in capitals with an
underscore (``INT32_MIN``, ``FP_NAN``, ``FLT_EPSILON``...) is treated as a macro too, see
:func:`is_reserved`."""

_METAL = """
    kernel vertex fragment device constant thread threadgroup threadgroup_imageblock ray_data
    object_data visible stitchable intersection mesh object half bfloat uint ushort uchar ulong
    metal precise fast simd vec array packed_float3 sampler texture1d texture2d texture3d
    texturecube depth2d atomic atomic_int atomic_uint atomic_bool atomic_float memory_order
    memory_order_relaxed mem_flags mem_none mem_device mem_threadgroup mem_texture
    threadgroup_barrier simdgroup_barrier atomic_store_explicit atomic_load_explicit
    atomic_exchange_explicit atomic_fetch_add_explicit atomic_fetch_sub_explicit
    atomic_fetch_max_explicit atomic_fetch_min_explicit atomic_compare_exchange_weak_explicit
    as_type select clamp mix saturate sign smoothstep step fract rsqrt powr pown divide exp10
    cospi sinpi tanpi fmax3 fmin3 fmedian3 max3 min3 median3 absdiff addsat subsat clz ctz popcount
    extract_bits insert_bits hadd rhadd mad24 madhi madsat mul24 mulhi reverse_bits rotate
    cross distance distance_squared dot faceforward length length_squared normalize reflect
    refract isordered abs min max all any
    gid lid tid
    """.split()
"""MSL's keywords, attributes, types and the standard library functions (metal_stdlib and the
CPU shim), and the thread position parameters the Metal emitter declares."""

_METAL_VECTORS = [
    f"{scalar}{n}" for scalar in ("bool", "char", "uchar", "short", "ushort", "int", "uint", "long", "ulong", "half",
                                  "float", "bfloat")
    for n in (2, 3, 4)
] + [f"{scalar}{r}x{c}" for scalar in ("half", "float") for r in (2, 3, 4) for c in (2, 3, 4)]

_TRITON = """
    triton tl launch buffers symbols error FP_FUSION XBLOCK RBLOCK BLOCK_M BLOCK_N BLOCK_K GROUP_M
    tanh pow threefry4x32 uint4x32_of uint4x32_pack uniform1_float32 uniform1_float64 bfloat16_bits
    bfloat16_round product os NATIVE_BF16_DOT
    grid warmup stream num_warps num_ctas num_stages warp_size maxnreg ptx_version ptx_options
    ir_override enable_fp_fusion enable_reflect_ftz launch_cooperative_grid launch_pdl clc
    supported_fp8_dtypes deprecated_fp8_dot_operand_dtypes default_dot_input_precision
    allowed_dot_input_precisions max_num_imprecise_acc_default extern_libs debug backend_name
    sanitize_overflow arch instrumentation_mode fpsan_homomorphic_casts min_shared_mem
    waves_per_eu matrix_instr_nonkdim kpack allow_flush_denorm schedule_hint llvm_fn_attrs
    wgp_cu_mode do_not_specialize
    """.split()
"""Names of the generated Triton module (its imports, ``launch`` and its arguments, the
``tl.constexpr`` tile sizes, the device functions of tlib.py) and the keyword arguments a
Triton launch takes for itself (a kernel parameter of that name could not be passed)."""

RESERVED: frozenset[str] = frozenset(
    _PYTHON
    + _C_AND_CPP
    + [f"{f}{suffix}" for f in _MATH_FUNCTIONS for suffix in ("", "f", "l")]
    + _MACROS
    + _METAL
    + _METAL_VECTORS
    + _TRITON
)
"""Names no generated identifier may take, in any target (module docstring)."""

RESERVED_PREFIXES = ("ocannl", "omp_", "gomp", "kmp_")
"""Prefixes (compared in lower case) of the runtime's own helpers (``ocannl_index``,
``ocannl_relu_f32``...) and of OpenMP's functions."""

_GENERATED = re.compile(r"[iv][0-9]+")
"""``i0``, ``v3``: the loop indices and locals that printers and emitters number."""

_MACRO_LIKE = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]*)+")
"""Capitals with an underscore: how headers spell their macros (``INT32_MIN``, ``FP_ZERO``)."""

MAX_BASE_LENGTH = 48
"""Longest base :func:`sanitize_identifier` returns; renaming adds a suffix."""


def sanitize_identifier(text: str) -> str:
    """``text`` as the base of an identifier: compatibility characters and accents folded to
    ASCII (NFKD), every run of other characters or underscores one ``_``, no leading or trailing
    underscore (C and C++ reserve names starting with ``_`` or holding ``__``), at most
    :data:`MAX_BASE_LENGTH` characters; a leading digit gets the prefix ``n_``. May be empty, and
    may be reserved: :class:`Namespace` makes it a name."""
    folded = "".join(ch for ch in unicodedata.normalize("NFKD", text) if not unicodedata.combining(ch))
    base = re.sub(r"[^A-Za-z0-9]+", "_", folded).strip("_")[:MAX_BASE_LENGTH].rstrip("_")
    return f"n_{base}" if base[:1].isdigit() else base


def is_reserved(name: str) -> bool:
    """Whether ``name`` means something in one of the targets or is one the emitters generate
    (module docstring); such a name is never given to a node or symbol."""
    return (
        name in RESERVED
        or _GENERATED.fullmatch(name) is not None
        or _MACRO_LIKE.fullmatch(name) is not None
        or name.lower().startswith(RESERVED_PREFIXES)
    )


def is_identifier(name: str) -> bool:
    """Whether ``name`` is a plain ASCII identifier: what every name of generated code is."""
    return re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name) is not None and "__" not in name


class Namespace:
    """The names of one scope of generated code (a session's nodes, a function's parameters).

    :meth:`claim` returns its base when that is free, else the base with a suffix; every
    candidate is checked again (``M_PI`` renamed ``M_PI_2`` would be a macro again), so each name
    it returns is unique in the scope and reserved nowhere. ``prefixes`` adds the scope's own
    reserved prefixes (its helper functions') to :data:`RESERVED_PREFIXES`.
    """

    def __init__(self, taken: Iterable[str] = (), prefixes: Iterable[str] = ()):
        self.taken: set[str] = set(taken)
        self.prefixes = RESERVED_PREFIXES + tuple(p.lower() for p in prefixes)

    def claim(self, base: str, tag: str | int | None = None) -> str:
        """A name of this scope for ``base`` (a :func:`sanitize_identifier` result, not empty):
        ``base`` itself, else ``base_<tag>``, else ``base_<tag>_1``, ``base_<tag>_2``... (without
        a tag: ``base_1``, ``base_2``...). A candidate of a reserved *form*, which no suffix
        could repair, is respelled first: capitals with an underscore (a macro's form) in lower
        case, a reserved prefix behind ``n_``."""
        assert is_identifier(base), f"not a sanitized identifier: {base!r}"
        for candidate in _candidates(base, tag):
            name = self._outside_reserved_forms(candidate)
            if name not in self.taken and name not in RESERVED and not _GENERATED.fullmatch(name):
                self.taken.add(name)
                return name
        raise AssertionError("unreachable: the candidates are endless")

    def _outside_reserved_forms(self, name: str) -> str:
        if _MACRO_LIKE.fullmatch(name):
            name = name.lower()
        while name.lower().startswith(self.prefixes):
            name = f"n_{name}"
        return name


def _candidates(base: str, tag: str | int | None) -> Iterator[str]:
    yield base
    if tag is None:
        yield from (f"{base}_{k}" for k in itertools.count(1))
    else:
        yield f"{base}_{tag}"
        yield from (f"{base}_{tag}_{k}" for k in itertools.count(1))


def comment_text(text: str) -> str:
    """``text`` as one line safe in every comment of generated code: a C or MSL ``/* */``
    comment, a Python ``#`` comment or a ``\"\"\"`` docstring. Characters outside printable
    ASCII become ``?``, double quotes single ones, backslashes ``/``, whitespace one space, and
    ``/*`` or ``*/`` get a space between their characters; nothing can close the comment,
    start an escape or break the line."""
    out = "".join(ch if " " <= ch <= "~" else ("?" if not ch.isspace() else " ") for ch in text)
    out = out.replace('"', "'").replace("\\", "/")
    while "*/" in out or "/*" in out:
        out = out.replace("*/", "* /").replace("/*", "/ *")
    return " ".join(out.split())


def string_literal(text: str) -> str:
    """``text`` as a double-quoted Python string literal in printable ASCII that evaluates to
    ``text`` exactly (the Triton launcher looks index symbols up by the user's name): quotes and
    backslashes escaped, every other character outside printable ASCII as a ``\\x``, ``\\u``
    or ``\\U`` escape of its code point."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    out.append('"')
    return "".join(out)
