"""opslot's `cuda` implementations: torch custom ops (`torch.ops.opslot.*`) over the CUDA kernels of
libopslot_kernels.so (kernels/ at the repository root). See docs/kernels.md.

Importing a module of this package loads the library; each op module registers its custom ops on
import. `unavailable_reason()` says why the kernels cannot run here (None when they can).
"""

from ._lib import KernelLibraryError, unavailable_reason

__all__ = ["KernelLibraryError", "unavailable_reason"]
