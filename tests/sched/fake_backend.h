// Test double for TierBackend that really stores bytes: pinned and "device" buffers are host
// memory, NVMe extents are byte vectors. Transfers run on a worker thread (memcpy, optionally
// slowed down) and complete through post_completion, like a real backend. Faults can be injected
// per link; a failed transfer scribbles over its destination, so a scheduler that trusted it
// would be caught.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "memory/range_allocator.h"
#include "sched/tier_backend.h"

namespace strata::sched::testing {

class FakeBackend final : public TierBackend {
 public:
  explicit FakeBackend(uint32_t max_delay_us = 0);
  ~FakeBackend() override;

  const char* name() const override { return "fake"; }
  Result<Buffer> allocate(Tier tier, uint64_t bytes, TensorKind kind) override;
  void free(Tier tier, const Buffer& buffer) override;
  Result<Extent> allocate_extent(uint64_t bytes) override;
  void free_extent(const Extent& extent) override;
  Status read(const Extent& from, const Buffer& to_pinned, uint64_t bytes,
              Completion done) override;
  Status write(const Buffer& from_pinned, const Extent& to, uint64_t bytes,
               Completion done) override;
  Status copy_to_device(const Buffer& from_pinned, const Buffer& to_device, uint64_t bytes,
                        Completion done) override;
  Status copy_to_host(const Buffer& from_device, const Buffer& to_pinned, uint64_t bytes,
                      Completion done) override;
  Status copy_range(Link link, const Buffer& from, uint64_t from_offset, const Buffer& to,
                    uint64_t to_offset, uint64_t bytes, Completion done) override;
  // A stream is one job on its NVMe link (faults injected there), straight between the extent
  // and the device buffer; counted on the device link too, and in streams().
  Status stream_to_device(const Extent& from, const Buffer& to_device, uint64_t bytes,
                          Completion done) override;
  Status stream_to_nvme(const Buffer& from_device, const Extent& to, uint64_t bytes,
                        Completion done) override;
  LinkCounters link_counters(Link link) const override;

  // The next `count` transfers on `link` fail with `code` (STRATA_E_IO, STRATA_E_CORRUPT, ...).
  void fail_next(Link link, int code, uint32_t count = 1);
  // The next `count` extent allocations fail with STRATA_E_NOSPACE.
  void fail_next_extent_allocations(uint32_t count);
  // The next `count` buffer allocations on `tier` fail with STRATA_E_NOMEM (the host or its
  // lock limit refusing memory the pool's budget allows).
  void fail_next_allocations(Tier tier, uint32_t count);
  // From now on, device buffers are carved from one slab of `capacity` bytes by the device
  // arena's RangeAllocator (256-byte aligned), as the real device backends do: an allocation
  // fails with STRATA_E_DEVICE_BUDGET when no free range is large enough, however many bytes
  // are free. Call before the first device allocation.
  void use_device_slab(uint64_t capacity);
  // The largest free range of the slab (0 without one).
  uint64_t largest_free_device_range() const;
  // While paused, transfers queue without running (to observe in-flight states).
  void pause(bool paused);

  uint64_t live_buffers() const { return live_buffers_.load(); }
  uint64_t live_extents() const;
  uint64_t transfers(Link link) const { return link_counters(link).transfers; }
  uint64_t failures() const { return failures_.load(); }
  uint64_t streams() const { return streams_.load(); }  // streamed transfers completed

 private:
  struct Job {
    Link link;
    const uint8_t* source = nullptr;  // memory source (write, copies)
    uint8_t* destination = nullptr;   // memory destination (read, copies)
    uint64_t extent = 0;              // extent token (read source / write destination)
    uint64_t bytes = 0;
    Completion done;
    bool streamed = false;  // an NVMe link job whose memory side is a device buffer
  };
  Status enqueue(Job job);
  void run();

  uint32_t max_delay_us_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Job> jobs_;
  bool stop_ = false;
  bool paused_ = false;
  std::map<uint64_t, std::vector<uint8_t>> extents_;
  uint64_t next_token_ = 1;
  uint32_t fail_count_[kLinkCount] = {};
  int fail_code_[kLinkCount] = {};
  uint32_t extent_failures_ = 0;
  uint32_t allocation_failures_[kTierCount] = {};
  LinkCounters counters_[kLinkCount];
  std::unique_ptr<memory::RangeAllocator> device_ranges_;  // guarded by mu_; null: no slab
  std::unique_ptr<std::byte[]> device_slab_;
  std::atomic<uint64_t> live_buffers_{0};
  std::atomic<uint64_t> failures_{0};
  std::atomic<uint64_t> streams_{0};
  std::thread worker_;
};

}  // namespace strata::sched::testing
