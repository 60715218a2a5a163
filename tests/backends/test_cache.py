"""The kernel cache and the toolchains cannot be subverted: who may write the cache, what is
verified before a library is loaded, what the compiler probes accept, that libraries are unloaded
with their routines, and that a bad path is an error naming it (ocannl/backends/cache.py)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import hashlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

import ocannl as oc
import ocannl.session
from ocannl import config
from ocannl.backends import cache, toolchain
from ocannl.backends.c import compiler
from ocannl.backends.c.backend import CBackend
from ocannl.backends.cache import CacheError, CacheWarning
from ocannl.backends.metal.backend import MetalBackend
from ocannl.backends.shared_library import SharedLibrary
from ocannl.errors import BackendUnavailable, CompileError, OcannlError

HAVE_CC = CBackend().available()[0]
HAVE_METAL = MetalBackend().available()[0]
needs_cc = pytest.mark.skipif(not HAVE_CC, reason="no working C compiler here")
needs_metal = pytest.mark.skipif(not HAVE_METAL, reason="no C++20 compiler for the Metal shim here")
needs_proc_maps = pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="no /proc/self/maps here")
needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="giving a directory to another user needs root")


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """A cache of the test's own, no ``ocannl_config`` but the test's, no leftover fallback."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("OCANNL_C_FAST", "0")
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("OCANNL_METAL_CXX", raising=False)
    monkeypatch.setattr(cache, "_private_root", None)


def open_dir(path: Path, mode: int = 0o777) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(mode)
    return path


def doubled(backend: str, factor: float = 2.0) -> list[float]:
    """``x * factor`` run on a fresh session: the same factor gives the same source, the same key."""
    ocannl.session.reset()
    x = oc.tensor(np.arange(4, dtype=np.float32))
    y = x * factor
    ctx = oc.Context(backend)
    ctx.compile(y).run()
    return ctx.get(y.value).tolist()


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def kernels(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.so"))


# ---------------------------------------------------------------------------------------------
# Who may write the cache


def test_group_or_world_writable_cache_dir_is_replaced_with_a_warning(tmp_path, monkeypatch):
    unsafe = open_dir(tmp_path / "shared")
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(unsafe))
    with pytest.warns(CacheWarning, match=rf"OCANNL_CACHE_DIR, {unsafe}: is writable by other users"):
        root = cache.root()
    assert root == tmp_path / "xdg" / "ocannl"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "xdg").stat().st_mode) == 0o700  # parents made private too


PLANTED = """#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
  FILE *f = fopen("MARKER", "a");
  if (f) { fputs("planted code ran\\n", f); fclose(f); }
}
int ocannl_probe(int x) { return 3 * x + 1; }
"""


def plant_library(target: Path, marker: Path, record: str) -> None:
    """A library at cache entry ``target`` whose constructor appends to ``marker``, with a record:
    a bare digest (the format before records named their entry), or one sealed with a key other
    than this user's."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    subprocess.run([cc, "-x", "c", "-", "-shared", "-fPIC", "-o", str(target)],
                   input=PLANTED.replace("MARKER", str(marker)), text=True, check=True)
    data = target.read_bytes()
    if record == "bare digest":
        cache.record_path(target).write_text(hashlib.sha256(data).hexdigest() + "\n")
    else:
        with mock.patch.object(cache, "_secret", lambda: b"the planter's own key"):
            cache.record_path(target).write_text(cache._record(target, data))


@needs_cc
@pytest.mark.parametrize("record", ["bare digest", "sealed with another key"])
def test_a_cloned_repository_cannot_plant_code_through_its_settings_file(tmp_path, monkeypatch, record):
    """A repository carrying ``ocannl_config`` (``cache_dir=./.kcache``, and ``c_isa=portable``,
    which makes the probe's key predictable) and ``.kcache/c/probes/<key>.so`` with its record:
    compiling anything on c there runs none of it. The file's ``cache_dir`` is an error naming
    the setting and the file; and a user who points ``OCANNL_CACHE_DIR`` at the folder anyway gets
    the probes rebuilt, because their records are not sealed with this user's key."""
    repo, marker = tmp_path / "repo", tmp_path / "marker"
    kcache = repo / ".kcache"
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(kcache))
    monkeypatch.setenv("OCANNL_C_ISA", "portable")
    compiler.toolchain()  # the probe libraries at their predictable keys
    probes = kernels(kcache / "c" / "probes")
    assert probes
    for library in probes:
        plant_library(library, marker, record)
    monkeypatch.setattr(toolchain, "_verdicts", {})  # the victim's own process
    monkeypatch.delenv("OCANNL_CACHE_DIR")
    monkeypatch.delenv("OCANNL_C_ISA")
    (repo / "ocannl_config").write_text("cache_dir=./.kcache\nc_isa=portable\n")
    monkeypatch.chdir(repo)
    with pytest.raises(OcannlError, match=rf"{repo / 'ocannl_config'}:1: cache_dir chooses where the compiled "
                                          rf"code ocannl loads and runs is kept.*OCANNL_CACHE_DIR"):
        doubled("c")
    assert not marker.exists()
    (repo / "ocannl_config").write_text("c_isa=portable\n")
    monkeypatch.setenv("OCANNL_CACHE_DIR", "./.kcache")
    with pytest.warns(CacheWarning, match=r"probes/.*\.so has a record (ocannl did not write|not sealed with this "
                                          r"user's cache key).*rebuilding it"):
        assert doubled("c") == [0.0, 2.0, 4.0, 6.0]
    assert not marker.exists()


