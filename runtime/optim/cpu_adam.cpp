#include "optim/cpu_adam.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>

#include "common/assert.h"
#include "optim/adam_kernels.h"

namespace strata::optim {
namespace {

int grad_index(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 0;
    case DType::kBFloat16:
      return 1;
    case DType::kFloat16:
      return 2;
    default:
      break;
  }
  STRATA_ASSERT(false && "gradient dtype was validated");
  return 0;
}

int out_index(const AdamWSlice& s) {
  if (s.param_out == nullptr) return 0;
  return s.param_out_dtype == DType::kBFloat16 ? 1 : 2;
}

const detail::KernelTable& kernels_for(SimdLevel level) {
  switch (level) {
#if defined(STRATA_OPTIM_X86)
    case SimdLevel::kAvx512:
      return detail::avx512_kernels();
    case SimdLevel::kAvx2:
      return detail::avx2_kernels();
#endif
    default:
      return detail::scalar_kernels();
  }
}

// Walks the elements [begin, end) of the concatenation of slices, calling fn(slice, offset, count)
// for each piece that lies in one slice.
template <typename Slice, typename Fn>
void for_each_segment(std::span<const Slice> slices, const uint64_t* prefix, uint64_t begin,
                      uint64_t end, Fn&& fn) {
  // The last slice whose start is <= begin (empty slices share starts; skip past them).
  size_t s =
      static_cast<size_t>(std::upper_bound(prefix, prefix + slices.size() + 1, begin) - prefix) - 1;
  while (begin < end) {
    STRATA_ASSERT(s < slices.size());
    const uint64_t stop = std::min(end, prefix[s + 1]);
    if (stop > begin) fn(slices[s], begin - prefix[s], stop - begin);
    begin = stop;
    ++s;
  }
}

struct StepJob {
  const detail::KernelTable* kernels;
  AdamWConstants constants;
  bool l2;
  // The traffic pass's kernels instead of the update's (null: the update).
  const detail::TrafficKernel (*traffic)[detail::kOutKinds] = nullptr;
  std::span<const AdamWSlice> slices;
  const uint64_t* prefix;
  uint64_t total;
  std::atomic<uint64_t> next{0};

  void run_chunks() {
    const uint64_t chunks = (total + CpuAdam::kStepChunk - 1) / CpuAdam::kStepChunk;
    for (uint64_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      const uint64_t begin = c * CpuAdam::kStepChunk;
      const uint64_t end = std::min(total, begin + CpuAdam::kStepChunk);
      for_each_segment(
          slices, prefix, begin, end, [&](const AdamWSlice& s, uint64_t offset, uint64_t count) {
            const size_t grad_bytes = dtype_size(s.grad_dtype);
            const int out = out_index(s);
            void* param_out = out == 0 ? nullptr : static_cast<uint16_t*>(s.param_out) + offset;
            const int g = grad_index(s.grad_dtype);
            const detail::AdamWKernel kernel =
                traffic != nullptr ? traffic[g][out] : kernels->adamw[g][out][l2 ? 1 : 0];
            kernel(constants, s.param + offset, s.m + offset, s.v + offset,
                   static_cast<const unsigned char*>(s.grad) + offset * grad_bytes, param_out,
                   count);
          });
    }
  }
};

struct StatsJob {
  const detail::KernelTable* kernels;
  std::span<const GradSlice> slices;
  const uint64_t* prefix;
  uint64_t total;
  uint64_t block;
  uint64_t blocks;
  double* partials;
  std::atomic<uint64_t> next{0};

  void run_blocks() {
    for (uint64_t b = next.fetch_add(1, std::memory_order_relaxed); b < blocks;
         b = next.fetch_add(1, std::memory_order_relaxed)) {
      const uint64_t begin = b * block;
      const uint64_t end = std::min(total, begin + block);
      double sum = 0;
      for_each_segment(
          slices, prefix, begin, end, [&](const GradSlice& s, uint64_t offset, uint64_t count) {
            const auto* data =
                static_cast<const unsigned char*>(s.data) + offset * dtype_size(s.dtype);
            sum += kernels->sum_squares[grad_index(s.dtype)](data, count);
          });
      partials[b] = sum;
    }
  }
};

struct TriadJob {
  detail::TriadKernel triad;
  float* a;
  const float* b;
  const float* c;
  float scalar;
  uint64_t n;
  bool streaming;
  std::atomic<uint64_t> next{0};

  void run_chunks() {
    // Chunks of 4 MiB of `a`, 64-byte aligned relative to a, so streaming stores need no peel.
    constexpr uint64_t kChunk = uint64_t{1} << 20;
    const uint64_t chunks = (n + kChunk - 1) / kChunk;
    for (uint64_t i = next.fetch_add(1, std::memory_order_relaxed); i < chunks;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      const uint64_t begin = i * kChunk;
      triad(a + begin, b + begin, c + begin, scalar, std::min(n, begin + kChunk) - begin,
            streaming);
    }
  }
};

}  // namespace

CpuAdam::CpuAdam(SimdLevel level, const detail::KernelTable* kernels,
                 std::unique_ptr<ThreadPool> pool)
    : level_(level), kernels_(kernels), pool_(std::move(pool)) {}

