// The binding behind strata_torch_alloc / strata_torch_free (PyTorch's pluggable allocator).
//
// Torch calls those two functions with no context pointer, so they must find "the runtime's
// device memory" in process-wide state: this binding is the one exception to Strata's
// no-global-state rule. A runtime installs its source when created (api/torch_memory.h: device
// memory taken through the scheduler, under the device budget, counted in the runtime's stats)
// and the binding's destructor uninstalls it, waiting for calls in flight; with several runtimes
// alive, the most recently installed serves allocations and frees go to whichever source owns
// the pointer. With none installed, the entry points fall back to cudaMalloc / cudaFree (CUDA
// builds with a usable GPU) or return NULL.
#pragma once

#include <memory>

#include "common/status.h"

namespace strata::memory {

// Device memory for torch: what a binding serves allocations from. Called from torch's threads,
// concurrently; never throws.
class TorchMemorySource {
 public:
  virtual ~TorchMemorySource() = default;
  virtual int ordinal() const = 0;  // the CUDA device (or emulated ordinal) it serves
  virtual Result<void*> allocate(uint64_t bytes) = 0;
  virtual bool owns(const void* ptr) const = 0;
  virtual uint64_t allocation_size(const void* ptr) const = 0;  // 0: unknown
  // Reuse of the memory waits for the work queued on `stream`.
  virtual Status free(void* ptr, void* stream) = 0;
};

class TorchAllocatorBinding {
 public:
  // Serves torch's allocations from `source` (which must outlive the binding) until destroyed.
  static std::unique_ptr<TorchAllocatorBinding> install(TorchMemorySource& source);
  ~TorchAllocatorBinding();
  TorchAllocatorBinding(const TorchAllocatorBinding&) = delete;
  TorchAllocatorBinding& operator=(const TorchAllocatorBinding&) = delete;

  TorchMemorySource& source() const { return source_; }

 private:
  explicit TorchAllocatorBinding(TorchMemorySource& source) : source_(source) {}
  TorchMemorySource& source_;
};

// The source serving torch's allocations now, or nullptr (for tests and diagnostics).
const TorchMemorySource* torch_allocator_source();

}  // namespace strata::memory
