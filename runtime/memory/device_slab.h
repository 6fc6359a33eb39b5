// The budgeted part both device backends share: one slab of device memory (the budget), carved
// by a RangeAllocator, counted in the device tier. The backend owns the memory itself (a
// cudaMalloc'd range, or a memfd mapping) and hands the slab its address.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "common/status.h"
#include "memory/range_allocator.h"

namespace strata::memory {

inline constexpr uint64_t kDeviceAlignment = 256;

class DeviceSlab {
 public:
  DeviceSlab(std::byte* base, uint64_t bytes, uint32_t max_allocations, std::string device_name);
  ~DeviceSlab() = default;
  DeviceSlab(const DeviceSlab&) = delete;
  DeviceSlab& operator=(const DeviceSlab&) = delete;

  // STRATA_E_DEVICE_BUDGET with the numbers when no free range is large enough.
  Result<void*> allocate(uint64_t bytes);

  // STRATA_E_INVALID for a pointer that is not a live allocation's start.
  Status free(void* ptr);

  bool owns(const void* ptr) const {
    const auto* p = static_cast<const std::byte*>(ptr);
    return p >= base_ && p < base_ + bytes_;
  }
  // Whether [ptr, ptr + bytes) lies inside the slab.
  bool contains(const void* ptr, uint64_t bytes) const;
  uint64_t allocation_size(const void* ptr) const;
  uint64_t budget_bytes() const { return bytes_; }
  uint64_t in_use_bytes() const { return in_use_.load(std::memory_order_relaxed); }
  uint32_t live_allocations() const;
  std::byte* base() const { return base_; }

 private:
  std::byte* base_;
  uint64_t bytes_;
  std::string device_name_;
  mutable std::mutex mutex_;
  RangeAllocator ranges_;            // guarded by mutex_
  std::atomic<uint64_t> in_use_{0};  // requested bytes of live allocations
};

}  // namespace strata::memory