@needs_root
def test_cache_dir_of_another_user_is_refused(tmp_path, monkeypatch):
    theirs = open_dir(tmp_path / "theirs", 0o700)
    os.chown(theirs, 4242, 4242)
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(theirs))
    with pytest.warns(CacheWarning, match="belongs to another user"):
        assert cache.root() == tmp_path / "xdg" / "ocannl"


def test_an_ancestor_others_can_write_is_refused_unless_sticky(tmp_path, monkeypatch):
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(open_dir(open_dir(tmp_path / "open") / "mine", 0o700)))
    with pytest.warns(CacheWarning, match=rf"ancestor {tmp_path / 'open'} is writable by other users"):
        assert cache.root() == tmp_path / "xdg" / "ocannl"
    sticky = open_dir(tmp_path / "sticky", 0o1777)  # as /tmp: others cannot rename what is ours
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(sticky / "mine"))
    assert cache.root() == sticky / "mine"


def test_without_a_safe_directory_the_cache_is_private_to_the_process(tmp_path, monkeypatch):
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(open_dir(tmp_path / "a")))
    monkeypatch.setenv("XDG_CACHE_HOME", str(open_dir(tmp_path / "b")))
    with pytest.warns(CacheWarning) as record:
        root = cache.root()
    assert len(record) == 2
    assert root.parent == Path(tempfile.gettempdir()) and root.name.startswith("ocannl-cache-")
    assert root.stat().st_uid == os.geteuid() and stat.S_IMODE(root.stat().st_mode) == 0o700


