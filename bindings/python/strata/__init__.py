"""Strata from Python: the tiered GPU / pinned host / NVMe memory runtime over its C API.

    import strata
    with strata.Runtime(nvme_path="/mnt/nvme") as rt:
        t = rt.register("w", nbytes=4096, dtype="f32")
        t.write(numpy_array)
        with t.acquire("pinned") as a:
            view = a.numpy()          # zero copy, valid until release

strata.torch holds the PyTorch integration (offload, AdamW, the pluggable allocator);
strata.deepspeed maps DeepSpeed-style configs onto Config.
"""
from . import _lib
from ._lib import missing_symbols
from .config import Config
from .errors import StrataError
from .runtime import Acquisition, Runtime, Tensor

__all__ = ["Acquisition", "Config", "Runtime", "StrataError", "Tensor", "library_path",
           "missing_symbols", "version"]

library_path = _lib.path


def version():
    """The loaded library's version string."""
    return _lib.strata_version().decode()


__version__ = "0.1.0"
