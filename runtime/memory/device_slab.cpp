#include "memory/device_slab.h"

#include "common/align.h"
#include "common/assert.h"
#include "common/units.h"

namespace strata::memory {

DeviceSlab::DeviceSlab(std::byte* base, uint64_t bytes, uint32_t max_allocations,
                       std::string device_name)
    : base_(base),
      bytes_(bytes),
      device_name_(std::move(device_name)),
      ranges_(bytes, kDeviceAlignment, max_allocations) {
  STRATA_ASSERT(is_aligned(base, kDeviceAlignment));
}

Result<void*> DeviceSlab::allocate(uint64_t bytes) {
  if (bytes == 0) return invalid_argument("device allocation of 0 bytes");
  std::optional<uint64_t> offset;
  uint64_t largest_free = 0;
  uint32_t live = 0;
  {
    std::lock_guard lock(mutex_);
    offset = ranges_.allocate(bytes, /*tag=*/bytes);  // the tag keeps the size asked for
    if (!offset) {
      largest_free = ranges_.largest_free_range();
      live = ranges_.allocations();
    }
  }
  if (!offset) {
    const uint64_t in_use = in_use_bytes();
    std::string why = live >= ranges_.max_allocations()
                          ? "the limit of " + std::to_string(live) + " live allocations is reached"
                          : "largest free range " + format_bytes(largest_free);
    return Status::error(
        STRATA_E_DEVICE_BUDGET,
        device_name_ + ": device budget exceeded: asked " + format_bytes(bytes) + " (" +
            std::to_string(bytes) + " B), in use " + format_bytes(in_use) + " (" +
            std::to_string(in_use) + " B) of a budget of " + format_bytes(bytes_) + " (" +
            std::to_string(bytes_) + " B), " + why +
            "; raise device_budget_bytes (strata_config) or keep fewer tensors on the device");
  }
  in_use_.fetch_add(bytes, std::memory_order_relaxed);
  return static_cast<void*>(base_ + *offset);
}

Status DeviceSlab::free(void* ptr) {
  if (!owns(ptr)) return invalid_argument(device_name_ + ": free of a pointer outside the device");
  const uint64_t offset = static_cast<uint64_t>(static_cast<std::byte*>(ptr) - base_);
  std::optional<RangeAllocator::Freed> freed;
  {
    std::lock_guard lock(mutex_);
    freed = ranges_.free(offset);
  }
  if (!freed) {
    return invalid_argument(device_name_ + ": free of " + std::to_string(offset) +
                            " bytes into the slab, which is not the start of a live allocation");
  }
  in_use_.fetch_sub(freed->tag, std::memory_order_relaxed);  // the tag is the size asked for
  return Status::ok();
}

bool DeviceSlab::contains(const void* ptr, uint64_t bytes) const {
  const auto* p = static_cast<const std::byte*>(ptr);
  return p >= base_ && bytes <= bytes_ && static_cast<uint64_t>(p - base_) <= bytes_ - bytes;
}

uint64_t DeviceSlab::allocation_size(const void* ptr) const {
  if (!owns(ptr)) return 0;
  const uint64_t offset = static_cast<uint64_t>(static_cast<const std::byte*>(ptr) - base_);
  std::lock_guard lock(mutex_);
  return ranges_.size_at(offset) == 0 ? 0 : ranges_.tag_at(offset);
}

uint32_t DeviceSlab::live_allocations() const {
  std::lock_guard lock(mutex_);
  return ranges_.allocations();
}

}  // namespace strata::memory
