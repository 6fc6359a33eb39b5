// One interface for GPU memory, copy streams and events. Two backends implement it:
//  - CUDA (cuda_device.cpp): one cudaMalloc slab per device carved by a sub-allocator, two
//    dedicated non-blocking copy streams, cudaEvents;
//  - host-emulated (emulated_device.cpp): a memfd-backed slab, copies done by one worker thread
//    per stream, with CUDA's completion and ordering semantics, so everything above this interface
//    runs (and is tested) on machines without a GPU.
// Nothing above this file knows which backend runs.
//
// Semantics shared by both backends (they are CUDA's):
//  - Work queued on one stream runs in order; the two streams run independently of each other.
//  - An event completes when all work queued on its stream before record() has finished. An
//    event never recorded counts as complete. Recording again moves the event to the new point.
//  - wait(stream, event): work queued on `stream` afterwards starts only once the event (as
//    recorded at the time of the call) has completed.
//  - Device memory must not be freed while a copy that uses it is queued: free() does not wait
//    for copies. (free(ptr, native_stream) defers reuse until that stream's queued work is done;
//    it is for memory a framework's compute stream uses, e.g. the PyTorch allocator.)
//
// Thread rules: every member may be called from any thread, concurrently, except that an Event is
// not to be recorded from two threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "vocabulary/tensor_spec.h"

namespace strata::memory {

// Values equal strata_device_backend.
enum class DeviceBackend : uint8_t { kAuto = 0, kCuda = 1, kEmulated = 2 };
const char* to_string(DeviceBackend backend);

// The two dedicated copy streams.
enum class CopyStream : uint8_t { kHostToDevice = 0, kDeviceToHost = 1 };
inline constexpr int kCopyStreamCount = 2;

// A framework's stream (a cudaStream_t on CUDA). The emulated backend has no compute streams:
// work a framework does on the "device" is host code that has already finished.
using NativeStream = void*;

struct DeviceOptions {
  DeviceBackend backend = DeviceBackend::kAuto;
  int ordinal = 0;
  // Bytes of device memory Strata may hold (the slab size). 0: CUDA takes the free memory at open
  // time less 1 GiB of headroom for the CUDA context and kernels; the emulated device takes 1 GiB.
  uint64_t budget_bytes = 0;
  // Emulated only: copy bandwidth to model a PCIe link, bytes per second (0: memcpy speed).
  uint64_t emulated_copy_bytes_per_second = 0;
  // Sub-allocator limits: live allocations and events, fixed at open so that allocate / free /
  // record never allocate host memory.
  uint32_t max_allocations = 1u << 16;
  uint32_t max_events = 4096;
};

class Device;

// An event owned by its device (RAII: destroyed with the handle). Move-only.
class Event {
 public:
  Event() = default;
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() { reset(); }

  bool valid() const { return device_ != nullptr; }
  void reset();

 private:
  friend class Device;
  Event(Device* device, uint32_t slot) : device_(device), slot_(slot) {}
  Device* device_ = nullptr;
  uint32_t slot_ = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual DeviceBackend backend() const = 0;
  // "cuda:0 (NVIDIA H200)", "emulated:0".
  virtual const std::string& name() const = 0;
  virtual int ordinal() const = 0;
  // "0000:65:00.0" for a real GPU (to place pinned memory on the nearest NUMA node); "" if none.
  virtual const std::string& pci_bus_id() const = 0;
  virtual uint64_t budget_bytes() const = 0;
  virtual uint64_t in_use_bytes() const = 0;
  // Host memory currently backing device memory (the emulated device's resident pages); 0 on
  // CUDA. Lets host accounting leave the emulated device out exactly.
  virtual uint64_t host_resident_bytes() const = 0;

  // --- Memory. Alignment is 256 bytes (what cudaMalloc guarantees and kernels assume).
  // STRATA_E_DEVICE_BUDGET (with the numbers) when the slab has no free range that large.
  virtual Result<void*> allocate(uint64_t bytes) = 0;
  // Frees a pointer from allocate(). With native_stream, the range is reused only after the work
  // queued on that stream so far has finished. STRATA_E_INVALID for a pointer not allocated here.
  virtual Status free(void* ptr, NativeStream native_stream = nullptr) = 0;
  // Whether ptr lies inside this device's slab.
  virtual bool owns(const void* ptr) const = 0;
  // The size allocate() was asked for, or 0 when ptr is not a live allocation's start.
  virtual uint64_t allocation_size(const void* ptr) const = 0;

  // --- Host memory registration: makes [ptr, ptr + bytes) a DMA target without staging copies
  // (cudaHostRegister). A no-op on the emulated device. The pinned arena calls these.
  virtual Status register_host(void* ptr, uint64_t bytes) = 0;
  virtual Status unregister_host(void* ptr) = 0;

  // --- Copies. kHostToDevice: dst in device memory, src in host memory; kDeviceToHost the
  // reverse. Returns once queued (it blocks only while the stream's queue is full).
  virtual Status copy_async(CopyStream stream, void* dst, const void* src, uint64_t bytes) = 0;
  // Waits until everything queued on the stream so far has finished.
  virtual Status synchronize(CopyStream stream) = 0;

  // --- Events.
  virtual Result<Event> create_event() = 0;
  virtual Status record(const Event& event, CopyStream stream) = 0;
  // Records on a framework's stream (the emulated device: completes at once, see NativeStream).
  virtual Status record(const Event& event, NativeStream native_stream) = 0;
  // true when complete. Never blocks.
  virtual Result<bool> query(const Event& event) = 0;
  virtual Status synchronize(const Event& event) = 0;
  virtual Status wait(CopyStream stream, const Event& event) = 0;
  // Makes a framework's stream wait (the emulated device: blocks the caller until complete).
  virtual Status wait(NativeStream native_stream, const Event& event) = 0;

 protected:
  Device() = default;
  // Events are slots in a table the backend allocates once.
  virtual void destroy_event(uint32_t slot) noexcept = 0;
  Event make_event(uint32_t slot) { return Event(this, slot); }
  // The slot of an event this device created; STRATA_E_INVALID otherwise.
  Result<uint32_t> event_slot(const Event& event) const;

 private:
  friend class Event;
};

// An allocation owned by a handle (RAII: freed with it). Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device* device, void* data, uint64_t bytes)
      : device_(device), data_(data), bytes_(bytes) {}
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  void* data() const { return data_; }
  uint64_t size() const { return bytes_; }
  bool valid() const { return data_ != nullptr; }
  void reset();

 private:
  Device* device_ = nullptr;
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
};

Result<DeviceBuffer> allocate_buffer(Device& device, uint64_t bytes);

// Opens a device. kAuto probes CUDA at run time: a library built with CUDA still runs, on the
// emulated device, where no driver or GPU is usable. kCuda fails with STRATA_E_UNSUPPORTED where
// CUDA is not built in or not usable (the message says why).
Result<std::unique_ptr<Device>> open_device(const DeviceOptions& options);

// Whether this build has the CUDA backend, and (probing at run time) how many GPUs it can use.
bool cuda_built();
int usable_cuda_devices();

}  // namespace strata::memory
