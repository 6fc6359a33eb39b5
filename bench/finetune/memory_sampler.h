// Host, pinned and device memory of a `strata bench finetune` worker process over time, as the
// OS reports it (/proc/self/status), sampled on its own thread.
//
// "Host" is RssAnon + RssFile + RssShmem less the emulated device's memfd (the memory standing in
// for a GPU is not host memory on a GPU machine). "Pinned" is VmLck (Strata's pinned arena and
// the DeepSpeed worker's pinned buffers mlock() what they map; nothing else in a worker locks
// memory) plus what a worker pinned where mlock was refused (set_unlocked_pinned: touched
// instead, so it is in RSS but not in VmLck).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"

namespace strata::bench::finetune {

struct MemoryReading {
  double seconds = 0;  // since the sampler started
  uint64_t host = 0;   // as defined above
  uint64_t pinned = 0;
  uint64_t device = 0;  // the emulated device's resident memory
};

struct MemoryPeaks {
  uint64_t host = 0;
  uint64_t pinned = 0;
  uint64_t device = 0;
  std::string host_moment;  // what the worker was doing when the host peak was sampled
};

class MemorySampler {
 public:
  // Every `interval` a sample; every `series_every`-th goes into the time series; `on_sample`
  // (may be empty) is called with a sample and the peaks so far (every sample's, the ones
  // between two reports included) at most every `report_interval`, on the sampler's thread.
  MemorySampler(std::chrono::microseconds interval, uint32_t series_every,
                std::chrono::milliseconds report_interval,
                std::function<void(const MemoryReading&, const MemoryPeaks&)> on_sample);
  ~MemorySampler();
  MemorySampler(const MemorySampler&) = delete;
  MemorySampler& operator=(const MemorySampler&) = delete;

  // The emulated device's memfd (-1: none, e.g. CUDA): its resident pages are left out of host.
  void set_device_fd(int fd) { device_fd_.store(fd, std::memory_order_relaxed); }
  // Bytes this worker holds as pinned without a lock (mlock refused), counted as pinned.
  void set_unlocked_pinned(uint64_t bytes);
  // What the worker is doing now ("step 2 backward", "start-up: ..."): a string that outlives
  // the sampler (a literal or a member), recorded beside each peak.
  void set_moment(const char* moment) { moment_.store(moment, std::memory_order_relaxed); }

  // Takes a sample now (callers that know when a spike peaks, e.g. an overflow-check temporary
  // at its fullest, call this there: the thread's interval would miss short spikes). It is
  // reported when the report interval has passed, or with `report` (a run's last sample, so that
  // the live metrics end at the run's totals).
  void sample_now(bool report = false);
  void stop();

  MemoryPeaks peaks() const;
  // Peaks since the last start_window() (e.g. over the training steps, leaving start-up out).
  void start_window();
  MemoryPeaks window_peaks() const;
  MemoryReading last() const;
  // The series, max-pooled down to at most `max_points` points.
  std::vector<MemoryReading> series(size_t max_points) const;

 private:
  void run();
  Result<MemoryReading> read() const;

  const std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();
  const std::chrono::microseconds interval_;
  const uint32_t series_every_;
  const std::chrono::milliseconds report_interval_;
  std::function<void(const MemoryReading&, const MemoryPeaks&)> on_sample_;
  std::atomic<int> device_fd_{-1};
  std::atomic<const char*> moment_{nullptr};
  std::atomic<uint64_t> unlocked_pinned_{0};

  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable wake_;
  bool stop_ = false;
  MemoryPeaks peaks_;
  MemoryPeaks window_;
  MemoryReading last_;
  std::vector<MemoryReading> series_;
  uint64_t samples_ = 0;
  std::chrono::steady_clock::time_point last_report_{};
  std::thread thread_;
};

// The fd of this process's emulated device memfd ("/memfd:strata-emulated-device"), or -1.
int find_emulated_device_fd();

}  // namespace strata::bench::finetune
