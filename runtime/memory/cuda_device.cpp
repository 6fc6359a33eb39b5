#include "memory/cuda_device.h"

#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

#include "common/align.h"
#include "common/assert.h"
#include "common/units.h"
#include "memory/device_slab.h"

namespace strata::memory {
namespace {

// What the CUDA context, cuBLAS workspaces and kernels need beside Strata's slab when the budget
// is left to us.
constexpr uint64_t kDefaultHeadroom = uint64_t{1} << 30;
// Frees waiting for a framework stream: at most this many before the oldest is waited for.
constexpr uint32_t kPendingFrees = 1024;

Status cuda_status(cudaError_t error, const std::string& what) {
  if (error == cudaSuccess) return Status::ok();
  return Status::error(STRATA_E_DEVICE, what + ": " + cudaGetErrorName(error) + " (" +
                                            cudaGetErrorString(error) + ")");
}

// Makes `ordinal` current for the calling thread and restores the previous device afterwards,
// so that Strata never changes a framework thread's CUDA state behind its back.
class ScopedDevice {
 public:
  explicit ScopedDevice(int ordinal) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != ordinal) cudaSetDevice(ordinal);
  }
  ~ScopedDevice() {
    int now = -1;
    if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) {
      cudaSetDevice(previous_);
    }
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = -1;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(const DeviceOptions& options, std::string name, std::string bus_id, void* base,
             uint64_t bytes, cudaStream_t h2d, cudaStream_t d2h)
      : name_(std::move(name)),
        bus_id_(std::move(bus_id)),
        ordinal_(options.ordinal),
        slab_(static_cast<std::byte*>(base), bytes, options.max_allocations, name_),
        streams_{h2d, d2h},
        events_(options.max_events, nullptr) {
    free_events_.reserve(options.max_events);
    for (uint32_t i = options.max_events; i-- > 0;) free_events_.push_back(i);
    pending_.resize(kPendingFrees);
    spare_pending_events_.reserve(kPendingFrees);
  }

  ~CudaDevice() override {
    ScopedDevice scoped(ordinal_);
    for (cudaStream_t stream : streams_) {
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
    {
      std::lock_guard lock(pending_mutex_);
      for (; pending_count_ > 0; --pending_count_, ++pending_head_) {
        const PendingFree& p = pending_[pending_head_ % kPendingFrees];
        cudaEventSynchronize(p.event);
        cudaEventDestroy(p.event);
      }
      for (cudaEvent_t e : spare_pending_events_) cudaEventDestroy(e);
    }
    STRATA_ASSERT(free_events_.size() == events_.size());  // no Event outlives its device
    cudaFree(slab_.base());
  }

  DeviceBackend backend() const override { return DeviceBackend::kCuda; }
  const std::string& name() const override { return name_; }
  int ordinal() const override { return ordinal_; }
  const std::string& pci_bus_id() const override { return bus_id_; }
  uint64_t budget_bytes() const override { return slab_.budget_bytes(); }
  uint64_t in_use_bytes() const override { return slab_.in_use_bytes(); }
  uint64_t host_resident_bytes() const override { return 0; }

  Result<void*> allocate(uint64_t bytes) override {
    reclaim(/*wait=*/false);
    Result<void*> p = slab_.allocate(bytes);
    if (p.is_ok() || p.status().code() != STRATA_E_DEVICE_BUDGET) return p;
    // Memory freed on a stream may be what is missing: wait for it, then try again.
    if (reclaim(/*wait=*/true) == 0) return p;
    return slab_.allocate(bytes);
  }

  Status free(void* ptr, NativeStream native_stream) override {
    if (native_stream == nullptr) {
      return slab_.free(ptr);
    }
    if (slab_.allocation_size(ptr) == 0) {
      return invalid_argument(name_ + ": free of a pointer that is not a live allocation");
    }
    // The stream may still have kernels queued that use the range: it goes back to the slab only
    // once an event recorded now on that stream has completed.
    std::unique_lock lock(pending_mutex_);
    while (pending_count_ == kPendingFrees) {
      // Full: wait for the oldest (a fixed-size ring, so that frees never allocate). Others may
      // fill it again while the lock is dropped, hence the loop.
      const PendingFree waited = pending_[pending_head_ % kPendingFrees];
      ++pending_head_;
      --pending_count_;
      lock.unlock();
      cudaEventSynchronize(waited.event);
      release_pending(waited);
      lock.lock();
    }
    cudaEvent_t event = nullptr;
    if (!spare_pending_events_.empty()) {
      event = spare_pending_events_.back();
      spare_pending_events_.pop_back();
    } else {
      ScopedDevice scoped(ordinal_);
      STRATA_TRY(cuda_status(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                             "cudaEventCreate for a deferred free"));
    }
    const cudaError_t error = cudaEventRecord(event, static_cast<cudaStream_t>(native_stream));
    if (error != cudaSuccess) {
      spare_pending_events_.push_back(event);
      lock.unlock();
      // The stream is unusable, so nothing more will run on it: safe to release now.
      (void)slab_.free(ptr);
      return cuda_status(error, "cudaEventRecord for a deferred free");
    }
    pending_[(pending_head_ + pending_count_) % kPendingFrees] = {ptr, event};
    ++pending_count_;
    return Status::ok();
  }

  bool owns(const void* ptr) const override { return slab_.owns(ptr); }
  uint64_t allocation_size(const void* ptr) const override { return slab_.allocation_size(ptr); }

  Status register_host(void* ptr, uint64_t bytes) override {
    ScopedDevice scoped(ordinal_);
    // Portable: the pages are pinned for every GPU context, not only this device's.
    return cuda_status(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable),
                       "cudaHostRegister of " + format_bytes(bytes));
  }