@needs_cc
def test_nothing_is_built_in_an_unsafe_directory(tmp_path, monkeypatch):
    unsafe = open_dir(tmp_path / "shared")
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(unsafe))
    with pytest.warns(CacheWarning):
        assert doubled("c") == [0.0, 2.0, 4.0, 6.0]
    assert list(unsafe.iterdir()) == []
    assert kernels(tmp_path / "xdg" / "ocannl" / "c")
    for directory in (tmp_path / "xdg" / "ocannl" / "c", tmp_path / "xdg" / "ocannl" / "c" / "probes"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700


# ---------------------------------------------------------------------------------------------
# What is verified before loading


@needs_cc
def test_a_planted_library_is_rebuilt_not_loaded(tmp_path):
    """Another program's library under this program's key: the digest does not match."""
    c_dir = tmp_path / "cache" / "c"
    assert doubled("c", 2.0) == [0.0, 2.0, 4.0, 6.0]
    (doubling,) = kernels(c_dir)
    assert doubled("c", 3.0) == [0.0, 3.0, 6.0, 9.0]
    (tripling,) = set(kernels(c_dir)) - {doubling}
    gc.collect()  # the routines are gone, and so are their mappings: the next load reads the file
    shutil.copyfile(doubling, tripling)
    with pytest.warns(CacheWarning, match=rf"{tripling.name} does not match its recorded digest"):
        assert doubled("c", 3.0) == [0.0, 3.0, 6.0, 9.0]
    assert cache.verified(tripling)


@needs_cc
def test_an_entry_copied_with_its_record_over_another_key_is_rebuilt(tmp_path):
    """Two routines of one name (``mul_fwd``) computing different products: routine A's library
    and record copied over routine B's key give B's caller B's product, never A's."""
    c_dir = tmp_path / "cache" / "c"
    assert doubled("c", 2.0) == [0.0, 2.0, 4.0, 6.0]
    (doubling,) = kernels(c_dir)
    assert doubled("c", 3.0) == [0.0, 3.0, 6.0, 9.0]
    (tripling,) = set(kernels(c_dir)) - {doubling}
    gc.collect()
    shutil.copyfile(doubling, tripling)
    shutil.copyfile(cache.record_path(doubling), cache.record_path(tripling))
    with pytest.warns(CacheWarning, match=rf"{tripling.name} has the record of c/{doubling.name}, another entry"):
        assert doubled("c", 3.0) == [0.0, 3.0, 6.0, 9.0]
    assert cache.verified(tripling)


@needs_cc
def test_an_entry_sealed_with_another_users_key_is_rebuilt(tmp_path):
    """A record made under another secret key (another user's cache, or this user's before the
    key was made anew) does not verify: the record names the entry and its digest, and the seal
    over both is what only this user's key makes."""
    assert doubled("c") == [0.0, 2.0, 4.0, 6.0]
    (library,) = kernels(tmp_path / "cache" / "c")
    secret = tmp_path / "xdg" / "ocannl" / "secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and len(secret.read_bytes()) == 32
    gc.collect()
    secret.unlink()  # a new key: records sealed under the old one are someone else's now
    with pytest.warns(CacheWarning, match="has a record not sealed with this user's cache key"):
        assert doubled("c") == [0.0, 2.0, 4.0, 6.0]
    secret.write_bytes(b"x" * 32)
    secret.chmod(0o644)  # readable by others: not a secret, replaced
    with pytest.warns(CacheWarning, match="not sealed with this user's cache key"):  # under the new key
        with pytest.warns(CacheWarning, match=rf"secret key {secret} is not a private file.*replacing it"):
            assert not cache.verified(library)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and secret.read_bytes() != b"x" * 32


@needs_cc
@pytest.mark.parametrize("kind", ["link to /dev/zero", "fifo", "link to a verified entry", "oversized"])
def test_only_regular_files_of_bounded_size_are_read(tmp_path, kind):
    """A cache file that is a link (to ``/dev/zero``, which would be read until memory runs out,
    or to a verified entry elsewhere), a FIFO (a read would wait forever) or bigger than the limit
    is rebuilt, not read; the record stays as it was, so nothing but the file decides."""
    assert doubled("c") == [0.0, 2.0, 4.0, 6.0]
    (library,) = kernels(tmp_path / "cache" / "c")
    gc.collect()
    elsewhere = tmp_path / "cache" / "c" / "probes" / library.name
    shutil.copyfile(library, elsewhere)
    library.unlink()
    if kind == "link to /dev/zero":
        library.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(library)
    elif kind == "link to a verified entry":
        library.symlink_to(elsewhere)
    else:
        library.write_bytes(elsewhere.read_bytes())
        assert cache.verified(library)
        with pytest.warns(CacheWarning, match=r"is larger than 100 bytes.*rebuilding it"):
            assert cache.read_verified(library, limit=100) is None
        return
    reason = "is not a regular file" if kind == "fifo" else "is a symbolic link"
    with pytest.warns(CacheWarning, match=rf"{library.name} {reason}.*rebuilding it"):
        assert doubled("c") == [0.0, 2.0, 4.0, 6.0]
    assert stat.S_ISREG(library.lstat().st_mode) and cache.verified(library)


@needs_root
def test_a_cache_file_of_another_user_is_not_read(tmp_path):
    target = cache.directory("c") / "x.so"
    cache.write_verified(target, "entry")
    assert cache.verified(target)
    os.chown(target, 4242, 4242)
    with pytest.warns(CacheWarning, match=r"x\.so belongs to another user \(uid 4242\)"):
        assert not cache.verified(target)


def test_a_cache_folder_reached_through_a_link_is_refused(tmp_path):
    """``<root>/c`` a link to a private folder under a folder others can write: the root's
    ancestor check would not see that parent, so the cache's folders must be directories."""
    mine = open_dir(open_dir(tmp_path / "open") / "mine", 0o700)
    cache.root().joinpath("c").symlink_to(mine)
    with pytest.raises(CacheError, match=rf"{tmp_path / 'cache' / 'c'} is a symbolic link \(to {mine}\)"):
        cache.directory("c")


@needs_cc
def test_only_the_bytes_verified_are_loaded(tmp_path, monkeypatch):
    """A library is loaded only when it verifies, and only when its path still names the file
    verified: one that fails, or that is swapped right after its check, is a CacheError and its
    constructor never runs."""
    marker = tmp_path / "marker"
    target = cache.directory("c") / "planted.so"
    plant_library(target, marker, "sealed with another key")
    with pytest.raises(CacheError, match=r"not loading the cached .*planted\.so, which has a record not sealed "
                                         r"with this user's cache key"):
        SharedLibrary(target, "cc")
    honest = compiler.compile_shared(compiler.PROBE, compiler.toolchain())
    verified_file = cache._verified_file

    @contextlib.contextmanager
    def swapped_after_the_check(path, limit):
        with verified_file(path, limit) as checked:
            if target.exists():  # the planted library takes the verified one's place, once
                os.replace(target, path)
                os.replace(cache.record_path(target), cache.record_path(path))
            yield checked

    monkeypatch.setattr(cache, "_verified_file", swapped_after_the_check)
    with pytest.raises(CacheError, match=r"not loading the cached .*\.so, which has the record of c/planted\.so"):
        SharedLibrary(honest, "cc")  # the replacement is checked in its turn, and refused
    assert not marker.exists()


@needs_cc
def test_an_entry_another_build_replaced_right_after_its_check_is_checked_again_and_loaded(monkeypatch):
    """Two processes building one routine each rename a complete copy into place: the copy a
    process checked may be replaced before it loads it (the CI failure of concurrent runs). The
    new copy is checked and loaded; so is an entry whose record already describes the next copy
    while the previous one is still in place."""
    honest = compiler.compile_shared(compiler.PROBE, compiler.toolchain())
    verified_file = cache._verified_file
    rebuilds = []

    @contextlib.contextmanager
    def rebuilt_after_the_check(path, limit):
        with verified_file(path, limit) as checked:
            if not rebuilds:
                rebuilds.append(path)
                copy = path.with_name("copy.so")
                shutil.copyfile(path, copy)
                os.replace(copy, path)  # same bytes, a new file: what a concurrent build leaves
            yield checked

    monkeypatch.setattr(cache, "_verified_file", rebuilt_after_the_check)
    assert SharedLibrary(honest, "cc").loaded
    assert rebuilds == [honest]
    monkeypatch.setattr(cache, "_verified_file", verified_file)

    record = cache.record_path(honest)
    sealed = record.read_bytes()
    record.write_bytes(cache._record(honest, b"the next build's bytes").encode("ascii"))
    pauses = []
    # The next build's rename, as it were, lands while the loader waits to check again.
    monkeypatch.setattr(cache.time, "sleep", lambda seconds: (pauses.append(seconds), record.write_bytes(sealed)))
    assert SharedLibrary(honest, "cc").loaded
    assert pauses == [cache.RECHECK_SECONDS]


@needs_cc
@pytest.mark.parametrize("damage", ["truncated", "empty", "no digest", "binary digest", "garbage"])
def test_a_damaged_library_is_rebuilt_never_an_oserror(tmp_path, damage):
    assert doubled("c") == [0.0, 2.0, 4.0, 6.0]
    (library,) = kernels(tmp_path / "cache" / "c")
    gc.collect()
    data = library.read_bytes()
    digest = cache.record_path(library)
    if damage == "truncated":
        library.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        library.write_bytes(b"")
    elif damage == "no digest":
        digest.unlink()
    elif damage == "binary digest":
        digest.write_bytes(b"\xff\x00\xfe")
    else:
        library.write_bytes(b"\x7fELF" + bytes(range(256)) * 4)
    with pytest.warns(CacheWarning, match="rebuilding"):
        assert doubled("c") == [0.0, 2.0, 4.0, 6.0]
    gc.collect()
    with no_cache_warning():  # rebuilt as before, then a plain hit
        assert doubled("c") == [0.0, 2.0, 4.0, 6.0]
    assert library.read_bytes() == data


@contextlib.contextmanager
def no_cache_warning():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        yield
    assert not [w for w in record if issubclass(w.category, CacheWarning)], [str(w.message) for w in record]


@needs_metal
def test_a_damaged_metal_library_is_rebuilt(tmp_path):
    assert doubled("metal") == [0.0, 2.0, 4.0, 6.0]
    (library,) = kernels(tmp_path / "cache" / "metal")
    gc.collect()
    library.write_bytes(library.read_bytes()[:100])
    with pytest.warns(CacheWarning, match="does not match its recorded digest"):
        assert doubled("metal") == [0.0, 2.0, 4.0, 6.0]
    support = next((tmp_path / "cache" / "metal" / "support").glob("launcher-*.o"))
    assert cache.verified(support)


def test_a_compiler_that_writes_nothing_is_a_compile_error(tmp_path):
    target = cache.directory("c") / "x.so"
    with pytest.raises(CompileError, match="exited successfully but wrote nothing"):
        cache.build_atomically(["true", "{tmp}"], None, target, "the compiler true")
    assert not target.exists() and not cache.record_path(target).exists()
    assert not [p for p in target.parent.iterdir()]  # no temporary file left behind


@needs_cc
def test_a_native_library_is_never_loaded_on_another_cpu(tmp_path, monkeypatch):
    """Under ``c_isa=native`` the CPU's identity is part of the key: a cache shared with a machine
    of another CPU holds each machine's own library; a portable build is one library for all."""
    c_dir = tmp_path / "cache" / "c"
    built: dict[tuple[str, str], list[Path]] = {}
    for isa in ("native", "portable"):
        for cpu in ("cpu-a", "cpu-b", "cpu-a"):
            monkeypatch.setenv("OCANNL_C_ISA", isa)
            monkeypatch.setattr(compiler, "_cpu_identity", lambda cpu=cpu: cpu)
            monkeypatch.setattr(toolchain, "_verdicts", {})  # a new process on that machine
            before = set(kernels(c_dir))
            assert doubled("c") == [0.0, 2.0, 4.0, 6.0]
            built.setdefault((isa, cpu), []).extend(sorted(set(kernels(c_dir)) - before))
    monkeypatch.setenv("OCANNL_C_ISA", "native")
    if compiler.toolchain().isa == "native":  # else the compiler lacks -march=native: portable
        assert len(built["native", "cpu-a"]) == 1 and len(built["native", "cpu-b"]) == 1  # cpu-a's reused
        assert built["native", "cpu-a"] != built["native", "cpu-b"]
    assert len(built["portable", "cpu-a"]) == 1 and built["portable", "cpu-b"] == []


# ---------------------------------------------------------------------------------------------
# The toolchain probes


@needs_cc
def test_cc_true_is_refused_and_caches_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "true")
    ok, reason = CBackend().available()
    assert not ok and "the C compiler true" in reason and "wrote nothing" in reason
    with pytest.raises(BackendUnavailable, match="the C compiler true"):
        oc.Context("c").compile(oc.tensor(np.ones(2, np.float32)) * 2)
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]


