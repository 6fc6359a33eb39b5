#include "memory/device.h"

#include <utility>

#include "common/assert.h"
#include "memory/emulated_device.h"
#if defined(STRATA_HAVE_CUDA)
#include "memory/cuda_device.h"
#endif

namespace strata::memory {

const char* to_string(DeviceBackend backend) {
  switch (backend) {
    case DeviceBackend::kAuto:
      return "auto";
    case DeviceBackend::kCuda:
      return "cuda";
    case DeviceBackend::kEmulated:
      return "emulated";
  }
  return "?";
}

Event::Event(Event&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)), slot_(other.slot_) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = std::exchange(other.device_, nullptr);
    slot_ = other.slot_;
  }
  return *this;
}

void Event::reset() {
  if (device_ != nullptr) device_->destroy_event(slot_);
  device_ = nullptr;
}

Result<uint32_t> Device::event_slot(const Event& event) const {
  if (event.device_ != this) {
    return invalid_argument(event.device_ == nullptr ? "the event is empty (moved from or reset)"
                                                     : "the event belongs to another device");
  }
  return event.slot_;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = std::exchange(other.device_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (data_ != nullptr) {
    // Freeing memory this device handed out cannot fail; a failure here is a bookkeeping bug.
    const Status status = device_->free(data_);
    STRATA_ASSERT(status.is_ok());
  }
  device_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

Result<DeviceBuffer> allocate_buffer(Device& device, uint64_t bytes) {
  STRATA_ASSIGN_OR_RETURN(void* data, device.allocate(bytes));
  return DeviceBuffer(&device, data, bytes);
}

bool cuda_built() {
#if defined(STRATA_HAVE_CUDA)
  return true;
#else
  return false;
#endif
}

int usable_cuda_devices() {
#if defined(STRATA_HAVE_CUDA)
  return cuda_device_count();
#else
  return 0;
#endif
}

Result<std::unique_ptr<Device>> open_device(const DeviceOptions& options) {
  switch (options.backend) {
    case DeviceBackend::kEmulated:
      return open_emulated_device(options);
    case DeviceBackend::kCuda:
#if defined(STRATA_HAVE_CUDA)
      return open_cuda_device(options);
#else
      return unsupported(
          "the CUDA device backend was asked for, but this build of Strata has no "
          "CUDA support (configure with -DSTRATA_CUDA=ON where nvcc is installed)");
#endif
    case DeviceBackend::kAuto:
#if defined(STRATA_HAVE_CUDA)
      // A library built with CUDA must still run where the driver or the GPU is missing. Where
      // GPUs exist, a bad ordinal is the caller's error, not a reason to emulate.
      if (cuda_device_count() > 0) return open_cuda_device(options);
#endif
      return open_emulated_device(options);
  }
  return invalid_argument("unknown device backend " +
                          std::to_string(static_cast<int>(options.backend)));
}

}  // namespace strata::memory