  Status unregister_host(void* ptr) override {
    ScopedDevice scoped(ordinal_);
    return cuda_status(cudaHostUnregister(ptr), "cudaHostUnregister");
  }

  Status copy_async(CopyStream stream, void* dst, const void* src, uint64_t bytes) override {
    if (bytes == 0) return Status::ok();
    const bool to_device = stream == CopyStream::kHostToDevice;
    if (!slab_.contains(to_device ? dst : src, bytes)) {
      return invalid_argument(std::string(to_device ? "host-to-device" : "device-to-host") +
                              " copy of " + std::to_string(bytes) +
                              " bytes: the device side is not inside " + name_ + "'s slab");
    }
    return cuda_status(cudaMemcpyAsync(dst, src, bytes,
                                       to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                       streams_[static_cast<int>(stream)]),
                       "cudaMemcpyAsync of " + std::to_string(bytes) + " bytes");
  }

  Status synchronize(CopyStream stream) override {
    return cuda_status(cudaStreamSynchronize(streams_[static_cast<int>(stream)]),
                       "cudaStreamSynchronize");
  }

  Result<Event> create_event() override {
    uint32_t slot = 0;
    {
      std::lock_guard lock(events_mutex_);
      if (free_events_.empty()) {
        return Status::error(STRATA_E_LIMIT, name_ + ": all " + std::to_string(events_.size()) +
                                                 " events are in use (DeviceOptions::max_events)");
      }
      slot = free_events_.back();
      free_events_.pop_back();
    }
    cudaEvent_t event = nullptr;
    ScopedDevice scoped(ordinal_);
    const cudaError_t error = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (error != cudaSuccess) {
      std::lock_guard lock(events_mutex_);
      free_events_.push_back(slot);
      return cuda_status(error, "cudaEventCreate");
    }
    events_[slot] = event;
    return make_event(slot);
  }

  Status record(const Event& event, CopyStream stream) override {
    STRATA_ASSIGN_OR_RETURN(cudaEvent_t e, native_event(event));
    return cuda_status(cudaEventRecord(e, streams_[static_cast<int>(stream)]), "cudaEventRecord");
  }

