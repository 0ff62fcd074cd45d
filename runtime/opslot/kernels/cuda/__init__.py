"""opslot's `cuda` implementations: torch ops (`torch.ops.opslot.*`) registered from C++ by
libopslot_torch.so (kernels/torch/) over the CUDA kernels of libopslot_kernels.so (kernels/ at the
repository root). See docs/kernels.md, "The boundary".

Importing an op module of this package loads both libraries on a CUDA machine (on a CPU machine the
ops' Meta kernels still work). `unavailable_reason()` says why the kernels cannot run here (None
when they can).
"""

from ._lib import KernelLibraryError, unavailable_reason

__all__ = ["KernelLibraryError", "unavailable_reason"]
