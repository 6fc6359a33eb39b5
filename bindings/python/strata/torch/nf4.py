"""NF4 weights for QLoRA (docs/quantization.md): a frozen weight stored block-wise in 4 bits
(strata_nf4_quantize) and dequantized where torch computes (strata_nf4_dequantize on the CPU,
strata_nf4_dequantize_cuda on the GPU, the same bits either way).

strata.torch.offload(model, ..., quantize_frozen="nf4") stores every frozen nn.Linear weight
this way: NVMe holds and streams a quarter of bf16's bytes (an eighth of fp32's), and the
model computes with the dequantized weight, as QLoRA does. The weights become the quantized
ones: parameter(), state_dict() and an unfrozen weight give the dequantized values.
"""
import torch

from .. import _lib
from ..errors import StrataError
from . import _views

BLOCK_ELEMENTS = 64
_DTYPES = {torch.float32: _lib.DTYPE_F32, torch.bfloat16: _lib.DTYPE_BF16,
           torch.float16: _lib.DTYPE_F16}


def packed_bytes(count):
    """Bytes of the packed form of count elements (4 per block of 64, plus half a byte each)."""
    n = _lib.strata_nf4_packed_bytes(int(count))
    if n == 0:
        raise StrataError(_lib.E_INVALID, f"NF4 of {count} elements: count must be 1 .. 2^56")
    return n


def _fail(rc, what):
    raw = _lib.strata_strerror(rc)
    raise StrataError(rc, f"{what}: {raw.decode() if raw else rc} (docs/quantization.md)")


def quantize(t, what="tensor"):
    """The packed NF4 bytes of t (float32, bfloat16 or float16) as a CPU uint8 tensor."""
    if t.dtype not in _DTYPES:
        raise StrataError(_lib.E_INVALID, f"NF4 of {what}: dtype {t.dtype} is not float32, "
                                          "bfloat16 or float16")
    src = t.detach().to("cpu").contiguous()
    out = torch.empty(packed_bytes(src.numel()), dtype=torch.uint8)
    rc = _lib.strata_nf4_quantize(src.data_ptr(), _DTYPES[src.dtype], src.numel(),
                                  out.data_ptr(), out.numel())
    if rc != _lib.OK:
        _fail(rc, f"NF4 quantization of {what} (a NaN or infinity in it?)")
    return out


def dequantize_into(address, nbytes, out, what="tensor"):
    """Decodes the packed buffer at address (host memory for a CPU out, GPU memory for a CUDA
    out) into out, a contiguous float32 / bfloat16 / float16 tensor of the original count."""
    if out.dtype not in _DTYPES or not out.is_contiguous():
        raise StrataError(_lib.E_INVALID, f"NF4 of {what}: out must be a contiguous float32, "
                                          "bfloat16 or float16 tensor")
    if out.device.type == "cuda":
        rc = _lib.strata_nf4_dequantize_cuda(address, nbytes, out.numel(), out.data_ptr(),
                                             _DTYPES[out.dtype], _views.stream_pointer(out.device))
    else:
        rc = _lib.strata_nf4_dequantize(address, nbytes, out.numel(), out.data_ptr(),
                                        _DTYPES[out.dtype])
    if rc != _lib.OK:
        _fail(rc, f"NF4 dequantization of {what}")
    return out


def dequantize(packed, shape, dtype, what="tensor"):
    """The values of a packed CPU uint8 tensor (quantize's result) as a new CPU tensor."""
    out = torch.empty(shape, dtype=dtype)
    packed = packed.contiguous()
    return dequantize_into(packed.data_ptr(), packed.numel(), out, what)
