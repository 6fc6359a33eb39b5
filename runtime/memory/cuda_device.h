// The CUDA backend of the Device interface. Compiled only when STRATA_HAVE_CUDA; includes no CUDA
// header, so the rest of Strata never sees CUDA types.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "memory/device.h"

namespace strata::memory {

// GPUs the CUDA runtime can use right now; 0 when there is no driver, no GPU, or CUDA reports
// any error (probed at run time: cudart is linked statically and needs no driver to load).
int cuda_device_count();

// One cudaMalloc slab of the budget on GPU `ordinal`, a sub-allocator over it, two non-blocking
// copy streams, cudaEvents. STRATA_E_UNSUPPORTED when no usable GPU has that ordinal.
Result<std::unique_ptr<Device>> open_cuda_device(const DeviceOptions& options);

// Plain cudaMalloc / cudaFree: the PyTorch allocator entry points use them for a GPU no runtime
// serves. cuda_plain_malloc allocates on GPU `ordinal` (the one torch asked for, which need not be
// the current device; the current device is left as it was) and returns nullptr on failure,
// including an ordinal no GPU has; cuda_plain_free returns "" or CUDA's error name.
void* cuda_plain_malloc(uint64_t bytes, int ordinal);
std::string cuda_plain_free(void* ptr);

}  // namespace strata::memory