@needs_metal
def test_metal_cxx_true_is_refused(monkeypatch):
    monkeypatch.setenv("OCANNL_METAL_CXX", "true")
    ok, reason = MetalBackend().available()
    assert not ok and "the C++ compiler true" in reason and "wrote nothing" in reason


@needs_cc
def test_the_probe_checks_what_its_library_computes(tmp_path, monkeypatch):
    """A "compiler" that builds some other library than the one asked for."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    monkeypatch.setenv("CC", str(script(tmp_path / "wrong-cc", (
        f'[ "$1" = --version ] && exec {cc} --version\n'
        'prev=; for arg; do [ "$prev" = -o ] && out=$arg; prev=$arg; done\n'
        f"echo 'int ocannl_probe(int x) {{ return 42; }}' | {cc} -x c - -shared -fPIC -o \"$out\"\n"
    ))))
    with pytest.raises(BackendUnavailable, match=r"computed ocannl_probe\(13\) = 42, not 40"):
        compiler.toolchain()


@needs_metal
def test_the_metal_probe_checks_what_its_library_computes(tmp_path, monkeypatch):
    """The C++ compiler of the shim is probed as the C compiler is: a compiler that builds the
    launcher but some other probe library is refused, naming what the library computed."""
    from ocannl.backends.metal import harness

    cxx = shutil.which("g++") or shutil.which("clang++")
    monkeypatch.setenv("OCANNL_METAL_CXX", str(script(tmp_path / "wrong-cxx", (
        f'case " $* " in *" --version "*|*" -c "*) exec {cxx} "$@";; esac\n'
        'prev=; for arg; do [ "$prev" = -o ] && out=$arg; prev=$arg; done\n'
        f"echo 'extern \"C\" int ocannl_probe(int x) {{ return 7; }}' | {cxx} -x c++ - -shared -fPIC -o \"$out\"\n"
    ))))
    with pytest.raises(BackendUnavailable, match=r"the C\+\+ compiler .*wrong-cxx cannot build the Metal shim: .*"
                                                 r"computed ocannl_probe\(13\) = 7, not 40"):
        harness.toolchain()
    ok, reason = MetalBackend().available()
    assert not ok and "= 7, not 40" in reason
    monkeypatch.setenv("OCANNL_METAL_CXX", "/nonexistent/c++")
    with pytest.raises(BackendUnavailable, match=r"OCANNL_METAL_CXX='/nonexistent/c\+\+' names no executable"):
        harness.toolchain()
    monkeypatch.setenv("OCANNL_METAL_CXX", cxx)  # a working compiler again: probed anew
    assert harness.toolchain().command == (cxx,)


@needs_cc
def test_a_failed_probe_is_retried_when_the_compiler_changes(tmp_path, monkeypatch):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    fake = script(tmp_path / "my-cc", 'echo "my-cc: broken" >&2\nexit 1\n')
    monkeypatch.setenv("CC", str(fake))
    with pytest.raises(BackendUnavailable, match="broken"):
        compiler.toolchain()
    with pytest.raises(BackendUnavailable, match="broken"):
        compiler.toolchain()  # the same compiler, the same answer
    script(fake, f'exec {cc} "$@"\n')  # repaired in place: same path, same setting
    assert compiler.toolchain().command == (str(fake),)
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(BackendUnavailable, match="names no executable"):
        compiler.toolchain()
    monkeypatch.setenv("CC", cc)
    assert compiler.toolchain().command == (cc,)


@needs_cc
def test_deleting_the_cache_while_compiling_rebuilds_it(tmp_path, monkeypatch):
    """The compiler deletes the whole cache on its first build: the probe and the routine's
    compile remake the directories and finish."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    root = tmp_path / "cache"
    deleter = script(tmp_path / "deleting-cc", (
        f'if [ "$1" != --version ] && [ ! -e {tmp_path}/deleted-$MARK ]; then\n'
        f"  touch {tmp_path}/deleted-$MARK; rm -rf {root}\nfi\n"
        f'exec {cc} "$@"\n'
    ))
    monkeypatch.setenv("CC", str(deleter))
    monkeypatch.setenv("MARK", "probe")
    tc = compiler.toolchain()  # the probe's first build lost its directory
    assert (tmp_path / "deleted-probe").exists()
    monkeypatch.setenv("MARK", "kernel")
    path = compiler.compile_shared("int f(void) { return 7; }\n", tc)
    assert (tmp_path / "deleted-kernel").exists() and cache.verified(path)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    with pytest.raises(CompileError) as failure:  # a real compile error stays one
        compiler.compile_shared("this is not C\n", tc)
    assert "install a C compiler" not in str(failure.value)


