// Exact byte counters per memory tier and per tensor kind, and the host memory the OS sees.
//
// Two views, kept apart on purpose:
//  - Accounting: what Strata itself holds, counted at every reserve / release. Exact, lock-free,
//    cheap enough for hot paths (relaxed atomics; a peak is a CAS-max).
//  - HostMemorySampler: what the kernel charges the process (/proc/self/status). This is the
//    number an OOM killer acts on, and what "peak host memory" claims must be measured with. The
//    host-emulated device's memory is excluded exactly: it lives in its own memfd, whose resident
//    size the kernel reports (st_blocks), so a CPU-only test run measures host memory as a GPU run
//    would.
#pragma once

#include <strata/strata.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "common/status.h"
#include "vocabulary/tensor_spec.h"
#include "vocabulary/tier.h"

namespace strata::memory {

class Device;

// reserved: held from the OS / the GPU / the NVMe space (what others cannot use).
// in_use: handed out to tensors inside what is reserved (what Strata needs right now).
struct TierCounters {
  uint64_t reserved_bytes = 0;
  uint64_t in_use_bytes = 0;
  uint64_t peak_reserved_bytes = 0;
  uint64_t peak_in_use_bytes = 0;
};

struct KindCounters {
  uint64_t in_use_bytes = 0;
  uint64_t peak_in_use_bytes = 0;
};

// Thread rules: every member may be called from any thread at any time. Counters never go below
// zero: releasing more than was added is a bug in the caller and trips an assertion.
class Accounting {
 public:
  Accounting() = default;
  Accounting(const Accounting&) = delete;
  Accounting& operator=(const Accounting&) = delete;

  void reserve(Tier tier, uint64_t bytes);
  void unreserve(Tier tier, uint64_t bytes);
  // In-use bytes count toward the tier and toward the kind within the tier.
  void use(Tier tier, TensorKind kind, uint64_t bytes);
  void unuse(Tier tier, TensorKind kind, uint64_t bytes);

  void add_nvme_read(uint64_t bytes) { nvme_read_.fetch_add(bytes, std::memory_order_relaxed); }
  void add_nvme_written(uint64_t bytes) {
    nvme_written_.fetch_add(bytes, std::memory_order_relaxed);
  }

  TierCounters tier(Tier tier) const;
  KindCounters kind(Tier tier, TensorKind kind) const;
  uint64_t nvme_bytes_read() const { return nvme_read_.load(std::memory_order_relaxed); }
  uint64_t nvme_bytes_written() const { return nvme_written_.load(std::memory_order_relaxed); }

  // Peaks restart from the current values (e.g. to measure one training step).
  void reset_peaks();

 private:
  struct KindSlot {
    std::atomic<uint64_t> in_use{0};
    std::atomic<uint64_t> peak{0};
  };
  // One cache line per tier so that pinned and device traffic do not false-share.
  struct alignas(64) TierSlot {
    std::atomic<uint64_t> reserved{0};
    std::atomic<uint64_t> in_use{0};
    std::atomic<uint64_t> peak_reserved{0};
    std::atomic<uint64_t> peak_in_use{0};
    std::array<KindSlot, kTensorKindCount> kinds;
  };
  std::array<TierSlot, kTierCount> tiers_;
  alignas(64) std::atomic<uint64_t> nvme_read_{0};
  std::atomic<uint64_t> nvme_written_{0};
};

// RAII: bytes in use for as long as the object lives (for callers that hold memory in scopes).
class ScopedUse {
 public:
  ScopedUse() = default;
  ScopedUse(Accounting* accounting, Tier tier, TensorKind kind, uint64_t bytes);
  ScopedUse(ScopedUse&& other) noexcept;
  ScopedUse& operator=(ScopedUse&& other) noexcept;
  ScopedUse(const ScopedUse&) = delete;
  ScopedUse& operator=(const ScopedUse&) = delete;
  ~ScopedUse() { reset(); }
  void reset();

 private:
  Accounting* accounting_ = nullptr;
  Tier tier_ = Tier::kHost;
  TensorKind kind_ = TensorKind::kOther;
  uint64_t bytes_ = 0;
};

// The memory lines of /proc/self/status, in bytes.
struct ProcMemory {
  uint64_t vm_rss = 0;     // VmRSS = RssAnon + RssFile + RssShmem
  uint64_t vm_hwm = 0;     // VmHWM: the kernel's peak of VmRSS
  uint64_t rss_anon = 0;   // private anonymous memory: heap, pinned arena
  uint64_t rss_file = 0;   // mapped files (the program, libraries)
  uint64_t rss_shmem = 0;  // shared memory, including the emulated device's memfd
  uint64_t vm_lck = 0;     // mlock()ed memory
};

// Reads /proc/self/status without allocating (safe to call from a sampling thread at any rate).
Result<ProcMemory> read_proc_memory();

// Host memory the process holds, not counting `device`'s backing memory: RssAnon + RssFile +
// (RssShmem - the device's resident shmem). Shared memory used by others (e.g. DataLoader
// workers' tensors) stays counted, so the subtraction is exact rather than "all shmem is ours".
uint64_t host_bytes_excluding(const ProcMemory& memory, const Device* device);

struct HostMemorySamplerOptions {
  std::chrono::microseconds interval{std::chrono::milliseconds(5)};
  // The device whose host-backed memory is excluded; must outlive the sampler. nullptr: none.
  const Device* excluded_device = nullptr;
};

// Samples process memory on its own thread and keeps the peak of host_bytes_excluding(). VmHWM is
// the kernel's exact peak of everything; this sampler's peak misses spikes shorter than the
// interval, so callers that know when a spike happens call sample_now() there.
class HostMemorySampler {
 public:
  explicit HostMemorySampler(const HostMemorySamplerOptions& options);
  ~HostMemorySampler();
  HostMemorySampler(const HostMemorySampler&) = delete;
  HostMemorySampler& operator=(const HostMemorySampler&) = delete;

  void sample_now();
  uint64_t peak_host_bytes_excluding_device() const {
    return peak_.load(std::memory_order_relaxed);
  }
  uint64_t samples() const { return samples_.load(std::memory_order_relaxed); }
  const Device* excluded_device() const { return options_.excluded_device; }
  void reset_peak();

 private:
  void run();

  HostMemorySamplerOptions options_;
  std::atomic<uint64_t> peak_{0};
  std::atomic<uint64_t> samples_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

// Fills a caller's strata_stats (any struct_size from the first published version on) from the
// counters: the internal half of strata_get_stats. device: the runtime's device, whose
// host-backed memory (emulated) is left out of the host figures; sampler: the runtime's sampler
// (its peak); either may be nullptr. Returns STRATA_OK or STRATA_E_INVALID.
int fill_stats(const Accounting& accounting, const Device* device, HostMemorySampler* sampler,
               strata_stats* out);

}  // namespace strata::memory
