// Pinned host memory: exact-size, page-aligned, NUMA-placed, DMA-ready, under a hard budget.
//
// Each allocation is its own anonymous mapping of the requested size rounded up to 4 KiB (never
// to a power of two: PyTorch's caching host allocator wastes up to half of what it pins that way),
// bound to one NUMA node, locked (mlock), registered with the GPU (cudaHostRegister, via the
// Device) and with the I/O engine as fixed buffers, so that NVMe -> pinned -> GPU needs no bounce
// buffer anywhere. Allocation is a cold path (mmap, mlock, registration take milliseconds per
// GiB): the recycler (pinned_recycler.h) keeps what it maps here and hands it out again.
//
// The budget is enforced before any memory is touched: a request past it fails with
// STRATA_E_PINNED_BUDGET and the numbers, never with the OOM killer. A locking failure
// (RLIMIT_MEMLOCK) is STRATA_E_LIMIT with the numbers and what to change.
//
// Thread rules: allocate / release from any thread, concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "memory/numa.h"

namespace strata::io {
class IoEngine;
}

namespace strata::memory {

class Device;
class PinnedArena;

// io_uring's limit for one fixed buffer; larger allocations register in chunks of this size.
inline constexpr uint64_t kIoRegistrationChunk = uint64_t{1} << 30;

// The transparent huge page size of x86-64 and of arm64 with 4 KiB base pages.
inline constexpr uint64_t kHugePageSize = uint64_t{2} << 20;

struct PinnedArenaOptions {
  uint64_t budget_bytes = 0;  // hard limit on bytes mapped (4 KiB-rounded); must be > 0
  // NUMA node for every allocation: >= 0 that node; -1 the node nearest the device's GPU (by its
  // PCI bus id), else the creating thread's node.
  int numa_node = -1;
  bool bind_numa = true;              // false: leave placement to first touch
  bool require_numa_binding = false;  // true: fail where binding is not possible (else warn once)
  // mlock every allocation so that it is resident and never swapped before the GPU or the
  // kernel pins it. false: leave pages unpopulated until touched (dry runs, tests).
  bool lock_pages = true;
  // Back buffers of 2 MiB and more with transparent huge pages (2 MiB-aligned, MADV_HUGEPAGE):
  // far fewer faults to lock and register them. Where THP is off the advice is ignored.
  bool huge_pages = true;
  Device* device = nullptr;           // registers allocations with the GPU; may be nullptr
  io::IoEngine* io_engine = nullptr;  // registers allocations as fixed buffers; may be nullptr
};

// One allocation (RAII: unregistered, unmapped and given back to the budget with the handle).
// Move-only. Must not outlive its arena.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { reset(); }

  bool valid() const { return data_ != nullptr; }
  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }                // bytes asked for
  uint64_t reserved_bytes() const { return reserved_; }  // size rounded up to 4 KiB
  // The engine's fixed-buffer index covering [offset, offset + length) of this buffer, or -1 when
  // the buffer is not registered or the range crosses a registration chunk (kIoRegistrationChunk):
  // callers then split the request at the chunk boundary or submit it unregistered.
  int32_t io_buffer_index(uint64_t offset, uint64_t length) const;
  void reset();

 private:
  friend class PinnedArena;
  PinnedArena* arena_ = nullptr;
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
  uint64_t reserved_ = 0;
  bool device_registered_ = false;
  std::vector<int32_t> io_indices_;  // one per registration chunk, -1 where it failed
};

struct PinnedArenaStats {
  uint64_t budget_bytes = 0;
  uint64_t reserved_bytes = 0;   // mapped now (4 KiB-rounded)
  uint64_t requested_bytes = 0;  // asked for by the live allocations
  uint64_t peak_reserved_bytes = 0;
  uint64_t allocations = 0;  // live
  uint64_t io_registration_failures = 0;
};

class PinnedArena {
 public:
  // Loads the system topology and decides the NUMA node once.
  static Result<std::unique_ptr<PinnedArena>> create(const PinnedArenaOptions& options);
  ~PinnedArena();
  PinnedArena(const PinnedArena&) = delete;
  PinnedArena& operator=(const PinnedArena&) = delete;

  // Maps, locks and registers `bytes` (rounded up to 4 KiB) of pinned memory. The arena counts
  // what it has mapped (stats(): strata_get_stats' pinned "reserved"); what each buffer is used
  // for is the scheduler's record, not the arena's.
  Result<PinnedBuffer> allocate(uint64_t bytes);

  PinnedArenaStats stats() const;
  uint64_t budget_bytes() const { return options_.budget_bytes; }
  int numa_node() const { return numa_node_; }
  const std::string& numa_reason() const { return numa_reason_; }
  // Whether allocations are actually bound to numa_node() (binding can be unavailable, e.g. in
  // containers without mbind).
  bool numa_bound() const { return numa_bound_.load(std::memory_order_relaxed); }

 private:
  friend class PinnedBuffer;
  PinnedArena(const PinnedArenaOptions& options, HwlocTopology topology, int node,
              std::string reason);
  void release(PinnedBuffer& buffer) noexcept;
  Status reserve_budget(uint64_t bytes, uint64_t reserved);
  // An anonymous mapping of exactly `bytes` (a multiple of 4 KiB); 2 MiB-aligned when `huge`.
  static Result<std::byte*> map_pages(uint64_t bytes, int flags, bool huge);
  void bind(std::byte* data, uint64_t bytes);

  PinnedArenaOptions options_;
  HwlocTopology topology_;
  int numa_node_;
  std::string numa_reason_;
  hwloc_bitmap_t nodeset_ = nullptr;
  std::atomic<bool> numa_bound_{true};
  std::atomic<bool> warned_numa_{false};
  std::atomic<bool> warned_io_{false};

  std::atomic<uint64_t> reserved_{0};
  std::atomic<uint64_t> requested_{0};
  std::atomic<uint64_t> peak_reserved_{0};
  std::atomic<uint64_t> allocations_{0};
  std::atomic<uint64_t> io_failures_{0};
};

}  // namespace strata::memory
