// Two pieces of DeepSpeed's host-side behaviour for the baseline worker: a host block as torch
// allocates one (pinned or pageable, resident), and the fp16 overflow check of loss scaling: an
// isinf() pass, then an isnan() pass, over all gradients, each materialising a
// one-byte-per-element temporary that .any() then reads (stage3.py:2208-2218).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "optim/thread_pool.h"

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

// A gradient as the overflow check sees it (bf16 or fp16, resident in host memory).
struct GradientView {
  const uint16_t* data = nullptr;
  uint64_t elements = 0;
  bool fp16 = false;  // else bf16
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