CpuAdam::~CpuAdam() = default;

Result<std::unique_ptr<CpuAdam>> CpuAdam::create(const CpuAdamOptions& options) {
  const SimdLevel level = options.simd.value_or(best_simd_level());
  if (!cpu_supports(level)) {
    return unsupported(std::string("CPU optimizer: SIMD level '") + to_string(level) +
                       "' is not supported by this CPU (best: " + simd_level_name() + ")");
  }
  if (options.threads < 0) {
    return invalid_argument("CPU optimizer: threads must be >= 0, got " +
                            std::to_string(options.threads));
  }
  STRATA_ASSIGN_OR_RETURN(auto pool, ThreadPool::create(options.threads, options.numa_node));
  std::unique_ptr<CpuAdam> adam(new CpuAdam(level, &kernels_for(level), std::move(pool)));
  adam->prefix_.reserve(1024);
  adam->partials_ = std::make_unique<double[]>(kMaxStatsBlocks);
  return adam;
}

template <typename Slice>
uint64_t CpuAdam::build_prefix(std::span<const Slice> slices) {
  prefix_.resize(slices.size() + 1);
  uint64_t total = 0;
  prefix_[0] = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    total += slices[i].n;
    prefix_[i + 1] = total;
  }
  return total;
}

Status CpuAdam::step(const AdamWParams& params, std::span<const AdamWSlice> slices) {
  STRATA_TRY(validate(params));
  return run_step(derive_constants(params), std::nullopt, slices);
}

bool CpuAdam::has_prefetched_traffic() const {
  return kernels_->traffic_prefetched[0][0] != nullptr;
}

Status CpuAdam::step_traffic(float scale, std::span<const AdamWSlice> slices, TrafficLoop loop) {
  if (!std::isfinite(scale)) return invalid_argument("step_traffic: the scale must be finite");
  if (loop == TrafficLoop::kPrefetched && !has_prefetched_traffic()) {
    return unsupported(std::string("step_traffic: the ") + to_string(level_) +
                       " kernels have no prefetched traffic pass (their update's loop is the one)");
  }
  AdamWConstants constants{};
  constants.grad_scale = scale;
  return run_step(constants, loop, slices);
}

Status CpuAdam::run_step(const AdamWConstants& constants, std::optional<TrafficLoop> traffic,
                         std::span<const AdamWSlice> slices) {
  for (const AdamWSlice& s : slices) STRATA_TRY(validate(s));

  std::lock_guard lock(mutex_);
  StepJob job;
  job.kernels = kernels_;
  job.constants = constants;
  job.l2 = job.constants.l2 != 0.0f;
  if (traffic) {
    job.traffic =
        *traffic == TrafficLoop::kPrefetched ? kernels_->traffic_prefetched : kernels_->traffic;
  }
  job.slices = slices;
  job.total = build_prefix(slices);
  job.prefix = prefix_.data();
  if (job.total == 0) return Status::ok();
  if (job.total <= kStepChunk || pool_->threads() == 1) {
    job.run_chunks();  // not worth waking the workers
  } else {
    pool_->run([](void* context, int) { static_cast<StepJob*>(context)->run_chunks(); }, &job);
  }
  return Status::ok();
}

Result<GradStats> CpuAdam::grad_stats(std::span<const GradSlice> slices) {
  for (const GradSlice& s : slices) STRATA_TRY(validate(s));

  std::lock_guard lock(mutex_);
  StatsJob job;
  job.kernels = kernels_;
  job.slices = slices;
  job.total = build_prefix(slices);
  job.prefix = prefix_.data();
  // The block size is a function of the total alone: the same blocks, the same partial sums and
  // the same final order whatever the number of threads.
  const uint64_t per_block = (job.total + kMaxStatsBlocks - 1) / kMaxStatsBlocks;
  job.block =
      std::max(kMinStatsBlock, (per_block + kMinStatsBlock - 1) / kMinStatsBlock * kMinStatsBlock);
  job.blocks = (job.total + job.block - 1) / job.block;
  STRATA_ASSERT(job.blocks <= kMaxStatsBlocks);
  job.partials = partials_.get();
  if (job.blocks <= 1 || pool_->threads() == 1) {
    job.run_blocks();
  } else {
    pool_->run([](void* context, int) { static_cast<StatsJob*>(context)->run_blocks(); }, &job);
  }
  GradStats stats;
  for (uint64_t b = 0; b < job.blocks; ++b) stats.sum_squares += job.partials[b];
  // Squares of finite fp32 values are finite in double and their sum cannot overflow it, so the
  // sum is not finite exactly when some element was NaN or infinite: the overflow check is free.
  stats.found_nonfinite = !std::isfinite(stats.sum_squares);
  return stats;
}

void CpuAdam::triad(float* a, const float* b, const float* c, float scalar, size_t n,
                    bool streaming) {
  std::lock_guard lock(mutex_);
  TriadJob job{kernels_->triad, a, b, c, scalar, n, streaming};
  pool_->run([](void* context, int) { static_cast<TriadJob*>(context)->run_chunks(); }, &job);
}

}  // namespace strata::optim
