#include "finetune/deepspeed_host.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "finetune/memory_sampler.h"

namespace strata::bench::finetune {
namespace {

enum class Test : uint8_t { kInf, kNan };

// bf16 and fp16 bit tests, as torch.isinf / torch.isnan decide them.
inline uint8_t test(uint16_t h, Test which, bool fp16) {
  const uint16_t magnitude = h & 0x7FFFu;
  const uint16_t infinity = fp16 ? 0x7C00u : 0x7F80u;
  return which == Test::kInf ? magnitude == infinity : magnitude > infinity;
}

}  // namespace

Result<HostBlock> HostBlock::map(uint64_t bytes, bool lock) {
  if (bytes == 0) return invalid_argument("a host block of 0 bytes");
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return errno_status(STRATA_E_NOMEM, "mapping " + std::to_string(bytes) + " bytes", errno);
  }
  HostBlock block;
  block.data_ = static_cast<std::byte*>(p);
  block.size_ = bytes;
  // Pinned memory is resident by definition; without the privilege to lock, touching every page
  // makes it resident all the same, which is what the host-memory figures need.
  block.locked_ = lock && ::mlock(p, bytes) == 0;
  if (!block.locked_) std::memset(p, 0, bytes);
  return block;
}

HostBlock::HostBlock(HostBlock&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      locked_(std::exchange(other.locked_, false)) {}

HostBlock& HostBlock::operator=(HostBlock&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    locked_ = std::exchange(other.locked_, false);
  }
  return *this;
}

void HostBlock::reset() {
  if (data_ == nullptr) return;
  ::munmap(data_, size_);  // also unlocks
  data_ = nullptr;
  size_ = 0;
  locked_ = false;
}

Result<OverflowCheckResult> deepspeed_overflow_check(std::span<const GradientView> gradients,
                                                     optim::ThreadPool& pool,
                                                     MemorySampler& sampler) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<uint64_t> offsets(gradients.size() + 1, 0);
  for (size_t i = 0; i < gradients.size(); ++i) {
    offsets[i + 1] = offsets[i] + gradients[i].elements;
  }
  const uint64_t total = offsets.back();
  OverflowCheckResult result;
  result.temporary_bytes = total;
  if (total == 0) return result;
  const int threads = pool.threads();
  for (Test which : {Test::kInf, Test::kNan}) {
    // torch.empty(bool) then the elementwise kernel: pages are first touched by the writes.
    void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return errno_status(STRATA_E_NOMEM,
                          "the overflow check's " + std::to_string(total) + "-byte temporary",
                          errno);
    }
    auto* temp = static_cast<uint8_t*>(p);
    auto elementwise = [&](int t) {
      const uint64_t begin = total * static_cast<uint64_t>(t) / threads;
      const uint64_t end = total * static_cast<uint64_t>(t + 1) / threads;
      size_t g = static_cast<size_t>(std::upper_bound(offsets.begin(), offsets.end(), begin) -
                                     offsets.begin() - 1);
      for (uint64_t i = begin; i < end;) {
        const uint64_t stop = std::min(end, offsets[g + 1]);
        const uint16_t* data = gradients[g].data + (i - offsets[g]);
        for (uint64_t k = 0; k < stop - i; ++k)
          temp[i + k] = test(data[k], which, gradients[g].fp16);
        i = stop;
        ++g;
      }
    };
    pool.run_each(elementwise);
    sampler.sample_now();  // the temporary at its fullest
    std::atomic<bool> any{false};
    auto reduce = [&](int t) {
      const uint64_t begin = total * static_cast<uint64_t>(t) / threads;
      const uint64_t end = total * static_cast<uint64_t>(t + 1) / threads;
      uint8_t acc = 0;
      for (uint64_t i = begin; i < end; ++i) acc |= temp[i];
      if (acc != 0) any.store(true, std::memory_order_relaxed);
    };
    pool.run_each(reduce);
    ::munmap(p, total);
    result.found = result.found || any.load();
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace strata::bench::finetune
