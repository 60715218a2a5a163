"""Writing a file so that no reader ever sees half of it, and cleaning up after writers that died.

ocannl writes a file (a kernel cache entry and its record, ocannl/backends/cache.py; a
checkpoint, ocannl/checkpoint.py) by writing a temporary file beside it, then renaming that into
place. The temporary files are named ``.<file name>.<8 random characters>.tmp``
(:data:`TEMPORARY_NAME`). A process killed between the two steps (``kill -9``, a power cut)
leaves the temporary file there, where nothing would ever remove it: the next write into the
directory does (:func:`remove_stale_temporaries`), matching that exact pattern only, since the
directory may be a user's own folder.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
import time
from pathlib import Path

STALE_AFTER_S = 3600.0
"""A temporary file untouched this long belongs to no live write: a compile or a save that takes
an hour rewrites nothing for that long only if it died."""


TEMPORARY_NAME = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")
"""The names of the temporary files :func:`temporary_beside` makes (what ``tempfile.mkstemp``
makes of its prefix and suffix): the only files cleaning up may remove."""


def is_temporary(name: str) -> bool:
    """Whether ``name`` is one of the temporary files ocannl writes (:data:`TEMPORARY_NAME`)."""
    return TEMPORARY_NAME.fullmatch(name) is not None


def temporary_beside(path: Path) -> tuple[int, str]:
    """A new temporary file (mode 0600) in ``path``'s directory, to be renamed to ``path``: its
    open descriptor and its name."""
    return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:40]}.", suffix=".tmp")


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` by a file holding ``data``: written beside it, flushed to the disk, then
    renamed, so that a reader finds the old file or the new one, whole, even after a crash."""
    fd, tmp = temporary_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_stale_temporaries(directory: Path, older_than_s: float = STALE_AFTER_S) -> list[Path]:
    """Removes from ``directory`` (not below it) the temporary files (:func:`is_temporary`) that
    are regular files of the current user, last modified more than ``older_than_s`` seconds ago;
    returns them. Links and other users' files are left alone, and a file removed meanwhile or a directory that cannot be
    listed is no error: cleaning up must never stop the write that triggered it."""
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    horizon = time.time() - older_than_s
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        if not is_temporary(entry.name):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode) or (uid is not None and info.st_uid != uid) or info.st_mtime > horizon:
                continue
            os.unlink(entry.path)
        except OSError:
            continue
        removed.append(Path(entry.path))
    return removed
