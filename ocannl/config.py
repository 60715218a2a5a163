"""Settings: argument > environment (``OCANNL_<NAME>``) > ``ocannl_config`` file > default.

The ``ocannl_config`` file in the working directory holds ``key=value`` lines; ``#`` starts a
comment, keys are case-insensitive and may carry the ``ocannl_`` prefix, and an empty value means
"not set" (as an empty environment variable does). See spec/backend.md §8.7 for the original's
richer scheme; settings are read when used, so a test may change the environment between uses.
"""

from __future__ import annotations

import os
from pathlib import Path

from ocannl.errors import OcannlError

CONFIG_FILE = "ocannl_config"


def get(name: str, argument: str | None = None, default: str | None = None) -> str | None:
    """The value of setting ``name`` (lower case, e.g. ``"backend"``) from the first source that
    sets it: ``argument`` (when not ``None``), the environment, the config file, ``default``."""
    if argument is not None:
        return argument
    env = os.environ.get(f"OCANNL_{name.upper()}")
    if env:
        return env
    return read_config_file().get(name.lower()) or default


def read_config_file(path: Path | None = None) -> dict[str, str]:
    """The settings of the config file (``./ocannl_config`` by default; none if it is absent)."""
    path = path or Path.cwd() / CONFIG_FILE
    if not path.is_file():
        return {}
    settings: dict[str, str] = {}
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = line.partition("=")
        key = key.strip().lower().removeprefix("ocannl_")
        if not sep or not key:
            raise OcannlError(f"{path}:{lineno}: expected a key=value line, got {raw!r}")
        if key in settings:
            raise OcannlError(f"{path}:{lineno}: {key} is set twice")
        settings[key] = value.strip()
    return settings


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def flag(name: str, argument: bool | None = None, default: bool = False) -> bool:
    """A yes/no setting, from the same sources as :func:`get`: ``1``, ``true``, ``yes``, ``on``
    and ``0``, ``false``, ``no``, ``off`` (any case). Settings read this way: ``fast_math``
    (``OCANNL_FAST_MATH=1``: the optimizer forms fused multiply-adds, which round once instead of
    twice, so results differ from the deterministic default; ocannl/lowlevel/optimize.py)."""
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
