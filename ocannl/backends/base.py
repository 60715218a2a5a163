"""The plug-in API in one import: what a backend written outside the package uses
(docs/backends.md): the protocols it keeps, how it registers, and the two helpers of
``run_many`` (``at_step``, ``run_steps``). The runtime itself is the modules beside this one:
``protocols.py``, ``registry.py``, ``bindings.py``, ``routine.py``, ``context.py`` and
``session_state.py`` (docs/compiler.md, "The runtime")."""

from ocannl.backends.bindings import at_step
from ocannl.backends.protocols import Backend, BufferOwner, Executable
from ocannl.backends.registry import register_backend, registered_backends, reload_plugins
from ocannl.backends.routine import run_steps

__all__ = ["Backend", "BufferOwner", "Executable", "at_step", "register_backend", "registered_backends",
           "reload_plugins", "run_steps"]
