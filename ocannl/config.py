"""Settings: argument > environment (``OCANNL_<NAME>``) > ``ocannl_config`` file > default.

The ``ocannl_config`` file in the working directory holds ``key=value`` lines; ``#`` starts a
comment, keys are case-insensitive and may carry the ``ocannl_`` prefix, and an empty value means
"not set" (as an empty environment variable does). Settings are read when used, so a test may
change the environment between uses.
"""

from __future__ import annotations

import os
from pathlib import Path

from ocannl.errors import OcannlError
from ocannl.lowlevel import dtypes

CONFIG_FILE = "ocannl_config"

ENVIRONMENT_ONLY = frozenset({"metal_cxx"})
"""Settings that name a program ocannl runs. A file in the working directory cannot set them: a
directory someone else prepared (a cloned repository, a shared folder) must not choose what runs
on your account. They come from the environment or an argument only (the C compiler comes from
``CC``, likewise)."""


def get(name: str, argument: str | None = None, default: str | None = None) -> str | None:
    """The value of setting ``name`` (lower case, e.g. ``"backend"``) from the first source that
    sets it: ``argument`` (when not ``None``), the environment, the config file, ``default``."""
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
                f"{path}:{lineno}: {key} names a program to run, which a settings file may not choose; "
                f"set OCANNL_{key.upper()} in the environment instead"
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
