"""The on-disk kernel cache the compiled backends share: where it lives, why what it holds can be
trusted, and the steps that add to it (README, "Kernel cache and trust").

**Where.** ``<root>/<backend>/...`` (``c``, ``c/probes``, ``metal``, ``triton/autotune``), where
the root is the ``cache_dir`` setting, else ``$XDG_CACHE_HOME/ocannl``, else ``~/.cache/ocannl``.
``cache_dir`` comes from ``OCANNL_CACHE_DIR`` only, never from an ``ocannl_config`` file
(``config.ENVIRONMENT_ONLY``): that file sits in the working directory, which may be a cloned
repository, and a repository must not choose the folder ocannl loads code from.

**Who may write it.** A library in the cache is code this process will load and run, so only the
current user may be able to write there. The root and every directory of the cache must be owned
by the current user and not writable by its group or others; every ancestor of the root must be
owned by the current user or by root, and writable by nobody else unless it is sticky (as
``/tmp``). The folders inside the root must be real directories, not links (a link would lead
out of the checked root). Missing directories are created with mode 0700. A configured root that
fails the check is not used: a :class:`CacheWarning` names it and the reason, and the default
root is used instead; a default root that fails is replaced, also with a warning, by a private
directory made for this process and removed at exit (pip disables its cache in the same
situation).

**What is checked: each entry is sealed to its key and to this user.** A file is built into a
temporary file beside its place; its *record* is written (atomically) to ``<file>.sha256``, then
the file is renamed into place. The record names the entry (its folder and file name, which hold
the entry's key: the sha256 of the source, compiler and flags), the sha256 of its bytes, and a
seal: an HMAC-SHA256 of both under a secret key of this user's. A cached file is used only when
its record names it, its bytes match the digest and the seal verifies. So an entry copied over
another key (both routines' libraries named alike), a record copied from another user's cache,
or a cache shipped inside a cloned repository does not verify: it is rebuilt with a
:class:`CacheWarning`, never loaded. So is a missing, truncated or corrupted entry (a crash
mid-write, a full disk, a hand edit, a record of an older version).

**The secret key** is 32 random bytes in ``secret`` (mode 0600) in the *default* root, made on
first use. It is not kept in a configured root: whoever supplies a cache folder (a download, a
repository) would supply its key with it. Deleting the default root makes a new key, and the
entries of other roots are rebuilt once. Where the default root cannot be used (no home
directory, an unsafe one) the key is made for the process only, with a warning: entries of
earlier processes are then rebuilt. The seal protects against files someone else prepared, not
against the user's own account: a program running as the user can read the key.

**How a file is read.** Only regular files owned by the current user are read, opened without
following links (``O_NOFOLLOW``, checked again on the open descriptor), never blocking on a
FIFO, and at most :data:`MAX_ENTRY_BYTES` long (a link to ``/dev/zero`` or a FIFO is an entry
to rebuild, not a hang or an exhausted memory). A library is loaded by its path
(:func:`loading`): it is verified from an open descriptor, which is kept open, and the path must
still name that same file (device and inode) just before it is loaded; when another build of
the same entry renamed its copy into place meanwhile, that copy is checked in turn. Between that
check and the load only a process of this user could replace the file (nobody else can write in
the cache), and ocannl's own processes only ever rename complete, sealed entries into place.

**Housekeeping.** A build killed mid-way (``kill -9``) leaves a temporary file: temporary files
older than an hour are removed when a cache folder is next used (ocannl/tempfiles.py), and the
compiler is started so that it dies with the process that started it (Linux). A compiler that
fails because a write failed (a full disk, a quota, a file size limit) is a :class:`CacheError`,
not a broken compiler: nothing is remembered, and the next compile tries again. Deleting the
cache, even while a compiler writes into it, is always safe: the directories are made again and
the build goes on.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import functools
import hashlib
import hmac
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Iterator, Sequence

from ocannl import config
from ocannl.errors import BackendUnavailable, CompileError
from ocannl.tempfiles import remove_stale_temporaries, temporary_beside, write_atomically

FIX = "set OCANNL_CACHE_DIR to a directory only you can write"
ATTEMPTS = 3
"""How many times a build starts over when the cache directory vanishes under it, and a load
checks an entry that another build of it was replacing (:func:`loading`)."""
RECHECK_SECONDS = 0.02
"""The pause before a rejected entry is checked again, times the attempt: a concurrent build
writes its record a moment before it renames its file."""
MAX_ENTRY_BYTES = 1 << 28
"""The largest cache file read (256 MiB, far above any routine's library): a bigger one is not an
entry ocannl wrote."""
RECORD_BYTES = 1024
RECORD_FORMAT = "ocannl-cache-record-1"
"""The first word of a record; records of other versions (a bare digest) do not verify."""
SECRET_FILE = "secret"
SECRET_BYTES = 32


class CacheError(BackendUnavailable):
    """The kernel cache cannot be used (a path that is not a directory, cannot be created or
    written, or names a home directory that does not exist): the message names the path. A
    compiled backend cannot run without its cache, hence a :class:`BackendUnavailable`."""


class CacheWarning(UserWarning):
    """The cache was not used as found: an unsafe directory replaced, or an entry rebuilt."""


class _Rejected(Exception):
    """A cache file that is there but must not be used; the message says why."""


_lock = threading.Lock()
_private_root: Path | None = None
_swept: set[Path] = set()
"""The cache folders whose stale temporary files this process removed."""
_process_secret = os.urandom(SECRET_BYTES)
"""The secret key where the default root cannot keep one (module docstring)."""


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
    """``<root>/<parts...>``, each directory created (mode 0700) and checked, none a link; its
    stale temporary files removed, once per process."""
    base = root()
    path = base
    for part in parts:
        path = path / part
        problem = _make_private(path, follow_links=False)
        if problem is not None:
            raise CacheError(f"the kernel cache directory {path} {problem}: make it a private directory (`chmod 700 "
                             f"{shlex.quote(str(path))}`) or remove it; or {FIX}")
    with _lock:
        sweep = path not in _swept
        _swept.add(path)
    if sweep:
        remove_stale_temporaries(path)
    return path


def record_path(target: Path) -> Path:
    """Where the record of cache file ``target`` is kept (module docstring, "What is checked")."""
    return target.with_name(target.name + ".sha256")


def verified(target: Path) -> bool:
    """Whether ``target`` is in the cache exactly as built for its key by this user (module
    docstring). An entry that is there but does not verify is reported (:class:`CacheWarning`)
    and ``False``, so the caller rebuilds it."""
    return read_verified(target) is not None


def read_verified(target: Path, limit: int = MAX_ENTRY_BYTES) -> bytes | None:
    """The bytes of ``target`` when it verifies (:func:`verified`), else ``None``: absent, or
    reported and to be rebuilt. What is returned is what was checked, read once."""
    try:
        with _verified_file(target, limit) as (data, _):
            return data
    except FileNotFoundError:
        return None
    except _Rejected as e:
        warnings.warn(CacheWarning(f"the cached {target} {e}: rebuilding it"), stacklevel=3)
        return None


@contextlib.contextmanager
def loading(target: Path) -> Iterator[None]:
    """Around code that loads cache file ``target`` by its path (``dlopen``): on entry,
    ``target`` verifies, is held open, and its path still names the file verified (module
    docstring, "How a file is read"); else a :class:`CacheError`, and the body does not run.

    Another process of this user building the same entry renames its own complete copy into
    place (:func:`build_atomically`): the path may then name a new file between the check and
    the load, or name it while its record already describes the next copy. Either is checked
    again, a few times, before it is an error; each check verifies the file that is loaded."""
    for attempt in range(1, ATTEMPTS + 1):
        with contextlib.ExitStack() as stack:
            try:
                _, checked = stack.enter_context(_verified_file(target, MAX_ENTRY_BYTES))
                now = os.lstat(target)
            except FileNotFoundError:
                raise CacheError(f"the cached {target} vanished as it was about to be loaded: is another program "
                                 f"deleting the kernel cache? {FIX}") from None
            except _Rejected as e:
                if attempt < ATTEMPTS:
                    time.sleep(RECHECK_SECONDS * attempt)
                    continue
                raise CacheError(f"not loading the cached {target}, which {e}: delete it and compile again (is "
                                 f"another program writing in the kernel cache?)") from None
            if (now.st_dev, now.st_ino) != (checked.st_dev, checked.st_ino):
                if attempt < ATTEMPTS:
                    continue
                raise CacheError(f"the cached {target} was replaced as it was about to be loaded, {ATTEMPTS} times, "
                                 f"so it is not: is another program writing in the kernel cache? {FIX}")
            yield
            return


def build_atomically(cmd: Sequence[str], source: str | None, target: Path, compiler: str) -> None:
    """Runs ``cmd`` (``source`` on its standard input), which writes its output where ``{tmp}``
    stands: a temporary file beside ``target``. The output's record is written and the file
    renamed to ``target`` only once complete, so a concurrent process never loads a half-written
    file; concurrent builds of one entry each rename a complete file, and the last one stays.

    A compiler that fails, or exits successfully without writing anything, is a
    :class:`CompileError`, unless what failed was a write (:class:`CacheError`); a cache
    directory that vanishes meanwhile is made again and the build starts over."""
    for _ in range(ATTEMPTS):
        if _build_once(list(cmd), source, target, compiler):
            return
        _make_private_parents(target.parent)
    raise CacheError(f"the kernel cache directory {target.parent} disappeared {ATTEMPTS} times while {compiler} "
                     f"built {target.name}: is another program deleting it? {FIX}")


def _build_once(cmd: list[str], source: str | None, target: Path, compiler: str) -> bool:
    """One attempt of :func:`build_atomically`; ``False`` when the directory was gone."""
    try:
        fd, tmp = temporary_beside(target)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise CacheError(f"cannot write in the kernel cache directory {target.parent} ({e.strerror}); {FIX}") from None
    os.close(fd)
    try:
        run = [tmp if part == "{tmp}" else part for part in cmd]
        try:
            result = subprocess.run(run, input=source, capture_output=True, text=True, timeout=600,
                                    **dying_with_parent())
        except (OSError, subprocess.TimeoutExpired) as e:
            raise CompileError(f"running {compiler} failed: {e}") from None
        if not target.parent.is_dir():
            return False
        if result.returncode != 0:
            failed_write = _failed_write(result)
            if failed_write is not None:
                raise CacheError(
                    f"{compiler} could not write {target.name} into the kernel cache ({failed_write}): free space in "
                    f"{target.parent} and the temporary directory, or {FIX}; the next compile tries again:\n"
                    f"{result.stderr.strip()[:2000]}")
            raise CompileError(
                f"`{shlex.join(run)}` failed with exit code {result.returncode}:\n{result.stderr.strip()[:6000]}"
            )
        try:
            data = Path(tmp).read_bytes()
            if not data:
                raise CompileError(f"{compiler} exited successfully but wrote nothing: `{shlex.join(run)}`")
            write_atomically(record_path(target), _record(target, data).encode("ascii"))
            os.replace(tmp, target)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise CacheError(f"cannot write {target} into the kernel cache ({e.strerror}); {FIX}; the next compile "
                             f"tries again") from None
        return True
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_verified(target: Path, text: str) -> None:
    """Add a small text entry (not code: a tuned configuration) to the cache as
    :func:`build_atomically` adds a built file: its record written first, then the file renamed
    into place, so :func:`verified` accepts it only once complete. ``text`` is ASCII."""
    try:
        write_atomically(record_path(target), _record(target, text.encode("ascii")).encode("ascii"))
        write_atomically(target, text.encode("ascii"))
    except OSError as e:
        raise CacheError(f"cannot write {target} into the kernel cache ({e.strerror}); {FIX}") from None


_WRITE_FAILURES = tuple(os.strerror(code) for code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)) + (
    (signal.strsignal(signal.SIGXFSZ),) if hasattr(signal, "SIGXFSZ") else ())
"""How a compiler's messages say that a write failed (the C library's words, and the signal's)."""


def _failed_write(result: subprocess.CompletedProcess) -> str | None:
    """Why the compiler of ``result`` failed, when it was a write that failed (killed by the file
    size limit, or saying a disk or quota is full); ``None`` for any other failure."""
    if hasattr(signal, "SIGXFSZ") and result.returncode == -signal.SIGXFSZ:
        return "the file size limit was exceeded"
    return next((words for words in _WRITE_FAILURES if words in result.stderr), None)


def dying_with_parent() -> dict:
    """``subprocess`` options under which a compiler is killed when the thread that started it
    dies (Linux's ``PR_SET_PDEATHSIG``): a ``kill -9`` of ocannl then leaves no compiler running
    on, writing into the cache. Elsewhere, none. The compiler driver gets the signal; the passes
    it runs (``cc1``, ``as``, ``ld``) end with their input."""
    prctl = _prctl()
    if prctl is None:
        return {}
    parent = os.getpid()

    def die_with_parent() -> None:  # in the child, between fork and exec
        prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the signal was asked for
            os._exit(1)

    return {"preexec_fn": die_with_parent}


@functools.cache
def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


# ---------------------------------------------------------------------------------------------
# Reading a cache file, and its record


def entry_name(target: Path) -> str:
    """What a record names: the entry's folder and file name (``c/<key>.so``), which hold its key;
    not the root, so a cache moved as a whole stays valid."""
    return f"{target.parent.name}/{target.name}"


def _record(target: Path, data: bytes) -> str:
    name, digest = entry_name(target), hashlib.sha256(data).hexdigest()
    return f"{RECORD_FORMAT} {name} {digest} {_seal(name, digest)}\n"


def _seal(name: str, digest: str) -> str:
    message = f"{RECORD_FORMAT}\0{name}\0{digest}".encode()
    return hmac.new(_secret(), message, hashlib.sha256).hexdigest()


@contextlib.contextmanager
def _verified_file(target: Path, limit: int) -> Iterator[tuple[bytes, os.stat_result]]:
    """``target``'s bytes and status, its file held open, when its record names it, matches its
    bytes and is sealed with this user's key; :class:`_Rejected` saying why not, or
    ``FileNotFoundError`` when it is absent."""
    with _opened(target, limit) as (data, info):
        try:
            with _opened(record_path(target), RECORD_BYTES) as (record, _):
                pass
        except FileNotFoundError:
            raise _Rejected("has no record of its digest") from None
        problem = _record_problem(entry_name(target), data, record)
        if problem is not None:
            raise _Rejected(problem)
        yield data, info


def _record_problem(name: str, data: bytes, record: bytes) -> str | None:
    try:
        words = record.decode("ascii").split()
    except UnicodeDecodeError:
        words = []
    if len(words) != 4 or words[0] != RECORD_FORMAT:
        return "has a record ocannl did not write (or an older version did)"
    _, recorded_name, recorded_digest, seal = words
    if recorded_name != name:
        return f"has the record of {recorded_name}, another entry: a file copied from another key"
    digest = hashlib.sha256(data).hexdigest()
    if recorded_digest != digest:
        return f"does not match its recorded digest ({len(data)} bytes: truncated or corrupted)"
    if not hmac.compare_digest(seal, _seal(name, digest)):
        return "has a record not sealed with this user's cache key: copied from another cache or another user's"
    return None


@contextlib.contextmanager
def _opened(path: Path, limit: int) -> Iterator[tuple[bytes, os.stat_result]]:
    """The bytes and status of ``path``, held open: a regular file of the current user, at most
    ``limit`` bytes, opened without following links or blocking (module docstring, "How a file
    is read"); :class:`_Rejected` when it is something else, ``FileNotFoundError`` when absent."""
    try:
        problem = _file_problem(os.lstat(path), path, limit)
        if problem is not None:
            raise _Rejected(problem)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as e:  # no permission; ELOOP: made a link since lstat
        raise _Rejected(f"cannot be read ({e.strerror})") from None
    try:
        info = os.fstat(fd)
        problem = _file_problem(info, path, limit)
        if problem is not None:
            raise _Rejected(problem)
        data = _read_at_most(fd, limit)
    except OSError as e:
        os.close(fd)
        raise _Rejected(f"cannot be read ({e.strerror})") from None
    except BaseException:
        os.close(fd)
        raise
    try:
        yield data, info
    finally:
        os.close(fd)


def _read_at_most(fd: int, limit: int) -> bytes:
    """The rest of ``fd``'s file; :class:`_Rejected` when that is more than ``limit`` bytes (a
    file that grew since its size was checked)."""
    chunks, size = [], 0
    while size <= limit:
        chunk = os.read(fd, min(1 << 20, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > limit:
        raise _Rejected(f"is larger than {limit} bytes")
    return b"".join(chunks)


def _file_problem(info: os.stat_result, path: Path, limit: int) -> str | None:
    """Why a file of status ``info`` is not one to read from the cache, or ``None``."""
    if stat.S_ISLNK(info.st_mode):
        return f"is a symbolic link (to {os.readlink(path)})"
    if not stat.S_ISREG(info.st_mode):
        return f"is not a regular file (mode {stat.filemode(info.st_mode)})"
    if _uid() is not None and info.st_uid != _uid():
        return f"belongs to another user (uid {info.st_uid})"
    if info.st_size > limit:
        return f"is larger than {limit} bytes ({info.st_size})"
    return None


_secret_warned = False


def _secret() -> bytes:
    """This user's key for sealing records (module docstring, "The secret key"): read from the
    default root, made there on first use; the process's own where that root cannot be used."""
    global _secret_warned
    try:
        home = _default_root()
        problem = _ancestors_problem(home) or _make_private(home)
        if problem is None:
            return _read_or_make_secret(home / SECRET_FILE)
        problem = f"{home} {problem}"
    except (RuntimeError, CacheError, OSError) as e:  # no home directory, or none that can be made
        problem = str(e)
    if not _secret_warned:
        _secret_warned = True
        warnings.warn(CacheWarning(f"no private place for the kernel cache's secret key ({problem}): using one "
                                   f"for this process, so entries other processes built are rebuilt"), stacklevel=3)
    return _process_secret


def _read_or_make_secret(path: Path) -> bytes:
    """The key in ``path``; a fresh one when there is none or it is not a private file of
    ``SECRET_BYTES`` bytes (replaced with a warning: every entry then rebuilds)."""
    for _ in range(ATTEMPTS):
        try:
            with _opened(path, SECRET_BYTES) as (key, info):
                if len(key) == SECRET_BYTES and not info.st_mode & 0o077:
                    return key
            raise _Rejected("is not a private file of 32 bytes")
        except FileNotFoundError:
            pass
        except _Rejected as e:
            warnings.warn(CacheWarning(f"the kernel cache's secret key {path} {e}: replacing it, so every cached entry "
                                       f"is rebuilt"), stacklevel=4)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        fd, tmp = temporary_beside(path)  # mode 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(SECRET_BYTES))
            with contextlib.suppress(FileExistsError):  # another process made one meanwhile: use it
                os.link(tmp, path)
        finally:
            os.unlink(tmp)
    raise OSError(f"{path} keeps changing")


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


def _make_private(path: Path, follow_links: bool = True) -> str | None:
    """Creates ``path`` and its missing parents with mode 0700; then why ``path`` may not hold
    code (another owner, writable by others; a link, unless ``follow_links``: the root may be
    one, its ancestors being checked where it leads, its folders may not), or ``None``.
    :class:`CacheError` when it cannot be created or is not a directory."""
    _make_private_parents(path)
    try:
        info = os.stat(path, follow_symlinks=follow_links)
    except OSError as e:  # removed again meanwhile
        raise CacheError(f"cannot use the kernel cache directory {path} ({e.strerror}): {FIX}") from None
    if stat.S_ISLNK(info.st_mode):
        return f"is a symbolic link (to {os.readlink(path)}), where the cache's folders must be directories"
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
