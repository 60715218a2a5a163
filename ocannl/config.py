"""Settings: argument > environment (``OCANNL_<NAME>``) > ``ocannl_config`` file > default.

The ``ocannl_config`` file in the working directory holds ``key=value`` lines; ``#`` starts a
comment, keys are case-insensitive and may carry the ``ocannl_`` prefix, and an empty value means
"not set" (as an empty environment variable does). Settings are read when used, so a test may
change the environment between uses.

Every setting is named in :data:`SETTINGS`; a key the file sets that is not there (``cc=``,
``cflags=``, a typo) is an error naming the key and the file, not a silent no-op. The file lives
in the working directory, which may be a cloned repository or a shared folder, so it may only
choose how ocannl computes, never what it runs or where it reads code and writes files: the
settings of :data:`ENVIRONMENT_ONLY` are refused there (README, "Kernel cache and trust").
"""

from __future__ import annotations

import os
from pathlib import Path

from ocannl.errors import OcannlError
from ocannl.lowlevel import dtypes

CONFIG_FILE = "ocannl_config"

SETTINGS = {
    "backend": "the backend a Context uses (ocannl/backends/registry.py)",
    "debug_dir": "where compiling writes each routine's IR and code (ocannl/backends/context.py)",
    "cache_dir": "the kernel cache's root (ocannl/backends/cache.py)",
    "fast_math": "fused multiply-adds everywhere (ocannl/lowlevel/optimize.py)",
    "param_precision": "the precision of new parameters (config.param_precision)",
    "interp_mode": "the interpreter's mode (ocannl/backends/interp/interpreter.py)",
    "c_fast": "contracting multiply-adds in C (ocannl/backends/c/compiler.py)",
    "c_isa": "the target of the C kernels (ocannl/backends/c/compiler.py)",
    "c_openmp": "OpenMP in the C kernels (ocannl/backends/c/compiler.py)",
    "metal_cxx": "the C++ compiler of the Metal shim (ocannl/backends/metal/harness.py)",
    "metal_sanitize": "the Metal shim's sanitizer build (ocannl/backends/metal/harness.py)",
    "metal_threads": "threads per Metal threadgroup (ocannl/backends/metal/backend.py)",
    "metal_tree_min": "the smallest Metal reduction summed as a tree (ocannl/backends/metal/backend.py)",
    "triton_fp32_dot": "the precision of Triton float32 products (ocannl/backends/triton/__init__.py)",
    "triton_autotune": "measured Triton contraction tiles (ocannl/backends/triton/autotune.py)",
    "triton_cuda_graphs": "CUDA graphs for Triton's run_many (ocannl/backends/triton/runtime.py)",
    "profile": "time every routine's loop nests, print them at exit (ocannl/backends/profile.py)",
}
"""Every setting ocannl reads, by name (lower case, without ``OCANNL_``), and what it sets. A
setting read anywhere is named here: :func:`get` refuses other names, and the config file other
keys."""

ENVIRONMENT_ONLY = {
    "metal_cxx": "names a program to run",
    "cache_dir": "chooses where the compiled code ocannl loads and runs is kept",
    "debug_dir": "chooses where ocannl writes files",
}
"""The settings a file in the working directory cannot set, and why: a directory someone else
prepared (a cloned repository, a shared folder) must not choose what runs on your account, where
the code it loads comes from, or where files are written. They come from the environment or an
argument only (the C compiler comes from ``CC``, likewise)."""


def get(name: str, argument: str | None = None, default: str | None = None) -> str | None:
    """The value of setting ``name`` (lower case, e.g. ``"backend"``) from the first source that
    sets it: ``argument`` (when not ``None``), the environment, the config file, ``default``.
    ``name`` must be one of :data:`SETTINGS`."""
    if name not in SETTINGS:
        raise ValueError(f"{name!r} is not an ocannl setting: add it to ocannl.config.SETTINGS")
    if argument is not None:
        return argument
    env = os.environ.get(f"OCANNL_{name.upper()}")
    if env:
        return env
    return read_config_file().get(name.lower()) or default


