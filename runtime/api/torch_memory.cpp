#include "api/torch_memory.h"

#include <chrono>
#include <string>

#include "api/runtime.h"

namespace strata::api {

TorchMemory::~TorchMemory() {
  std::lock_guard lock(mutex_);
  for (auto& [ptr, a] : allocations_) {
    (void)scheduler_.release(a.handle, false);
    (void)scheduler_.unregister_tensor(a.handle);
  }
  allocations_.clear();
}

Result<void*> TorchMemory::allocate(uint64_t bytes) {
  TensorSpec spec;
  spec.name = "torch";
  spec.dtype = DType::kUInt8;
  spec.kind = TensorKind::kOther;
  sched::RegisterOptions options;
  options.bytes = bytes;
  options.allocation = true;
  options.home = Tier::kDevice;
  STRATA_ASSIGN_OR_RETURN(sched::TensorHandle handle, scheduler_.register_tensor(spec, options));
  // As strata_malloc: the memory is taken now; a budget that cannot hold it beside what never
  // leaves the device fails at once (torch then frees its cache and retries, or raises its
  // out-of-memory error); evictions and write-backs are waited for, releases are not.
  Status reserved = scheduler_.reserve(handle, Tier::kDevice, kAcquireTimeout);
  if (!reserved) {
    (void)scheduler_.unregister_tensor(handle);
    return std::move(reserved).with_context("strata_torch_alloc of " + std::to_string(bytes) +
                                            " bytes");
  }
  // Held acquired until strata_torch_free: torch owns the pointer for the allocation's life.
  Result<sched::Acquired> acquired =
      scheduler_.acquire(handle, Tier::kDevice, sched::AccessMode::kOverwrite, kAcquireTimeout);
  if (!acquired) {
    (void)scheduler_.unregister_tensor(handle);
    return std::move(acquired).take_status().with_context("strata_torch_alloc");
  }
  std::lock_guard lock(mutex_);
  allocations_[acquired->data] = {handle, bytes};
  return acquired->data;
}

bool TorchMemory::owns(const void* ptr) const {
  std::lock_guard lock(mutex_);
  return allocations_.count(ptr) != 0;
}

uint64_t TorchMemory::allocation_size(const void* ptr) const {
  std::lock_guard lock(mutex_);
  const auto it = allocations_.find(ptr);
  return it == allocations_.end() ? 0 : it->second.bytes;
}

Status TorchMemory::free(void* ptr, void* stream) {
  Allocation a;
  {
    std::lock_guard lock(mutex_);
    const auto it = allocations_.find(ptr);
    if (it == allocations_.end()) {
      return invalid_argument("strata_torch_free: not an allocation of this runtime");
    }
    a = it->second;
    allocations_.erase(it);
  }
  // The release waits for the work torch queued on `stream` before the memory is reused.
  Status released = scheduler_.release(a.handle, false, stream);
  Status unregistered = scheduler_.unregister_tensor(a.handle);
  return released.is_ok() ? unregistered : released;
}

}  // namespace strata::api
