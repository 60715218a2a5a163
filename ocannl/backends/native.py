"""What every backend running compiled code on host arrays shares (C through ctypes, Metal's
CPU shim): the check that an array can stand for a node, and the translation of a kernel's
failure status into the project's errors.

Generated code reports a failed check (an index out of range, an integer division by zero) by
returning ``k > 0``, the number of the *site* the emitter recorded for it (codegen.py's
``Emitter.site``; a failed allocation of working memory is reported the same way); the message was written at compile time, so it names the tensor and the
statement without the kernel carrying strings.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ocannl.errors import IntegerDivisionError, KernelMemoryError, OutOfBoundsError
from ocannl.lowlevel.ir import RoutineIR
from ocannl.lowlevel.tnode import TNode


def buffer_address(node: TNode, size: int, array: np.ndarray, routine: RoutineIR) -> int:
    """The address of ``array``'s data, after checking that it holds ``node`` as generated code
    reads it: ``size`` cells of the node's storage type, C-contiguous, writable if the routine
    writes the node."""
    if array.dtype != node.dtype.storage or array.size != size or not array.flags.c_contiguous:
        raise ValueError(
            f"the buffer of {node.debug_name} must be a C-contiguous {node.dtype.storage} array "
            f"of {size} elements, got {array.dtype} {array.shape}"
        )
    if not array.flags.writeable and node in routine.writes:
        raise ValueError(f"the buffer of {node.debug_name} is read-only but routine {routine.name} writes it")
    return array.__array_interface__["data"][0]


def raise_for_status(status: int, sites: Sequence) -> None:
    """Raise the error of failure site ``status`` (1-based); nothing for 0."""
    if not status:
        return
    site = sites[status - 1]
    if site.kind == "division":
        raise IntegerDivisionError(site.message)
    if site.kind == "memory":
        raise KernelMemoryError(site.message)
    raise OutOfBoundsError(site.message)