# ---------------------------------------------------------------------------------------------
# Unloading


def mappings(directory: Path) -> list[str]:
    """The lines of /proc/self/maps mapping a file directly under ``directory``."""
    prefix = str(directory) + "/"
    return [line for line in Path("/proc/self/maps").read_text().splitlines()
            if line.split(None, 5)[-1].startswith(prefix) and "/" not in line.split(None, 5)[-1][len(prefix):]]


def compile_and_drop(backend: str, count: int) -> None:
    x = oc.tensor(np.arange(4, dtype=np.float32))
    for k in range(count):
        y = x * float(k + 1)
        ctx = oc.Context(backend)
        ctx.compile(y).run()
        assert ctx.get(y.value)[1] == k + 1
        del ctx, y


def check_unloading(backend: str, directory: Path, count: int) -> None:
    x = oc.tensor(np.arange(4, dtype=np.float32))
    ctx = oc.Context(backend)
    kept = ctx.compile(x + 1)
    assert mappings(directory), "a live routine's library is mapped"
    del kept, ctx
    gc.collect()
    assert mappings(directory) == []
    compile_and_drop(backend, count)
    gc.collect()
    assert mappings(directory) == []
    assert len(kernels(directory)) == count + 1


@needs_cc
@needs_proc_maps
def test_a_dropped_routine_unloads_its_library(tmp_path):
    check_unloading("c", tmp_path / "cache" / "c", 6)


