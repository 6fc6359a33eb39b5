#include "sched/tensor_registry.h"

#include "common/assert.h"

namespace strata::sched {

Result<TensorHandle> TensorRegistry::add(const TensorSpec& spec, const RegisterOptions& options) {
  const uint64_t bytes = options.bytes != 0 ? options.bytes : spec.bytes();
  if (bytes == 0) return invalid_argument("tensor '" + spec.name + "' has 0 bytes");
  if (live_ >= max_tensors_) {
    return Status::error(STRATA_E_LIMIT, "cannot register tensor '" + spec.name +
                                             "': " + std::to_string(max_tensors_) +
                                             " tensors are registered (the limit)");
  }
  uint32_t index;
  if (!free_slots_.empty()) {
    index = free_slots_.back();
    free_slots_.pop_back();
  } else {
    index = slot_count_++;
    if ((index & (kSlotsPerChunk - 1)) == 0)
      chunks_.push_back(std::make_unique<Slot[]>(kSlotsPerChunk));
    live_generation_.push_back(0);
  }
  Slot& slot = this->slot(index);
  ++slot.generation;
  // Slots are retired before their generation outgrows the handle's field.
  STRATA_ASSERT(slot.generation != 0 && slot.generation <= kMaxHandleGeneration);
  live_generation_[index] = slot.generation;
  ++live_;

  TensorRecord& r = slot.record;
  r = TensorRecord{};
  r.spec = spec;
  r.bytes = bytes;
  r.home = options.home;
  r.allocation = options.allocation;
  r.read_only = options.read_only;
  r.handle = {index, slot.generation, owner_};
  if (options.contents_on_nvme) r.residency = ResidencyState::on_nvme();
  return r.handle;
}

void TensorRegistry::remove(TensorHandle handle) {
  STRATA_ASSERT(resolve(handle).is_ok());
  Slot& slot = this->slot(handle.index);
  live_generation_[handle.index] = 0;
  slot.record = TensorRecord{};
  --live_;
  // A slot whose generation would wrap is retired, so a handle is never issued twice.
  if (slot.generation != kMaxHandleGeneration) free_slots_.push_back(handle.index);
}

Result<uint32_t> TensorRegistry::resolve(TensorHandle handle) const {
  if (handle.generation == 0) {
    return Status::error(STRATA_E_BAD_HANDLE, "tensor handle " + std::to_string(handle.to_u64()) +
                                                  " was never issued (generation 0; "
                                                  "STRATA_TENSOR_NONE is 0)");
  }
  if (handle.owner != owner_) {
    return Status::error(STRATA_E_BAD_HANDLE, "tensor handle " + std::to_string(handle.to_u64()) +
                                                  " belongs to another runtime");
  }
  if (handle.generation == 0 || handle.index >= live_generation_.size() ||
      live_generation_[handle.index] != handle.generation) {
    return Status::error(STRATA_E_BAD_HANDLE,
                         "tensor handle " + std::to_string(handle.to_u64()) +
                             " is not registered (never issued, or unregistered)");
  }
  return handle.index;
}

}  // namespace strata::sched
