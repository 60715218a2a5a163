"""The on-disk kernel cache the compiled backends share: where it lives, why what it holds can be
trusted, and the steps that add to it (README, "Kernel cache and trust").

**Where.** ``<root>/<backend>/...`` (``c``, ``c/probes``, ``metal``, ``triton``), where the root
is the ``cache_dir`` setting (``OCANNL_CACHE_DIR``, or ``cache_dir=`` in ``ocannl_config``), else
``$XDG_CACHE_HOME/ocannl``, else ``~/.cache/ocannl``.

**Who may write it.** A library in the cache is code this process will load and run, so only the
current user may be able to write there. The root and every directory of the cache must be owned
by the current user and not writable by its group or others; every ancestor of the root must be
owned by the current user or by root, and writable by nobody else unless it is sticky (as
``/tmp``). Missing directories are created with mode 0700. A configured root that fails the check
is not used: a :class:`CacheWarning` names it and the reason, and the default root is used
instead; a default root that fails is replaced, also with a warning, by a private directory made
for this process and removed at exit (pip disables its cache in the same situation). Because
nobody but the current user can write in the cache, no other user can swap a file between the
moment it is checked and the moment it is loaded.

**What is checked.** A file is built into a temporary file beside its place; the sha256 of its
bytes is written (atomically) to ``<file>.sha256``, then the file is renamed into place. A cached
file is used only when its bytes match that digest. A missing, truncated, corrupted or mismatching
entry (a crash mid-write, a full disk, a hand edit, a cache written by an older version) is
rebuilt with a :class:`CacheWarning`, never loaded. Deleting the cache, even while a compiler
writes into it, is always safe: the directories are made again and the build goes on.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shlex
import shutil
import stat
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Sequence

from ocannl import config
from ocannl.errors import BackendUnavailable, CompileError

FIX = "set OCANNL_CACHE_DIR (or cache_dir in ocannl_config) to a directory only you can write"
ATTEMPTS = 3
"""How many times a build starts over when the cache directory vanishes under it."""


class CacheError(BackendUnavailable):
    """The kernel cache cannot be used (a path that is not a directory, cannot be created or
    written, or names a home directory that does not exist): the message names the path. A
    compiled backend cannot run without its cache, hence a :class:`BackendUnavailable`."""


class CacheWarning(UserWarning):
    """The cache was not used as found: an unsafe directory replaced, or an entry rebuilt."""


_lock = threading.Lock()
_private_root: Path | None = None


def root() -> Path:
    """The cache's root directory, created and checked (module docstring): the configured one,
    else the default one, else a private directory for this process."""
    candidates = []
    configured = config.get("cache_dir")
    if configured:
        candidates.append((_configured_path(configured), f"the cache directory set by {config.origin('cache_dir')}"))
    try:
        candidates.append((_default_root(), "the default cache directory"))
    except RuntimeError as e:  # no home directory to put it in
        warnings.warn(CacheWarning(f"no default cache directory ({e}): using a private one for this process"),
                      stacklevel=2)
    for k, (path, what) in enumerate(candidates):
        instead = candidates[k + 1][1] if k + 1 < len(candidates) else "a private directory for this process"
        try:
            problem = _ancestors_problem(path) or _make_private(path)
        except CacheError as e:
            if configured and k == 0:
                raise  # a configured directory that cannot be made is the user's to fix
            warnings.warn(CacheWarning(f"{e}; using {instead}"), stacklevel=2)
            continue
        if problem is None:
            return path
        warnings.warn(CacheWarning(
            f"not using {what}, {path}: {problem}; ocannl loads no code from a directory others can write "
            f"(make it yours and private with `chmod 700 {shlex.quote(str(path))}`, or remove it); using {instead}"
        ), stacklevel=2)
    return _private_fallback()


def directory(*parts: str) -> Path:
    """``<root>/<parts...>``, each directory created (mode 0700) and checked."""
    base = root()
    path = base
    for part in parts:
        path = path / part
        problem = _make_private(path)
        if problem is not None:
            raise CacheError(f"the kernel cache directory {path} {problem}: make it private (`chmod 700 "
                             f"{shlex.quote(str(path))}`) or remove it; or {FIX}")
    return path


def digest_path(target: Path) -> Path:
    """Where the sha256 of cache file ``target`` is recorded."""
    return target.with_name(target.name + ".sha256")


def verified(target: Path) -> bool:
    """Whether ``target`` is in the cache exactly as built: its bytes match its recorded digest.
    An entry that is there but does not match is reported (:class:`CacheWarning`) and ``False``,
    so the caller rebuilds it."""
    try:
        data = target.read_bytes()
    except FileNotFoundError:
        return False
    except OSError as e:
        warnings.warn(CacheWarning(f"cannot read the cached {target} ({e.strerror}): rebuilding it"), stacklevel=2)
        return False
    try:
        recorded = digest_path(target).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        recorded = None
    if recorded == hashlib.sha256(data).hexdigest():
        return True
    reason = "has no recorded digest" if recorded is None else (
        f"does not match its recorded digest ({len(data)} bytes: truncated or corrupted)")
    warnings.warn(CacheWarning(f"the cached {target} {reason}: rebuilding it"), stacklevel=2)
    return False


def build_atomically(cmd: Sequence[str], source: str | None, target: Path, compiler: str) -> None:
    """Runs ``cmd`` (``source`` on its standard input), which writes its output where ``{tmp}``
    stands: a temporary file beside ``target``. The output's digest is recorded and the file
    renamed to ``target`` only once complete, so a concurrent process never loads a half-written
    file; concurrent builds of one entry each rename a complete file, and the last one stays.

    A compiler that fails, or exits successfully without writing anything, is a
    :class:`CompileError`; a cache directory that vanishes meanwhile is made again and the build
    starts over."""
    for _ in range(ATTEMPTS):
        if _build_once(list(cmd), source, target, compiler):
            return
        _make_private_parents(target.parent)
    raise CacheError(f"the kernel cache directory {target.parent} disappeared {ATTEMPTS} times while {compiler} "
                     f"built {target.name}: is another program deleting it? {FIX}")


def _build_once(cmd: list[str], source: str | None, target: Path, compiler: str) -> bool:
    """One attempt of :func:`build_atomically`; ``False`` when the directory was gone."""
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem[:16]}-", suffix=".tmp")
    except FileNotFoundError:
        return False
    except OSError as e:
        raise CacheError(f"cannot write in the kernel cache directory {target.parent} ({e.strerror}); {FIX}") from None
    os.close(fd)
    try:
        run = [tmp if part == "{tmp}" else part for part in cmd]
        try:
            result = subprocess.run(run, input=source, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise CompileError(f"running {compiler} failed: {e}") from None
        if not target.parent.is_dir():
            return False
        if result.returncode != 0:
            raise CompileError(
                f"`{shlex.join(run)}` failed with exit code {result.returncode}:\n{result.stderr.strip()[:6000]}"
            )
        try:
            data = Path(tmp).read_bytes()
            if not data:
                raise CompileError(f"{compiler} exited successfully but wrote nothing: `{shlex.join(run)}`")
            _write_atomically(digest_path(target), hashlib.sha256(data).hexdigest() + "\n")
            os.replace(tmp, target)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise CacheError(f"cannot write {target} into the kernel cache ({e.strerror}); {FIX}") from None
        return True
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_verified(target: Path, text: str) -> None:
    """Add a small text entry (not code: a tuned configuration) to the cache as
    :func:`build_atomically` adds a built file: its digest recorded first, then the file renamed
    into place, so :func:`verified` accepts it only once complete. ``text`` is ASCII."""
    try:
        _write_atomically(digest_path(target), hashlib.sha256(text.encode("ascii")).hexdigest() + "\n")
        _write_atomically(target, text)
    except OSError as e:
        raise CacheError(f"cannot write {target} into the kernel cache ({e.strerror}); {FIX}") from None


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem[:16]}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# ---------------------------------------------------------------------------------------------
# Where the root is, and whether a directory may hold code


def _configured_path(value: str) -> Path:
    expanded = os.path.expanduser(value)
    if expanded.startswith("~"):
        user = value[1:].split("/", 1)[0]
        raise CacheError(f"cache_dir={value!r} (set by {config.origin('cache_dir')}) names the home directory of "
                         f"{user!r}, which does not exist here: {FIX}")
    return Path(expanded).absolute()


def _default_root() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"  # a relative XDG path is ignored
    return (base / "ocannl").absolute()


def _ancestors_problem(path: Path) -> str | None:
    """Why an ancestor of ``path`` (followed through symbolic links) lets another user replace
    it, or ``None``: each must be owned by the current user or by root, and writable by nobody
    else unless sticky."""
    if _uid() is None:
        return None
    resolved = path.resolve()
    for ancestor in reversed(resolved.parents):
        try:
            info = ancestor.stat()
        except OSError:
            return None  # the rest is missing: _make_private creates it
        if info.st_uid not in (_uid(), 0):
            return f"its ancestor {ancestor} belongs to another user (uid {info.st_uid})"
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
            return f"its ancestor {ancestor} is writable by other users (mode {stat.filemode(info.st_mode)})"
    return None


def _uid() -> int | None:
    """The current user's id; ``None`` where ownership is not POSIX (Windows: no check)."""
    return os.geteuid() if hasattr(os, "geteuid") else None