@pytest.mark.slow
@needs_cc
@needs_proc_maps
def test_fifty_dropped_routines_leave_no_mapping(tmp_path):
    check_unloading("c", tmp_path / "cache" / "c", 50)


@needs_metal
@needs_proc_maps
def test_a_dropped_metal_routine_unloads_its_library(tmp_path):
    check_unloading("metal", tmp_path / "cache" / "metal", 2)


@needs_cc
@needs_proc_maps
def test_a_function_keeps_its_library_loaded(tmp_path):
    tc = compiler.toolchain()
    path = compiler.compile_shared(compiler.PROBE, tc)
    library = SharedLibrary(path, "cc")
    probe = library.function("ocannl_probe", ctypes.c_int, [ctypes.c_int])
    del library
    gc.collect()
    assert probe(13) == 40 and mappings(path.parent)
    del probe
    gc.collect()
    assert mappings(path.parent) == []


# ---------------------------------------------------------------------------------------------
# Bad paths are errors naming them


@needs_cc
def test_a_cache_dir_that_cannot_be_created_names_the_path(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(tmp_path / "file" / "cache"))
    with pytest.raises(CacheError, match=rf"{tmp_path / 'file'} exists and is not a directory"):
        compiler.toolchain()
    ok, reason = CBackend().available()
    assert not ok and f"{tmp_path / 'file'} exists and is not a directory" in reason
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(tmp_path / "file"))
    with pytest.raises(BackendUnavailable, match=rf"{tmp_path / 'file'} exists and is not a directory"):
        oc.Context("c").compile(oc.tensor(np.ones(2, np.float32)) * 2)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_cache_dir_names_the_path(tmp_path, monkeypatch):
    locked = open_dir(tmp_path / "locked", 0o500)
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(locked))
    with pytest.raises(CacheError, match=rf"cannot create the kernel cache directory {locked / 'c'}"):
        cache.directory("c")


