// The host-side behaviour of DeepSpeed ZeRO-Infinity that lives outside its swapper, and so
// outside the runtime's ZERO_INFINITY policy, reproduced for the `zero-infinity` worker as
// /work/shared/reference/offload-baseline.md describes it. Modelled faithfully, not improved:
//  - its pinned blocks, held for the whole run: the parameter block (buffer_count uniform slots,
//    rounded to a power of two), buffer_count + 1 optimizer sub-group buffers (each rounded), the
//    flat gradient buffer (rounded);
//  - the startup copy: each block is built unpinned first, then copied into a new pinned block,
//    so for a moment both exist;
//  - the overflow check of loss scaling: an isinf() pass, then an isnan() pass, over all
//    gradients, each materialising a one-byte-per-element temporary that .any() then reads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "optim/thread_pool.h"
#include "sched/memory_plan.h"

namespace strata::bench::finetune {

class MemorySampler;

// One anonymous mapping, unmapped (and unlocked) on destruction.
class HostBlock {
 public:
  // Maps and touches `bytes`; with `lock`, tries mlock() as cudaHostAlloc would pin it.
  static Result<HostBlock> map(uint64_t bytes, bool lock);
  HostBlock() = default;
  HostBlock(HostBlock&& other) noexcept;
  HostBlock& operator=(HostBlock&& other) noexcept;
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;
  ~HostBlock() { reset(); }
  void reset();
  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  bool locked() const { return locked_; }

 private:
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
  bool locked_ = false;
};

class DeepSpeedHostBuffers {
 public:
  // Builds every pinned block of `plan` (the ZeRO-Infinity memory plan at this scale) the way
  // DeepSpeed does, reporting each to `sampler` as it appears. optimizer_buffers: how many
  // separate allocations the plan's optimizer pool reserves (buffer_count + 1).
  static Result<std::unique_ptr<DeepSpeedHostBuffers>> create(const sched::MemoryPlan& plan,
                                                              uint32_t optimizer_buffers,
                                                              MemorySampler& sampler);
  uint64_t bytes() const { return bytes_; }
  uint64_t locked_bytes() const { return locked_; }
  size_t blocks() const { return blocks_.size(); }

 private:
  DeepSpeedHostBuffers() = default;
  std::vector<HostBlock> blocks_;
  uint64_t bytes_ = 0;
  uint64_t locked_ = 0;
};

// A gradient as the overflow check sees it (bf16, resident in host memory).
struct GradientView {
  const uint16_t* data = nullptr;
  uint64_t elements = 0;
};

struct OverflowCheckResult {
  bool found = false;
  uint64_t temporary_bytes = 0;  // of each pass
  double seconds = 0;
};

// DeepSpeed's check: isinf pass then isnan pass, each into a fresh 1-byte-per-element temporary
// over all gradients, then .any() over it; the temporary is freed after each pass. Runs on the
// pool's threads (torch's intra-op parallelism). Samples memory at each temporary's fullest.
Result<OverflowCheckResult> deepspeed_overflow_check(std::span<const GradientView> gradients,
                                                     optim::ThreadPool& pool,
                                                     MemorySampler& sampler);

}  // namespace strata::bench::finetune
