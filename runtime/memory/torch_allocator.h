// The binding behind strata_torch_alloc / strata_torch_free (PyTorch's pluggable allocator).
//
// Torch calls those two functions with no context pointer, so they must find "the runtime's
// device" in process-wide state: this binding is the one exception to Strata's no-global-state
// rule. A runtime installs its device when created and the binding's destructor uninstalls it,
// waiting for calls in flight; with several runtimes alive, the most recently installed serves
// allocations and frees go to whichever device owns the pointer. With none installed, the entry
// points fall back to cudaMalloc / cudaFree (CUDA builds with a usable GPU) or return NULL.
#pragma once

#include <memory>

#include "common/status.h"
#include "memory/device.h"

namespace strata::memory {

class TorchAllocatorBinding {
 public:
  // Serves torch's allocations from `device` (which must outlive the binding) until destroyed.
  static std::unique_ptr<TorchAllocatorBinding> install(Device& device);
  ~TorchAllocatorBinding();
  TorchAllocatorBinding(const TorchAllocatorBinding&) = delete;
  TorchAllocatorBinding& operator=(const TorchAllocatorBinding&) = delete;

  Device& device() const { return device_; }

 private:
  explicit TorchAllocatorBinding(Device& device) : device_(device) {}
  Device& device_;
};

// The device serving torch's allocations now, or nullptr (for tests and diagnostics).
const Device* torch_allocator_device();

}  // namespace strata::memory