def test_a_home_that_does_not_exist_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("OCANNL_CACHE_DIR", "~ocannl-no-such-user/x")
    with pytest.raises(CacheError, match=r"cache_dir='~ocannl-no-such-user/x' \(set by OCANNL_CACHE_DIR\).*"
                                         r"'ocannl-no-such-user'"):
        cache.root()
    assert not (tmp_path / "~ocannl-no-such-user").exists()


def test_a_binary_config_file_is_an_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.delenv("OCANNL_CACHE_DIR")
    (tmp_path / "ocannl_config").write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe")
    with pytest.raises(OcannlError, match=rf"{tmp_path / 'ocannl_config'} is not a text file"):
        config.get("cache_dir")
    (tmp_path / "ocannl_config").write_bytes(b"backend=c\x00\n")
    with pytest.raises(OcannlError, match="NUL bytes"):
        config.get("backend")


@pytest.mark.parametrize("backend", ["interp", pytest.param("c", marks=needs_cc)])
def test_an_unwritable_debug_dir_is_an_error_naming_it(tmp_path, backend):
    (tmp_path / "file").write_text("not a directory")
    ctx = oc.Context(backend, debug_dir=tmp_path / "file" / "debug")
    with pytest.raises(OcannlError, match=rf"cannot write {tmp_path / 'file' / 'debug'} .*debug output of routine"):
        ctx.compile(oc.tensor(np.ones(2, np.float32)) * 2)