  Status record(const Event& event, NativeStream native_stream) override {
    STRATA_ASSIGN_OR_RETURN(cudaEvent_t e, native_event(event));
    return cuda_status(cudaEventRecord(e, static_cast<cudaStream_t>(native_stream)),
                       "cudaEventRecord on a framework stream");
  }

  Result<bool> query(const Event& event) override {
    STRATA_ASSIGN_OR_RETURN(cudaEvent_t e, native_event(event));
    const cudaError_t error = cudaEventQuery(e);
    if (error == cudaSuccess) return true;
    if (error == cudaErrorNotReady) return false;
    return cuda_status(error, "cudaEventQuery");
  }

  Status synchronize(const Event& event) override {
    STRATA_ASSIGN_OR_RETURN(cudaEvent_t e, native_event(event));
    return cuda_status(cudaEventSynchronize(e), "cudaEventSynchronize");
  }

  Status wait(CopyStream stream, const Event& event) override {
    STRATA_ASSIGN_OR_RETURN(cudaEvent_t e, native_event(event));
    return cuda_status(cudaStreamWaitEvent(streams_[static_cast<int>(stream)], e, 0),
                       "cudaStreamWaitEvent");
  }

  Status wait(NativeStream native_stream, const Event& event) override {
    STRATA_ASSIGN_OR_RETURN(cudaEvent_t e, native_event(event));
    return cuda_status(cudaStreamWaitEvent(static_cast<cudaStream_t>(native_stream), e, 0),
                       "cudaStreamWaitEvent on a framework stream");
  }

 protected:
  void destroy_event(uint32_t slot) noexcept override {
    cudaEventDestroy(events_[slot]);
    events_[slot] = nullptr;
    std::lock_guard lock(events_mutex_);
    free_events_.push_back(slot);
  }

 private:
  struct PendingFree {
    void* ptr;
    cudaEvent_t event;
  };

  Result<cudaEvent_t> native_event(const Event& event) const {
    STRATA_ASSIGN_OR_RETURN(uint32_t slot, event_slot(event));
    return events_[slot];
  }

  void release_pending(const PendingFree& p) {
    const Status freed = slab_.free(p.ptr);
    STRATA_ASSERT(freed.is_ok());  // checked live when the free was deferred
    std::lock_guard lock(pending_mutex_);
    spare_pending_events_.push_back(p.event);
  }

  // Returns deferred frees whose events have completed to the slab, oldest first, stopping at
  // the first still pending (frees mostly complete in the order they were queued, so this stays
  // a query or two per allocation); with `wait`, waits for all of them. Returns how many.
  uint32_t reclaim(bool wait) {
    uint32_t released = 0;
    for (;;) {
      PendingFree oldest{};
      {
        std::lock_guard lock(pending_mutex_);
        if (pending_count_ == 0) return released;
        oldest = pending_[pending_head_ % kPendingFrees];
        if (!wait && cudaEventQuery(oldest.event) != cudaSuccess) return released;
        ++pending_head_;
        --pending_count_;
      }
      if (wait) cudaEventSynchronize(oldest.event);
      release_pending(oldest);
      ++released;
    }
  }

  const std::string name_;
  const std::string bus_id_;
  const int ordinal_;
  DeviceSlab slab_;
  cudaStream_t streams_[kCopyStreamCount];

  std::mutex events_mutex_;
  std::vector<cudaEvent_t> events_;    // by slot; a slot's entry is written only by its owner
  std::vector<uint32_t> free_events_;  // guarded by events_mutex_

  std::mutex pending_mutex_;
  // A ring of kPendingFrees deferred frees, oldest at pending_head_; guarded by pending_mutex_.
  std::vector<PendingFree> pending_;
  uint64_t pending_head_ = 0;
  uint32_t pending_count_ = 0;
  std::vector<cudaEvent_t> spare_pending_events_;  // guarded by pending_mutex_
};

}  // namespace

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  return count;
}

