"""Zero-copy torch tensors over memory Strata handed out (an Acquisition's data pointer).

Host memory (pinned, or the device tier of the host-emulated device) becomes a CPU tensor through
numpy (np.ctypeslib.as_array, then torch.from_numpy). GPU memory (the device tier of a CUDA
runtime) becomes a CUDA tensor through __cuda_array_interface__, which torch.as_tensor reads
without copying. Either view is valid only until the acquisition is released.
"""
import ctypes

import numpy as np
import torch

from .. import _lib
from ..errors import StrataError

TORCH_TO_STRATA = {torch.float32: _lib.DTYPE_F32, torch.bfloat16: _lib.DTYPE_BF16,
                   torch.float16: _lib.DTYPE_F16, torch.int8: _lib.DTYPE_I8,
                   torch.uint8: _lib.DTYPE_U8}
STRATA_TO_TORCH = {v: k for k, v in TORCH_TO_STRATA.items()}


class _CudaMemory:
    """A borrowed range of GPU memory described the way torch.as_tensor understands."""

    def __init__(self, address, nbytes):
        self.__cuda_array_interface__ = {
            "shape": (int(nbytes),),
            "typestr": "|u1",
            "data": (int(address), False),
            "strides": None,
            "version": 2,
        }


def view(address, nbytes, dtype, shape, device, bases=None):
    """A torch tensor of dtype and shape over [address, address + nbytes), without a copy.

    bases, a list, receives the Python object torch's storage keeps alive for as long as any
    tensor over the memory lives (the numpy array; the __cuda_array_interface__ holder): a weak
    reference to it says whether a view of the memory outlives its release."""
    device = torch.device(device)
    if device.type == "cuda":
        base = _CudaMemory(address, nbytes)
        raw = torch.as_tensor(base, device=device)
    elif device.type == "cpu":
        base = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
        raw = torch.from_numpy(base)
    else:
        raise StrataError(_lib.E_UNSUPPORTED, f"no zero-copy view for device type {device.type!r}")
    if bases is not None:
        bases.append(base)
    return raw.view(dtype).view(shape)


def as_tensor(acquisition, dtype=None, shape=None, device=None, bases=None):
    """A torch tensor over an Acquisition, valid until it is released.

    device defaults to "cpu" for host memory and to the runtime's CUDA device for the device tier
    of a CUDA runtime.
    """
    tensor = acquisition.tensor
    rt = tensor.runtime
    if device is None:
        if acquisition.tier == _lib.TIER_DEVICE and not rt.device_is_host:
            device = torch.device("cuda", rt.config.device_ordinal)
        else:
            device = torch.device("cpu")
    if acquisition.ready_event:
        # This library version returns NULL (data ready on return); a later one may hand an
        # event. Waiting for the whole device is always correct, if slower.
        torch.cuda.synchronize(device)
    dtype = dtype or STRATA_TO_TORCH[tensor.dtype]
    if shape is None:
        shape = (acquisition.nbytes // torch.tensor([], dtype=dtype).element_size(),)
    return view(acquisition.data, acquisition.nbytes, dtype, shape, device, bases)


def host_numpy(t):
    """A contiguous CPU numpy array with t's bytes (bfloat16 as int16), for strata_tensor_write."""
    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy()


def storage_address(t):
    """The address of the start of t's storage (2.x untyped_storage, 1.13 storage)."""
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage().data_ptr()
    return t.storage().data_ptr()


def stream_pointer(device):
    """torch's current cudaStream_t for device, for strata_release; None on the CPU."""
    if device.type != "cuda":
        return None
    return torch.cuda.current_stream(device).cuda_stream or None
