#include "memory/emulated_device.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "common/align.h"
#include "common/assert.h"
#include "common/unique_fd.h"
#include "common/units.h"
#include "memory/device_slab.h"

namespace strata::memory {
namespace {

constexpr uint64_t kDefaultEmulatedBudget = uint64_t{1} << 30;
// Operations a stream holds before copy_async blocks (CUDA's launch queue is about this deep).
constexpr uint64_t kQueueCapacity = 1024;

// An event's state in one word so that query() is a single atomic load: 0 = never recorded
// (complete), else the stream (top 8 bits, plus one) and the number of operations queued on it
// when the event was recorded: the event completes when that many have finished.
constexpr uint64_t encode_event(int stream, uint64_t sequence) {
  return (static_cast<uint64_t>(stream + 1) << 56) | sequence;
}
constexpr int event_stream(uint64_t state) {
  return static_cast<int>(state >> 56) - 1;
}
constexpr uint64_t event_sequence(uint64_t state) {
  return state & ((uint64_t{1} << 56) - 1);
}

class EmulatedDevice final : public Device, public EmulatedDeviceControl {
 public:
  EmulatedDevice(const DeviceOptions& options, UniqueFd memfd, std::byte* base, uint64_t bytes)
      : name_("emulated:" + std::to_string(options.ordinal)),
        ordinal_(options.ordinal),
        copy_bytes_per_second_(options.emulated_copy_bytes_per_second),
        max_events_(options.max_events),
        memfd_(std::move(memfd)),
        slab_(base, bytes, options.max_allocations, name_),
        events_(new std::atomic<uint64_t>[options.max_events]) {
    free_events_.reserve(options.max_events);
    for (uint32_t i = options.max_events; i-- > 0;) {
      events_[i].store(0, std::memory_order_relaxed);
      free_events_.push_back(i);
    }
    for (int s = 0; s < kCopyStreamCount; ++s) {
      streams_[s].ops.resize(kQueueCapacity);
      streams_[s].worker = std::thread([this, s] { run(s); });
    }
  }

  ~EmulatedDevice() override {
    // Like cudaStreamDestroy: queued work finishes first.
    for (Stream& stream : streams_) {
      {
        std::lock_guard lock(stream.mutex);
        stream.stop = true;
        stream.paused = false;
      }
      stream.changed.notify_all();
    }
    for (Stream& stream : streams_) stream.worker.join();
    // Events are RAII handles that must not outlive their device.
    STRATA_ASSERT(free_events_.size() == max_events_);
    const uint64_t bytes = slab_.budget_bytes();
    ::munmap(slab_.base(), bytes);
  }

  DeviceBackend backend() const override { return DeviceBackend::kEmulated; }
  const std::string& name() const override { return name_; }
  int ordinal() const override { return ordinal_; }
  const std::string& pci_bus_id() const override { return no_bus_id_; }
  uint64_t budget_bytes() const override { return slab_.budget_bytes(); }
  uint64_t in_use_bytes() const override { return slab_.in_use_bytes(); }

  uint64_t host_resident_bytes() const override {
    // A memfd's block count is exactly the shmem pages it holds (no swap here to hide any).
    struct stat st {};
    if (::fstat(memfd_.get(), &st) != 0) return 0;
    return static_cast<uint64_t>(st.st_blocks) * 512;
  }

  Result<void*> allocate(uint64_t bytes) override { return slab_.allocate(bytes); }

  Status free(void* ptr, NativeStream /*native_stream*/) override {
    // No framework compute runs on the emulated device asynchronously, so nothing can still be
    // using the range: reuse is immediate. Its pages stay in the memfd, as a GPU's memory stays
    // in the slab cudaMalloc'd once: giving them back made every later allocation fault its pages
    // in again (a zeroed page per 4 KiB on first touch, even to read), a cost no GPU has and one
    // that was 40% of the main job's step (docs/reliability.md, finding 23).
    return slab_.free(ptr);
  }

  bool owns(const void* ptr) const override { return slab_.owns(ptr); }
  uint64_t allocation_size(const void* ptr) const override { return slab_.allocation_size(ptr); }

  Status register_host(void* /*ptr*/, uint64_t /*bytes*/) override { return Status::ok(); }
  Status unregister_host(void* /*ptr*/) override { return Status::ok(); }

