// The host memory the OS charges the process, and its peak, sampled.
//
// This is the number an OOM killer acts on, and what "peak host memory" claims must be measured
// with (Strata's own record of what it holds is memory/reservations.h and the scheduler). The
// host-emulated device's memory is excluded exactly: it lives in its own memfd, whose resident
// size the kernel reports (st_blocks), so a CPU-only test run measures host memory as a GPU run
// would.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "common/status.h"

namespace strata::memory {

class Device;

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

}  // namespace strata::memory