def _make_private(path: Path) -> str | None:
    """Creates ``path`` and its missing parents with mode 0700; then why ``path`` may not hold
    code (another owner, writable by others), or ``None``. :class:`CacheError` when it cannot be
    created or is not a directory."""
    _make_private_parents(path)
    try:
        info = path.stat()
    except OSError as e:  # removed again meanwhile
        raise CacheError(f"cannot use the kernel cache directory {path} ({e.strerror}): {FIX}") from None
    if _uid() is None:
        return None
    if info.st_uid != _uid():
        return f"belongs to another user (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by other users (mode {stat.filemode(info.st_mode)})"
    return None


def _make_private_parents(path: Path) -> None:
    """``mkdir -p`` with mode 0700 for every directory made (``Path.mkdir`` gives the parents
    the umask's mode, often group-writable)."""
    missing = []
    probe = path
    while not probe.is_dir():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            if not directory.is_dir():
                raise CacheError(f"the kernel cache path {directory} exists and is not a directory: {FIX}") from None
        except OSError as e:
            raise CacheError(f"cannot create the kernel cache directory {directory} ({e.strerror}): {FIX}") from None


def _private_fallback() -> Path:
    """A directory of this process's own (mode 0700 under the system's temporary directory),
    removed at exit."""
    global _private_root
    with _lock:
        if _private_root is None or not _private_root.is_dir():
            _private_root = Path(tempfile.mkdtemp(prefix="ocannl-cache-"))
            atexit.register(shutil.rmtree, _private_root, ignore_errors=True)
        return _private_root
