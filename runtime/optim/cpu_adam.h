// CpuAdam: Adam / AdamW on fp32 master weights and states in host memory, plus the fused
// overflow check and gradient norm that decide whether (and how scaled) a step happens.
//
// One pass per step over each slice reads param, m, v and the gradient (fp32, bf16 or fp16),
// folds in the loss-scale unscaling and clipping factor (AdamWParams::grad_scale), writes
// param, m, v, and optionally the bf16/fp16 copy of the new weights for the device. The scheduler
// calls step() on sub-group slices as they arrive from NVMe; any split of a tensor into slices
// gives the same bits as one call on the whole.
//
// Results are bit-identical across SIMD levels and thread counts (see adamw_element.h); the
// gradient sum of squares is identical across thread counts for a given SIMD level.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "optim/adamw.h"
#include "optim/simd_level.h"
#include "optim/thread_pool.h"

namespace strata::optim {

namespace detail {
struct KernelTable;
}

struct CpuAdamOptions {
  // Threads that execute a step; 0: one per core (of numa_node, else of the affinity mask).
  int threads = 0;
  // Force an instruction set (tests, `strata bench adam --simd`); nullopt: the best supported.
  std::optional<SimdLevel> simd;
  // >= 0: bind the threads to this node's cores, the node holding the buffers.
  int numa_node = -1;
};

class CpuAdam {
 public:
  // Fails when the forced SIMD level is not supported here, the node does not exist, or threads
  // cannot be started.
  static Result<std::unique_ptr<CpuAdam>> create(const CpuAdamOptions& options = {});

  // Updates every slice in place. All arguments are validated before any byte is written, so a
  // failed call leaves the buffers untouched. Slices must not overlap one another (each is
  // checked on its own; two slices sharing memory would race). Allocates nothing once the number
  // of slices per call has been seen. Thread-safe; concurrent calls run one after the other.
  Status step(const AdamWParams& params, std::span<const AdamWSlice> slices);

  // How a traffic pass issues the step's loads: with the update's own loop (its prefetches, if
  // any), or that loop with every read stream also prefetched ahead in software.
  enum class TrafficLoop : uint8_t { kTheUpdates, kPrefetched };

  // The memory traffic of step() without its arithmetic: the same slices, threads, chunks, loads,
  // prefetches and stores (streaming ones included), with p, m, v += scale * g and the copy
  // written from p. `strata bench adam` times both loops and holds step() to the faster; scale 0
  // leaves the values as they were (but -0 becomes +0). Validates the slices as step() does;
  // kPrefetched is STRATA_E_UNSUPPORTED where has_prefetched_traffic() is false.
  Status step_traffic(float scale, std::span<const AdamWSlice> slices,
                      TrafficLoop loop = TrafficLoop::kTheUpdates);
  // Whether this SIMD level has a kPrefetched pass distinct from its update's loop (AVX-512;
  // AVX2's update prefetches already, the scalar loop is not limited by memory).
  bool has_prefetched_traffic() const;

  // One read-only pass over the gradients: any NaN/infinity, and the sum of squares in double.
  Result<GradStats> grad_stats(std::span<const GradSlice> slices);

  SimdLevel simd_level() const { return level_; }
  int threads() const { return pool_->threads(); }
  // The pool the steps run on; `strata bench adam` measures memory bandwidth with it.
  ThreadPool& pool() { return *pool_; }
  // a[i] = b[i] + scalar * c[i] on this instance's threads and SIMD level (the STREAM triad).
  void triad(float* a, const float* b, const float* c, float scalar, size_t n, bool streaming);

  ~CpuAdam();
  CpuAdam(const CpuAdam&) = delete;
  CpuAdam& operator=(const CpuAdam&) = delete;

  // Elements per unit of work a thread claims in step(): 256K fp32 elements, 1 MiB of each
  // stream. With several threads a thread's next chunk does not follow its last one, so each
  // chunk starts its seven streams cold (the hardware prefetchers retrain, the software
  // prefetch has nothing in flight). At 32K (128 KiB) two threads ran 5-7% slower than at 256K
  // or at one half each; one thread, whose chunks follow each other, ran the same at every size
  // (A/B runs, docs/optimizer.md). 256K still gives a 4 MiB call four chunks to balance.
  static constexpr uint64_t kStepChunk = uint64_t{256} * 1024;
  // grad_stats() sums fixed blocks whose boundaries depend only on the total length, so the
  // result does not depend on the number of threads; at most kMaxBlocks partial sums.
  static constexpr uint64_t kMinStatsBlock = uint64_t{16} * 1024;
  static constexpr uint64_t kMaxStatsBlocks = 4096;

 private:
  CpuAdam(SimdLevel level, const detail::KernelTable* kernels, std::unique_ptr<ThreadPool> pool);
  // traffic: the pass to run instead of the update (none: the update).
  Status run_step(const AdamWConstants& constants, std::optional<TrafficLoop> traffic,
                  std::span<const AdamWSlice> slices);
  // Prefix sums of slice lengths; grows only when a call has more slices than any before.
  template <typename Slice>
  uint64_t build_prefix(std::span<const Slice> slices);

  const SimdLevel level_;
  const detail::KernelTable* const kernels_;
  std::unique_ptr<ThreadPool> pool_;
  std::mutex mutex_;  // guards the workspace below
  std::vector<uint64_t> prefix_;
  std::unique_ptr<double[]> partials_;
};

}  // namespace strata::optim