  Status copy_async(CopyStream stream, void* dst, const void* src, uint64_t bytes) override {
    const bool to_device = stream == CopyStream::kHostToDevice;
    const void* device_side = to_device ? dst : src;
    const void* host_side = to_device ? src : dst;
    if (bytes == 0) return Status::ok();
    if (dst == nullptr || src == nullptr) return invalid_argument("copy with a null pointer");
    if (!slab_.contains(device_side, bytes)) {
      return invalid_argument(std::string(to_device ? "host-to-device" : "device-to-host") +
                              " copy of " + std::to_string(bytes) +
                              " bytes: the device side is not inside " + name_ + "'s memory");
    }
    if (slab_.owns(host_side)) {
      return invalid_argument("copy of " + std::to_string(bytes) +
                              " bytes: the host side lies in device memory");
    }
    Op op;
    op.type = Op::kCopy;
    op.dst = dst;
    op.src = src;
    op.bytes = bytes;
    enqueue(static_cast<int>(stream), op);
    return Status::ok();
  }

  Status synchronize(CopyStream stream) override {
    Stream& s = streams_[static_cast<int>(stream)];
    std::unique_lock lock(s.mutex);
    const uint64_t target = s.submitted;
    s.changed.wait(lock, [&] { return s.completed.load(std::memory_order_acquire) >= target; });
    return Status::ok();
  }

  Result<Event> create_event() override {
    std::lock_guard lock(events_mutex_);
    if (free_events_.empty()) {
      return Status::error(STRATA_E_LIMIT, name_ + ": all " + std::to_string(max_events_) +
                                               " events are in use (DeviceOptions::max_events)");
    }
    const uint32_t slot = free_events_.back();
    free_events_.pop_back();
    events_[slot].store(0, std::memory_order_relaxed);
    return make_event(slot);
  }

  Status record(const Event& event, CopyStream stream) override {
    STRATA_ASSIGN_OR_RETURN(uint32_t slot, event_slot(event));
    Stream& s = streams_[static_cast<int>(stream)];
    uint64_t submitted = 0;
    {
      std::lock_guard lock(s.mutex);
      submitted = s.submitted;
    }
    events_[slot].store(encode_event(static_cast<int>(stream), submitted),
                        std::memory_order_release);
    return Status::ok();
  }

  Status record(const Event& event, NativeStream /*native_stream*/) override {
    STRATA_ASSIGN_OR_RETURN(uint32_t slot, event_slot(event));
    events_[slot].store(0, std::memory_order_release);
    return Status::ok();
  }

  Result<bool> query(const Event& event) override {
    STRATA_ASSIGN_OR_RETURN(uint32_t slot, event_slot(event));
    return complete(events_[slot].load(std::memory_order_acquire));
  }

  Status synchronize(const Event& event) override {
    STRATA_ASSIGN_OR_RETURN(uint32_t slot, event_slot(event));
    wait_for(events_[slot].load(std::memory_order_acquire));
    return Status::ok();
  }

  Status wait(CopyStream stream, const Event& event) override {
    STRATA_ASSIGN_OR_RETURN(uint32_t slot, event_slot(event));
    const uint64_t state = events_[slot].load(std::memory_order_acquire);
    // Work of the same stream is ordered already; a completed event needs no wait.
    if (state == 0 || event_stream(state) == static_cast<int>(stream) || complete(state)) {
      return Status::ok();
    }
    Op op;
    op.type = Op::kWait;
    op.wait_state = state;
    enqueue(static_cast<int>(stream), op);
    return Status::ok();
  }

  Status wait(NativeStream /*native_stream*/, const Event& event) override {
    return synchronize(event);
  }

  // --- EmulatedDeviceControl
  void pause(CopyStream stream) override {
    Stream& s = streams_[static_cast<int>(stream)];
    std::lock_guard lock(s.mutex);
    s.paused = true;
  }

  void resume(CopyStream stream) override {
    Stream& s = streams_[static_cast<int>(stream)];
    {
      std::lock_guard lock(s.mutex);
      s.paused = false;
    }
    s.changed.notify_all();
  }

  uint64_t pending(CopyStream stream) const override {
    const Stream& s = streams_[static_cast<int>(stream)];
    std::lock_guard lock(s.mutex);
    return s.submitted - s.completed.load(std::memory_order_relaxed);
  }

 protected:
  void destroy_event(uint32_t slot) noexcept override {
    std::lock_guard lock(events_mutex_);
    free_events_.push_back(slot);
  }

 private:
  struct Op {
    enum Type : uint8_t { kCopy, kWait } type = kCopy;
    void* dst = nullptr;
    const void* src = nullptr;
    uint64_t bytes = 0;
    uint64_t wait_state = 0;  // kWait: the event state to wait for
  };

