// strata_nf4_*: the NF4 functions of the C API (quant/nf4.h, quant/nf4_cuda.h). They need no
// runtime, so there is no handle to keep a last-error text in, and no process-wide state may hold
// one: they return the code alone. No exception crosses: a std::bad_alloc becomes
// STRATA_E_NOMEM, anything else STRATA_E_INTERNAL.
#include <strata/strata.h>

#include <new>

#include "quant/nf4.h"
#include "quant/nf4_cuda.h"

namespace {

using strata::DType;
using strata::Status;

template <typename F>
int guarded(F&& body) noexcept {
  try {
    const Status status = body();
    return status.code();
  } catch (const std::bad_alloc&) {
    return STRATA_E_NOMEM;
  } catch (...) {
    return STRATA_E_INTERNAL;
  }
}

// The dtypes NF4 converts from and to; any other value (an integer dtype, or a number outside
// the enum that a C caller can pass) maps to one nf4.h refuses.
DType float_dtype(strata_dtype dtype) {
  switch (static_cast<int>(dtype)) {
    case STRATA_DTYPE_F32:
      return DType::kFloat32;
    case STRATA_DTYPE_BF16:
      return DType::kBFloat16;
    case STRATA_DTYPE_F16:
      return DType::kFloat16;
    default:
      return DType::kInt8;
  }
}

// count elements of dtype, or 0 where count is beyond what nf4.h accepts (it reports the count).
uint64_t output_bytes(uint64_t count, DType dtype) {
  return count <= strata::quant::kNf4MaxElements ? count * strata::dtype_size(dtype) : 0;
}

}  // namespace

extern "C" {

uint64_t strata_nf4_packed_bytes(uint64_t count) {
  return strata::quant::nf4_packed_bytes(count);
}

int strata_nf4_quantize(const void* src, strata_dtype src_dtype, uint64_t count, void* dst,
                        uint64_t dst_bytes) {
  return guarded([&] {
    return strata::quant::nf4_quantize(src, float_dtype(src_dtype), count, dst, dst_bytes);
  });
}

int strata_nf4_dequantize(const void* src, uint64_t src_bytes, uint64_t count, void* dst,
                          strata_dtype dst_dtype) {
  return guarded([&] {
    const DType dtype = float_dtype(dst_dtype);
    return strata::quant::nf4_dequantize({src, src_bytes, count}, dst, output_bytes(count, dtype),
                                         dtype);
  });
}

int strata_nf4_dequantize_cuda(const void* src_device, uint64_t src_bytes, uint64_t count,
                               void* dst_device, strata_dtype dst_dtype, void* cuda_stream) {
  return guarded([&] {
    const DType dtype = float_dtype(dst_dtype);
    return strata::quant::cuda::nf4_dequantize({src_device, src_bytes, count}, dst_device,
                                               output_bytes(count, dtype), dtype, cuda_stream);
  });
}

}  // extern "C"
