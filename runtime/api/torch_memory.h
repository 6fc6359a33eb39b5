// The runtime's device memory for PyTorch (strata_torch_alloc / strata_torch_free through
// torch.cuda.memory.CUDAPluggableAllocator): each allocation is a strata_malloc on the device
// tier, taken through the scheduler, so that it counts against the device budget beside the
// tensors Strata moves (an allocation the budget cannot hold is NULL at once, torch's
// out-of-memory), shows in strata_get_stats (device tier, kind "other"), and the device memory
// torch holds is room the scheduler knows it cannot use. Installed by Runtime::create, removed
// before the scheduler is destroyed.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "memory/torch_allocator.h"
#include "sched/scheduler.h"

namespace strata::api {

class TorchMemory final : public memory::TorchMemorySource {
 public:
  TorchMemory(sched::Scheduler& scheduler, int ordinal)
      : scheduler_(scheduler), ordinal_(ordinal) {}
  // Gives back what torch still holds (a teardown before torch freed everything).
  ~TorchMemory() override;
  TorchMemory(const TorchMemory&) = delete;
  TorchMemory& operator=(const TorchMemory&) = delete;

  int ordinal() const override { return ordinal_; }
  Result<void*> allocate(uint64_t bytes) override;
  bool owns(const void* ptr) const override;
  uint64_t allocation_size(const void* ptr) const override;
  Status free(void* ptr, void* stream) override;

 private:
  struct Allocation {
    sched::TensorHandle handle;
    uint64_t bytes = 0;
  };
  sched::Scheduler& scheduler_;
  const int ordinal_;
  mutable std::mutex mutex_;  // guards allocations_
  std::unordered_map<const void*, Allocation> allocations_;
};

}  // namespace strata::api
