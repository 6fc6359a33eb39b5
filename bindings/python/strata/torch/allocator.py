"""strata.torch.use_strata_allocator: torch's CUDA tensors from Strata's device arena.

Installs libstrata.so's strata_torch_alloc / strata_torch_free as torch's CUDA allocator
(torch.cuda.memory.CUDAPluggableAllocator, torch >= 2.0). The functions serve the device of the
most recently created live Strata runtime, so activations and workspaces share its device
budget; without one they fall back to cudaMalloc / cudaFree (docs/memory.md). Must run before
the process creates its first CUDA tensor.
"""
import torch

from .. import _lib
from ..errors import StrataError


def _torch_version():
    parts = []
    for piece in torch.__version__.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def allocator_support():
    """None when use_strata_allocator can work here, else why not."""
    if _torch_version() < (2, 0) or not hasattr(torch.cuda, "memory") or \
            not hasattr(torch.cuda.memory, "CUDAPluggableAllocator"):
        return (f"torch {torch.__version__} has no torch.cuda.memory.CUDAPluggableAllocator: "
                "the Strata allocator needs torch >= 2.0")
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is built without CUDA"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False: no usable GPU"
    return None


def use_strata_allocator():
    """Makes torch allocate CUDA memory through Strata; returns the CUDAPluggableAllocator.

    Raises StrataError (STRATA_E_UNSUPPORTED) on CPU-only torch, torch < 2.0 or without a GPU,
    and (STRATA_E_STATE) when torch's CUDA allocator is already in use.
    """
    reason = allocator_support()
    if reason is not None:
        raise StrataError(_lib.E_UNSUPPORTED, "use_strata_allocator: " + reason)
    alloc = torch.cuda.memory.CUDAPluggableAllocator(_lib.path, "strata_torch_alloc",
                                                     "strata_torch_free")
    try:
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        raise StrataError(_lib.E_STATE, "use_strata_allocator must run before the first CUDA "
                                        f"tensor is created: {e}") from e
    return alloc