Result<std::unique_ptr<Device>> open_cuda_device(const DeviceOptions& options) {
  int count = 0;
  if (const cudaError_t error = cudaGetDeviceCount(&count); error != cudaSuccess) {
    cudaGetLastError();
    return Status::error(STRATA_E_UNSUPPORTED, std::string("no usable CUDA device: ") +
                                                   cudaGetErrorName(error) + " (" +
                                                   cudaGetErrorString(error) + ")");
  }
  if (options.ordinal < 0 || options.ordinal >= count) {
    return Status::error(STRATA_E_UNSUPPORTED, "CUDA device " + std::to_string(options.ordinal) +
                                                   " does not exist (" + std::to_string(count) +
                                                   " usable)");
  }
  if (options.max_events == 0 || options.max_allocations == 0) {
    return invalid_argument("max_events and max_allocations must be > 0");
  }
  ScopedDevice scoped(options.ordinal);

  cudaDeviceProp properties{};
  STRATA_TRY(cuda_status(cudaGetDeviceProperties(&properties, options.ordinal),
                         "cudaGetDeviceProperties"));
  char bus_id[64] = {};
  STRATA_TRY(cuda_status(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, options.ordinal),
                         "cudaDeviceGetPCIBusId"));
  const std::string name = "cuda:" + std::to_string(options.ordinal) + " (" + properties.name + ")";

  size_t free_bytes = 0;
  size_t total_bytes = 0;
  STRATA_TRY(cuda_status(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  uint64_t budget = options.budget_bytes;
  if (budget == 0) {
    if (free_bytes <= kDefaultHeadroom) {
      return Status::error(STRATA_E_DEVICE_BUDGET, name + " has only " + format_bytes(free_bytes) +
                                                       " free; set device_budget_bytes explicitly");
    }
    budget = free_bytes - kDefaultHeadroom;
  }
  budget = align_down(budget, kDeviceAlignment);
  void* base = nullptr;
  if (const cudaError_t error = cudaMalloc(&base, budget); error != cudaSuccess) {
    cudaGetLastError();
    return Status::error(STRATA_E_DEVICE_BUDGET,
                         name + ": cannot reserve the device budget of " + format_bytes(budget) +
                             " (" + std::to_string(budget) + " B); " + format_bytes(free_bytes) +
                             " of " + format_bytes(total_bytes) + " are free (" +
                             cudaGetErrorName(error) + "); lower device_budget_bytes");
  }
  cudaStream_t h2d = nullptr;
  cudaStream_t d2h = nullptr;
  // Non-blocking: the copy streams must not serialise with the legacy default stream a
  // framework may use.
  Status status = cuda_status(cudaStreamCreateWithFlags(&h2d, cudaStreamNonBlocking),
                              "cudaStreamCreate (host-to-device)");
  if (status.is_ok()) {
    status = cuda_status(cudaStreamCreateWithFlags(&d2h, cudaStreamNonBlocking),
                         "cudaStreamCreate (device-to-host)");
  }
  if (!status.is_ok()) {
    if (h2d != nullptr) cudaStreamDestroy(h2d);
    cudaFree(base);
    return status;
  }
  return std::unique_ptr<Device>(new CudaDevice(options, name, bus_id, base, budget, h2d, d2h));
}

void* cuda_plain_malloc(uint64_t bytes, int ordinal) {
  int current = 0;
  if (ordinal < 0 || cudaGetDevice(&current) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  // Memory on another GPU than the one asked for would be silently wrong: switch for the call.
  if (ordinal != current && cudaSetDevice(ordinal) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    cudaGetLastError();
    p = nullptr;
  }
  if (ordinal != current) cudaSetDevice(current);
  return p;
}

std::string cuda_plain_free(void* ptr) {
  const cudaError_t error = cudaFree(ptr);
  if (error == cudaSuccess) return "";
  cudaGetLastError();
  return cudaGetErrorName(error);
}

}  // namespace strata::memory