def test_the_triton_tuning_records_live_in_the_same_checked_cache(tmp_path, monkeypatch):
    from ocannl.backends.triton import autotune

    key = autotune.DotKey("k0", 64, 64, 64, 1, "float32", "some GPU")
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(open_dir(tmp_path / "shared")))
    with pytest.warns(CacheWarning, match="writable by other users"):
        folder = autotune.cache_path(key).parent
    assert folder == tmp_path / "xdg" / "ocannl" / "triton" / "autotune"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_settings_file_cannot_choose_a_program_to_run(tmp_path, monkeypatch):
    """A settings file in the working directory must not pick the compiler ocannl executes."""
    from ocannl import config
    from ocannl.errors import OcannlError

    (tmp_path / "ocannl_config").write_text("metal_cxx=/tmp/evil\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OcannlError, match="metal_cxx names a program to run"):
        config.get("metal_cxx")


@pytest.mark.parametrize("line, why", [
    ("debug_dir=~/.ssh", "debug_dir chooses where ocannl writes files"),
    ("cache_dir=./.kcache", "cache_dir chooses where the compiled code ocannl loads and runs is kept"),
])
def test_a_settings_file_cannot_choose_where_files_go(tmp_path, monkeypatch, line, why):
    monkeypatch.delenv("OCANNL_CACHE_DIR")
    (tmp_path / "ocannl_config").write_text(f"backend=c\n{line}\n")
    with pytest.raises(OcannlError, match=rf"ocannl_config:2: {why}, which a settings file may not choose; set "
                                          rf"OCANNL_{line.split('=')[0].upper()} in the environment"):
        oc.Context("interp")
    monkeypatch.setenv(f"OCANNL_{line.split('=')[0].upper()}", str(tmp_path / "from-env"))
    (tmp_path / "ocannl_config").write_text("backend=interp\n")
    assert config.get(line.split("=")[0]) == str(tmp_path / "from-env")  # the environment still may


@pytest.mark.parametrize("key", ["cc", "cflags", "OCANNL_BAKCEND"])
def test_an_unknown_key_in_the_settings_file_is_an_error_naming_it(tmp_path, key):
    (tmp_path / "ocannl_config").write_text(f"# mine\nbackend=interp\n{key}=-O3\n")
    with pytest.raises(OcannlError, match=rf"{tmp_path / 'ocannl_config'}:3: {key.lower().removeprefix('ocannl_')} "
                                          rf"is not an ocannl setting; the file may set backend, c_fast"):
        config.get("backend")


def test_every_setting_read_is_in_the_table():
    """Each name passed to config.get, flag or origin in the package is one of config.SETTINGS,
    so the file's keys are checked against all the settings there are; a name outside it is a
    programming error."""
    import re

    package = Path(config.__file__).parent
    read = {name for path in package.rglob("*.py")
            for name in re.findall(r"config\.(?:get|flag|origin)\(\s*[\"'](\w+)[\"']", path.read_text())}
    read |= {"metal_threads", "metal_tree_min"}  # read in a loop over their names (metal/backend.py)
    assert read <= config.SETTINGS.keys(), read - config.SETTINGS.keys()
    assert config.ENVIRONMENT_ONLY.keys() <= config.SETTINGS.keys()
    with pytest.raises(ValueError, match="'cc' is not an ocannl setting"):
        config.get("cc")


# ---------------------------------------------------------------------------------------------
# A failed write, a killed compile


@needs_cc
def test_a_full_disk_during_the_probe_is_a_cache_error_tried_again(tmp_path, monkeypatch):
    """The compiler killed by the file size limit while it writes the probe: the C backend is not
    declared broken for the process ("install a C compiler"); once writes succeed again, the next
    compile works."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    full = tmp_path / "disk-full"
    full.touch()
    monkeypatch.setenv("CC", str(script(tmp_path / "cc", f'[ -e {full} ] && ulimit -f 0\nexec {cc} "$@"\n')))
    with pytest.raises(CacheError, match=r"could not write .*\.so into the kernel cache \((File size limit exceeded|"
                                         r"the file size limit was exceeded)\).*the next compile tries again") as e:
        compiler.toolchain()
    assert "install a C compiler" not in str(e.value)
    ok, reason = CBackend().available()
    assert not ok and "could not write" in reason
    full.unlink()  # space again
    assert doubled("c") == [0.0, 2.0, 4.0, 6.0]


def test_stale_temporary_files_are_removed_when_the_cache_is_next_used(tmp_path):
    """A build killed mid-way leaves ``.<entry>.<random>.tmp``: one older than an hour goes when
    its folder is next used; a recent one (a build in progress), a link and other files stay."""
    folder = open_dir(tmp_path / "cache" / "c", 0o700)
    stale, recent, kept = folder / ".abc.so.x1y2z3w4.tmp", folder / ".def.so.abcd1234.tmp", folder / "abc.so"
    link = folder / ".link.so.00000000.tmp"
    for path in (stale, recent, kept):
        path.write_bytes(b"partial")
    link.symlink_to(kept)
    two_hours_ago = time.time() - 7200
    for path in (stale, kept):
        os.utime(path, (two_hours_ago, two_hours_ago))
    os.utime(link, (two_hours_ago, two_hours_ago), follow_symlinks=False)
    assert cache.directory("c") == folder
    assert not stale.exists() and recent.exists() and kept.exists() and link.is_symlink()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_compiler_dies_with_the_process_that_started_it(tmp_path):
    """``kill -9`` of a process that is compiling: its compiler does not run on."""
    pid_file = tmp_path / "compiler.pid"
    compiler_script = script(tmp_path / "slow-cc", f"echo $$ > {pid_file}\nexec sleep 60\n")
    builder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        from pathlib import Path
        from ocannl.backends import cache
        cache.build_atomically([{str(compiler_script)!r}, "{{tmp}}"], None, cache.directory("c") / "x.so", "slow-cc")
        """)], env=dict(os.environ, OCANNL_CACHE_DIR=str(tmp_path / "cache")))
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        compiler_pid = int(pid_file.read_text())
    finally:
        builder.kill()
        builder.wait()
    deadline = time.monotonic() + 10
    while alive(compiler_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(compiler_pid):
        os.kill(compiler_pid, signal.SIGKILL)
        pytest.fail("the compiler outlived the process that started it")


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not: it only waits for its parent to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
