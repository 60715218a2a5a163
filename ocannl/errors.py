"""The exception types users see.

Every error raised on purpose by ocannl derives from :class:`OcannlError`, so a user can catch the
whole family at once. Messages are written for the user who made the mistake: they name the
operation, the shapes involved and, where there is one, the fix.
"""

from __future__ import annotations


class OcannlError(Exception):
    """Base class of every error ocannl raises on purpose."""


class EinsumSyntaxError(OcannlError, ValueError):
    """A malformed einsum or shape spec.

    ``position`` is the 0-based offset of the offending character in ``spec`` (``len(spec)`` when
    the spec ended too early). The message shows the spec with a caret under that character.
    """

    def __init__(self, spec: str, position: int, expected: str):
        self.spec = spec
        self.position = position
        self.expected = expected
        caret = " " * position + "^"
        super().__init__(f"invalid einsum spec: {expected}\n  {spec}\n  {caret}")


class ShapeError(OcannlError):
    """Shape inference failed: the shapes of an operation's operands cannot be reconciled,
    or a dimension could not be determined."""


class SessionError(OcannlError):
    """The tensor graph was used in a way that cannot be compiled (e.g. forwarding a parameter)."""


class BackendUnavailable(OcannlError):
    """A backend cannot run on this machine: the message says why and how to fix it."""


class IndexBindingError(OcannlError):
    """A routine was run with a missing or out-of-range index symbol binding."""


class OutOfBoundsError(OcannlError):
    """A buffer access outside the buffer's dims (reported by the interpreter with the IR location)."""


class IntegerDivisionError(OcannlError, ZeroDivisionError):
    """An integer division or remainder by zero while a routine ran (``oc.div`` of integer
    tensors), reported on every backend with the routine and the statement it is in; floats
    divide by zero to infinities or NaN instead (docs/precisions.md, "Integer arithmetic")."""


class KernelMemoryError(OcannlError, MemoryError):
    """Compiled code could not allocate the working memory it needs (the C backend's packing
    buffers of a matrix product): the message names the product and the size."""


class CompileError(OcannlError):
    """A compiler rejected a generated source, or did not produce a loadable library (a bug in
    ocannl, or a broken toolchain: the message holds the command and the compiler's output)."""


class CheckpointError(OcannlError):
    """A checkpoint file does not fit the tensors it is loaded into (a name missing or left
    over, other dims, another precision), or the tensors to save cannot be named uniquely."""
