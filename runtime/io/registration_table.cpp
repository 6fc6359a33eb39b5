#include "io/registration_table.h"

#include <fcntl.h>

#include <cerrno>
#include <mutex>
#include <string>

#include "common/assert.h"

namespace strata::io {

Result<uint32_t> RegistrationTable::reserve_file(int fd) {
  if (fd < 0 || ::fcntl(fd, F_GETFD) < 0) {
    return invalid_argument("register_file: " + std::to_string(fd) + " is not an open file");
  }
  std::unique_lock lock(mutex_);
  if (files_used_ == kMaxFiles) {
    return Status::error(STRATA_E_LIMIT, "register_file: all " + std::to_string(kMaxFiles) +
                                             " file slots of the engine are in use");
  }
  const uint32_t index = files_used_++;
  files_[index] = {fd, SlotState::kReserved};
  return index;
}

void RegistrationTable::publish_file(uint32_t index, int fd) {
  std::unique_lock lock(mutex_);
  STRATA_ASSERT(index < files_used_ && files_[index].state == SlotState::kReserved);
  files_[index] = {fd, SlotState::kActive};
}

void RegistrationTable::abandon_file(uint32_t index) {
  std::unique_lock lock(mutex_);
  STRATA_ASSERT(index < files_used_ && files_[index].state == SlotState::kReserved);
  // The index stays burnt; indices are handed out in order and never reused.
  files_[index] = {-1, SlotState::kFree};
}

Result<int32_t> RegistrationTable::reserve_buffer(void* base, uint64_t bytes) {
  if (base == nullptr || bytes == 0) {
    return invalid_argument("register_buffer: empty buffer");
  }
  if (bytes > kMaxRegisteredBufferBytes) {
    return invalid_argument("register_buffer: " + std::to_string(bytes) +
                            " bytes is more than the 1 GiB a registered buffer may span; "
                            "register it in several pieces");
  }
  std::unique_lock lock(mutex_);
  for (uint32_t i = 0; i < kMaxBuffers; ++i) {
    if (buffers_[i].state == SlotState::kFree) {
      buffers_[i] = {{base, bytes}, SlotState::kReserved};
      return static_cast<int32_t>(i);
    }
  }
  return Status::error(STRATA_E_LIMIT, "register_buffer: all " + std::to_string(kMaxBuffers) +
                                           " buffer slots of the engine are in use");
}

void RegistrationTable::publish_buffer(int32_t index) {
  std::unique_lock lock(mutex_);
  STRATA_ASSERT(index >= 0 && static_cast<uint32_t>(index) < kMaxBuffers);
  STRATA_ASSERT(buffers_[index].state == SlotState::kReserved);
  buffers_[index].state = SlotState::kActive;
}

void RegistrationTable::abandon_buffer(int32_t index) {
  std::unique_lock lock(mutex_);
  STRATA_ASSERT(index >= 0 && static_cast<uint32_t>(index) < kMaxBuffers);
  STRATA_ASSERT(buffers_[index].state == SlotState::kReserved);
  buffers_[index] = {};
}

Result<RegisteredBuffer> RegistrationTable::begin_unregister_buffer(int32_t index) {
  std::unique_lock lock(mutex_);
  if (index < 0 || static_cast<uint32_t>(index) >= kMaxBuffers ||
      buffers_[index].state != SlotState::kActive) {
    return invalid_argument("unregister_buffer: " + std::to_string(index) +
                            " is not a registered buffer");
  }
  buffers_[index].state = SlotState::kLeaving;
  return buffers_[index].range;
}

void RegistrationTable::release_buffer(int32_t index) {
  std::unique_lock lock(mutex_);
  STRATA_ASSERT(index >= 0 && static_cast<uint32_t>(index) < kMaxBuffers);
  STRATA_ASSERT(buffers_[index].state == SlotState::kLeaving);
  buffers_[index] = {};
}

Status RegistrationTable::validate(const IoRequest& r) const {
  const char* op = r.op == IoOp::kRead ? "read" : "write";
  if (r.op != IoOp::kRead && r.op != IoOp::kWrite) {
    return invalid_argument("submit: unknown op");
  }
  if (r.on_complete == nullptr) {
    return invalid_argument(std::string(op) + ": no on_complete");
  }
  if (r.buffer == nullptr || r.length == 0) {
    return invalid_argument(std::string(op) + ": empty buffer or zero length");
  }
  if (!is_aligned(r.buffer, kIoAlignment) || !is_aligned(r.length, kIoAlignment) ||
      !is_aligned(r.offset, kIoAlignment)) {
    return invalid_argument(std::string(op) + " of " + std::to_string(r.length) +
                            " bytes at offset " + std::to_string(r.offset) +
                            ": buffer, length and offset must be multiples of " +
                            std::to_string(kIoAlignment) + " (direct I/O)");
  }
  if (r.offset + r.length < r.offset) {
    return invalid_argument(std::string(op) + ": offset + length overflows");
  }
  std::shared_lock lock(mutex_);
  if (r.file >= files_used_ || files_[r.file].state != SlotState::kActive) {
    return invalid_argument(std::string(op) + ": file " + std::to_string(r.file) +
                            " is not registered with this engine");
  }
  if (r.buffer_index != -1) {
    if (r.buffer_index < 0 || static_cast<uint32_t>(r.buffer_index) >= kMaxBuffers ||
        buffers_[r.buffer_index].state != SlotState::kActive) {
      return invalid_argument(std::string(op) + ": buffer " + std::to_string(r.buffer_index) +
                              " is not registered with this engine");
    }
    const RegisteredBuffer& b = buffers_[r.buffer_index].range;
    const auto begin = reinterpret_cast<uintptr_t>(r.buffer);
    const auto base = reinterpret_cast<uintptr_t>(b.base);
    if (begin < base || begin - base > b.bytes || r.length > b.bytes - (begin - base)) {
      return invalid_argument(std::string(op) + ": [buffer, buffer + " + std::to_string(r.length) +
                              ") is not inside registered buffer " +
                              std::to_string(r.buffer_index));
    }
  }
  return Status::ok();
}

}  // namespace strata::io