def origin(name: str) -> str:
    """Where setting ``name`` comes from, for messages: ``OCANNL_<NAME>``, ``<name> in <file>``,
    or ``its default``."""
    if os.environ.get(f"OCANNL_{name.upper()}"):
        return f"OCANNL_{name.upper()}"
    if read_config_file().get(name.lower()):
        return f"{name.lower()} in {Path.cwd() / CONFIG_FILE}"
    return "its default"


def read_config_file(path: Path | None = None) -> dict[str, str]:
    """The settings of the config file (``./ocannl_config`` by default; none if it is absent).
    A file that cannot be read, or is not UTF-8 text, is an :class:`OcannlError` naming it."""
    path = path or Path.cwd() / CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise OcannlError(f"{path} is not a text file of key=value lines (byte {e.start} is not UTF-8): "
                          f"fix or remove it") from None
    except OSError as e:
        raise OcannlError(f"cannot read the settings file {path} ({e.strerror}): fix its permissions or remove it") from None
    if "\0" in text:
        raise OcannlError(f"{path} is not a text file of key=value lines (it holds NUL bytes): fix or remove it")
    settings: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = line.partition("=")
        key = key.strip().lower().removeprefix("ocannl_")
        if not sep or not key:
            raise OcannlError(f"{path}:{lineno}: expected a key=value line, got {raw!r}")
        if key in settings:
            raise OcannlError(f"{path}:{lineno}: {key} is set twice")
        if key in ENVIRONMENT_ONLY:
            raise OcannlError(
                f"{path}:{lineno}: {key} {ENVIRONMENT_ONLY[key]}, which a settings file may not choose; "
                f"set OCANNL_{key.upper()} in the environment instead, and remove it from the file"
            )
        if key not in SETTINGS:
            allowed = ", ".join(sorted(SETTINGS.keys() - ENVIRONMENT_ONLY.keys()))
            raise OcannlError(
                f"{path}:{lineno}: {key} is not an ocannl setting; the file may set {allowed} (compilers and "
                f"paths come from the environment: CC, OCANNL_METAL_CXX, OCANNL_CACHE_DIR, OCANNL_DEBUG_DIR)"
            )
        settings[key] = value.strip()
    return settings


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def flag(name: str, argument: bool | None = None, default: bool = False) -> bool:
    """A yes/no setting, from the same sources as :func:`get`: ``1``, ``true``, ``yes``, ``on``
    and ``0``, ``false``, ``no``, ``off`` (any case). Settings read this way: ``fast_math``
    (``OCANNL_FAST_MATH=1``: the optimizer forms fused multiply-adds, which round once instead of
    twice, so results differ from the deterministic default; ocannl/lowlevel/optimize.py),
    ``triton_autotune`` (measure Triton contraction tiles on the GPU; ocannl/backends/triton/autotune.py)
    and ``triton_cuda_graphs`` (Triton's ``run_many`` replays a CUDA graph;
    ocannl/backends/triton/runtime.py)."""
    if argument is not None:
        return bool(argument)
    value = get(name)
    if value is None:
        return default
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise OcannlError(f"setting {name} must be one of {', '.join(_TRUE + _FALSE)}, got {value!r}")


PARAM_PRECISIONS = ("float32", "float64", "float16", "bfloat16")


def param_precision(argument: str | None = None) -> dtypes.DType:
    """The precision of parameters created without ``dtype=``: setting ``param_precision``
    (``OCANNL_PARAM_PRECISION=bfloat16``), float32 by default. A float16 or bfloat16 parameter is
    stored in 16 bits while its gradient and its optimizer state are float32, so this one setting
    trains a model with 16-bit weights and float32 accumulation (docs/precisions.md). Read when
    each parameter is created, so it must be set before the model is built."""
    name = get("param_precision", argument, "float32").strip().lower()
    if name not in PARAM_PRECISIONS:
        where = "an argument" if argument is not None else origin("param_precision")
        raise dtypes.DTypeError(f"setting param_precision (from {where}) must be one of "
                                f"{', '.join(PARAM_PRECISIONS)}: parameters are floats; got {name!r}")
    return dtypes.by_name(name)
