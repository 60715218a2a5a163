"""The backend registry: which backends a context can be made on, and which one
:meth:`~ocannl.backends.context.Context.auto` picks (docs/backends.md, "Registering a backend").

ocannl's own backends are registered as an installed plug-in is, from an entry point (a name and
a ``module:object`` target) imported on first use: importing ocannl imports no backend, and none
of them is special here. What a plug-in's factory carries as attributes (``preference``,
``options``) the built-ins declare in :data:`BUILT_IN_BACKENDS`, so that listing them imports
nothing (the Triton backend imports torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable

from ocannl.backends.protocols import Backend
from ocannl.errors import BackendUnavailable, OcannlError

ENTRY_POINT_GROUP = "ocannl.backends"


@dataclass(frozen=True)
class _Registration:
    factory: Callable[..., Backend]
    preference: int
    options: tuple[str, ...] = ()


_registry: dict[str, _Registration] = {}
_plugin_errors: dict[str, str] = {}
"""Backend name -> why its plug-in failed to load (said when someone asks for it)."""
_plugins_loaded = False


def register_backend(name: str, factory: Callable[..., Backend], *, preference: int = 0,
                     options: tuple[str, ...] = ()) -> None:
    """Make backend ``name`` selectable; :meth:`~ocannl.backends.context.Context.auto` picks the
    available backend of highest ``preference`` (interp has 0; the built-in ones order triton > c
    > interp). ``options`` are the keyword arguments ``factory`` takes (``Context(name, option=...)``)."""
    _registry[name] = _Registration(factory, preference, options)


BUILT_IN_BACKENDS: tuple[tuple[EntryPoint, int, tuple[str, ...]], ...] = (
    (EntryPoint("interp", "ocannl.backends.interp:InterpBackend", ENTRY_POINT_GROUP), 0, ("interp_mode",)),
    (EntryPoint("c", "ocannl.backends.c:CBackend", ENTRY_POINT_GROUP), 10, ()),
    (EntryPoint("triton", "ocannl.backends.triton:TritonBackend", ENTRY_POINT_GROUP), 20, ()),
    # Emulated (MSL run on the CPU through a C++ shim): never a default.
    (EntryPoint("metal", "ocannl.backends.metal:MetalBackend", ENTRY_POINT_GROUP), -1, ()),
)
"""The backends ocannl ships: each one's entry point, preference and options."""


def _loaded_on_first_call(entry_point: EntryPoint) -> Callable[..., Backend]:
    """A factory for ``entry_point``'s backend that imports the backend's module when first called."""

    def factory(**options: Any) -> Backend:
        return entry_point.load()(**options)

    return factory


def _register_built_ins() -> None:
    for entry_point, preference, options in BUILT_IN_BACKENDS:
        register_backend(entry_point.name, _loaded_on_first_call(entry_point), preference=preference,
                         options=options)


_register_built_ins()


def _load_plugins() -> None:
    """Register the backends of installed distributions, once, on first need: each entry point
    of the ``ocannl.backends`` group names a backend and a factory (a callable returning the
    backend, taking the keyword arguments listed in its ``options`` attribute, if any; its
    ``preference`` attribute, default -1, ranks it for ``Context.auto``). Loading is lazy so
    that importing ocannl never imports a plugin; a plugin that fails to load is remembered and
    named when someone asks for it, and the other backends stay usable."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _registry:
            continue  # built-in names and explicit registrations win
        try:
            factory = ep.load()
        except Exception as exc:  # noqa: BLE001 - any import failure makes the plugin unusable
            _plugin_errors[ep.name] = (f"plugin entry point {ep.name} = {ep.value!r} failed to load: "
                                       f"{type(exc).__name__}: {exc}")
            continue
        register_backend(ep.name, factory, preference=getattr(factory, "preference", -1),
                         options=tuple(getattr(factory, "options", ())))


def reload_plugins() -> None:
    """Look at the installed entry points again (after installing a plugin in a running process)."""
    global _plugins_loaded
    _plugins_loaded = False
    _plugin_errors.clear()
    _load_plugins()


def registered_backends() -> tuple[str, ...]:
    """Backend names, most preferred first (plugins included)."""
    _load_plugins()
    return tuple(sorted(_registry, key=lambda n: -_registry[n].preference))


def get_backend(name: str, **options: Any) -> Backend:
    """A fresh instance of backend ``name`` made with ``options``; :class:`BackendUnavailable`
    if it cannot run here."""
    if name not in _registry:
        _load_plugins()
    if name in _plugin_errors:
        raise BackendUnavailable(f"backend {name!r} is unusable: {_plugin_errors[name]}")
    if name not in _registry:
        raise BackendUnavailable(
            f"unknown backend {name!r}; known backends: {', '.join(registered_backends())}"
        )
    registration = _registry[name]
    unknown = sorted(set(options) - set(registration.options))
    if unknown:
        accepted = ", ".join(registration.options) or "none"
        raise OcannlError(f"backend {name!r} has no option {', '.join(unknown)} (its options: {accepted})")
    backend = registration.factory(**options)
    ok, reason = backend.available()
    if not ok:
        raise BackendUnavailable(f"backend {name!r} cannot run here: {reason}")
    return backend


def availability(name: str) -> tuple[bool, str]:
    """Whether registered backend ``name`` can run here, and the backend's sentence saying why
    (or why not); a backend whose check itself fails is reported unavailable, naming the error
    (``python -m ocannl doctor``)."""
    try:
        return _registry[name].factory().available()
    except Exception as e:  # noqa: BLE001 - a probe that fails makes the backend unavailable, not the caller fail
        return False, f"its availability check failed: {type(e).__name__}: {e}"


def best_available() -> str:
    """The most preferred backend that runs here and is not emulated."""
    for name in registered_backends():
        backend = _registry[name].factory()
        if backend.available()[0] and not getattr(backend, "emulated", False):
            return name
    raise BackendUnavailable("no backend can run here")