  struct Stream {
    mutable std::mutex mutex;
    std::condition_variable changed;  // queue grew or shrank, or the stream was resumed / stopped
    std::vector<Op> ops;              // a ring of kQueueCapacity
    uint64_t submitted = 0;           // operations ever queued (ring tail)
    std::atomic<uint64_t> completed{0};  // operations finished (ring head)
    bool paused = false;
    bool stop = false;
    std::thread worker;
  };

  bool complete(uint64_t state) const {
    if (state == 0) return true;
    return streams_[event_stream(state)].completed.load(std::memory_order_acquire) >=
           event_sequence(state);
  }

  void wait_for(uint64_t state) {
    if (complete(state)) return;
    Stream& s = streams_[event_stream(state)];
    std::unique_lock lock(s.mutex);
    s.changed.wait(lock, [&] { return complete(state); });
  }

  void enqueue(int stream, const Op& op) {
    Stream& s = streams_[stream];
    std::unique_lock lock(s.mutex);
    // Backpressure: wait for room rather than grow (no allocation per copy).
    s.changed.wait(lock, [&] {
      return s.submitted - s.completed.load(std::memory_order_relaxed) < kQueueCapacity;
    });
    s.ops[s.submitted % kQueueCapacity] = op;
    ++s.submitted;
    lock.unlock();
    s.changed.notify_all();
  }

  void run(int stream) {
    Stream& s = streams_[stream];
    std::unique_lock lock(s.mutex);
    for (;;) {
      s.changed.wait(lock, [&] {
        const bool has_work = s.completed.load(std::memory_order_relaxed) < s.submitted;
        return (has_work && !s.paused) || (s.stop && !has_work);
      });
      const uint64_t head = s.completed.load(std::memory_order_relaxed);
      if (head == s.submitted) return;  // stopped and drained
      const Op op = s.ops[head % kQueueCapacity];
      lock.unlock();
      execute(op);
      lock.lock();
      s.completed.store(head + 1, std::memory_order_release);
      s.changed.notify_all();
    }
  }

  void execute(const Op& op) {
    if (op.type == Op::kWait) {
      // The awaited work was queued before this wait (the state is a snapshot), so streams never
      // wait on each other in a cycle.
      wait_for(op.wait_state);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(op.dst, op.src, op.bytes);
    if (copy_bytes_per_second_ > 0) {
      const auto duration = std::chrono::nanoseconds(static_cast<int64_t>(
          static_cast<double>(op.bytes) * 1e9 / static_cast<double>(copy_bytes_per_second_)));
      std::this_thread::sleep_until(start + duration);
    }
  }

  const std::string name_;
  const int ordinal_;
  const uint64_t copy_bytes_per_second_;
  const uint32_t max_events_;
  const std::string no_bus_id_;
  UniqueFd memfd_;
  DeviceSlab slab_;
  std::array<Stream, kCopyStreamCount> streams_;

  std::mutex events_mutex_;
  std::unique_ptr<std::atomic<uint64_t>[]> events_;
  std::vector<uint32_t> free_events_;  // guarded by events_mutex_; reserved for max_events_
};

}  // namespace

Result<std::unique_ptr<Device>> open_emulated_device(const DeviceOptions& options) {
  const uint64_t budget = options.budget_bytes != 0 ? options.budget_bytes : kDefaultEmulatedBudget;
  if (options.ordinal < 0) {
    return invalid_argument("device ordinal " + std::to_string(options.ordinal) + " is negative");
  }
  if (options.max_events == 0 || options.max_allocations == 0) {
    return invalid_argument("max_events and max_allocations must be > 0");
  }
  const uint64_t bytes = align_up(budget, kPageSize);
  UniqueFd memfd(::memfd_create("strata-emulated-device", MFD_CLOEXEC));
  if (!memfd.valid()) {
    return errno_status(STRATA_E_UNSUPPORTED, "memfd_create for the emulated device", errno);
  }
  if (::ftruncate(memfd.get(), static_cast<off_t>(bytes)) != 0) {
    return errno_status(STRATA_E_NOMEM, "sizing the emulated device to " + format_bytes(bytes),
                        errno);
  }
  // Sparse: pages exist only once written, like host memory the emulated device really uses.
  void* base =
      ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, memfd.get(), 0);
  if (base == MAP_FAILED) {
    return errno_status(STRATA_E_NOMEM, "mapping the emulated device's " + format_bytes(bytes),
                        errno);
  }
  return std::unique_ptr<Device>(
      new EmulatedDevice(options, std::move(memfd), static_cast<std::byte*>(base), bytes));
}

}  // namespace strata::memory
