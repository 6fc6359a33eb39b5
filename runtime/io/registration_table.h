// The files and buffers registered with an engine, and the validation of requests against them.
// Both engines use it so that the same request is accepted or refused the same way by each.
#pragma once

#include <array>
#include <cstdint>
#include <shared_mutex>

#include "common/status.h"
#include "io/io_engine.h"
#include "io/io_limits.h"

namespace strata::io {

struct RegisteredBuffer {
  void* base = nullptr;
  uint64_t bytes = 0;
};

// Registration is two-phase so that an engine can do the kernel side (io_uring's fixed tables)
// between reserve and publish, outside the table lock, and undo the reservation if it fails.
class RegistrationTable {
 public:
  // Reserves the next file index (file indices are never reused: there is no unregister_file).
  Result<uint32_t> reserve_file(int fd);
  void publish_file(uint32_t index, int fd);
  void abandon_file(uint32_t index);

  // Reserves a free buffer slot after checking base and size.
  Result<int32_t> reserve_buffer(void* base, uint64_t bytes);
  void publish_buffer(int32_t index);
  void abandon_buffer(int32_t index);
  // Marks a published buffer as leaving; returns what was registered. Then release_buffer().
  Result<RegisteredBuffer> begin_unregister_buffer(int32_t index);
  void release_buffer(int32_t index);

  // Checks a request for submit(): registered file, alignment, length, buffer range.
  Status validate(const IoRequest& request) const;

  // The fd behind a file index of a request that passed validate(). Lock-free: an index's fd
  // never changes once published, and publication happens-before any request naming it.
  int fd(uint32_t index) const { return files_[index].fd; }

 private:
  enum class SlotState : uint8_t { kFree, kReserved, kActive, kLeaving };
  struct FileSlot {
    int fd = -1;
    SlotState state = SlotState::kFree;
  };
  struct BufferSlot {
    RegisteredBuffer range;
    SlotState state = SlotState::kFree;
  };

  mutable std::shared_mutex mutex_;
  uint32_t files_used_ = 0;
  std::array<FileSlot, kMaxFiles> files_{};
  std::array<BufferSlot, kMaxBuffers> buffers_{};
};

}  // namespace strata::io
