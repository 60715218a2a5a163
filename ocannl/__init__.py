"""ocannl: shape-inferred tensors, reverse-mode autodiff, a two-level IR and several backends."""

from ocannl import errors
from ocannl.lowlevel.indexing import IndexSymbol

__all__ = ["errors", "IndexSymbol"]
