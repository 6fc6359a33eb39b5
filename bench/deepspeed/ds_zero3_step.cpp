// ds_zero3_step: DeepSpeed's CPU optimizer step as ZeRO-3 runs it for each sub-group of a
// 16-bit model with the optimizer offloaded (DeepSpeed 0.16.5, commit 38327e07f), timed on this
// machine with DeepSpeed's own kernel (csrc/adam/cpu_adam_impl.cpp, unmodified, built by
// bench/deepspeed/zero3-step-compare.sh with DeepSpeed's flags) and the torch operations
// DeepSpeed calls around it. Not compiled by CMake: it needs libtorch and DeepSpeed's sources.
//
// One step, per DeepSpeedZeroOptimizer_Stage3.step (deepspeed/runtime/zero/stage3.py:2113-2126),
// over one sub-group of N elements:
//   1. unscale_and_clip_grads: fp32_grad.mul_(1. / combined_scale)            (stage3.py:2187)
//      (unconditional; combined_scale is the loss scale, 1.0 for bf16, times the clip factor)
//   2. _optimizer_step -> DeepSpeedCPUAdam.step -> ds_opt_adam.adam_update     (stage3.py:2120,
//      cpu_adam.py:163): the kernel on fp32 master, fp32 gradient, exp_avg, exp_avg_sq
//   3. _reassign_or_swap_out_partitioned_parameters:
//      fp16_partitioned_groups_flat[i].data.copy_(fp32_partitioned_groups_flat[i].data)
//      (stage3.py:2071-2072; a partitioned parameter is copied the same way, stage3.py:1008, and
//      one swapped out into its 16-bit swap buffer, partitioned_param_swapper.py:413-415 ->
//      swap_tensor/utils.py:52)
// What DeepSpeed does outside that loop is left out here, as Strata's equivalents are left out of
// `strata bench adam`: the gradient's up-cast to fp32 during backward (stage3.py:1515), the norm
// and the fp16 overflow check.
//
//   usage: ds_zero3_step N STEPS bf16|fp16
//     N: elements; STEPS: timed steps after 2 warm-up steps; the 16-bit weight copy's dtype.
//   Threads: OMP_NUM_THREADS (DeepSpeed's kernel is an OpenMP loop; torch's CPU operations use
//   the same pool). Every array is an anonymous mmap with MADV_HUGEPAGE, as `strata bench adam`
//   gives its arrays, first touched by the threads that use it.
//
// Prints one JSON line. Exit status 0 ok, 2 usage, 3 the result disagrees with a double-precision
// AdamW reference or the 16-bit copy is not the rounded master (the step did not do the work it
// was timed for).
#include <ATen/Parallel.h>
#include <omp.h>
#include <sys/mman.h>
#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_adam.h"

namespace {

// The workload of `strata bench adam` (bench/adam_bench.cpp): AdamW with decoupled weight decay.
constexpr float kLr = 1e-3f, kBeta1 = 0.9f, kBeta2 = 0.999f, kEps = 1e-8f, kWd = 0.01f;
constexpr int kWarmup = 2;
// bf16 training runs with loss scale 1 and no clipping in this comparison; the multiply runs all
// the same (stage3.py:2187 has no shortcut), and its cost does not depend on the factor.
constexpr double kCombinedScale = 1.0;

float init_param(int64_t i) {
  return static_cast<float>(i % 2001 - 1000) * 1e-3f;
}
float init_grad(int64_t i) {
  return static_cast<float>(i % 997 - 498) * 1e-4f;
}

void* map_thp(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("ds_zero3_step: mmap");
    std::exit(1);
  }
  (void)madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// torch.optim.AdamW's formula in double precision (the one DeepSpeed's kernel implements).
double reference_param(int64_t i, int total_steps) {
  double p = init_param(i), m = 0, v = 0;
  const double g = init_grad(i);
  for (int t = 1; t <= total_steps; ++t) {
    p -= static_cast<double>(kLr) * kWd * p;
    m = kBeta1 * m + (1.0 - kBeta1) * g;
    v = kBeta2 * v + (1.0 - kBeta2) * g * g;
    const double bc1 = 1.0 - std::pow(static_cast<double>(kBeta1), t);
    const double bc2 = 1.0 - std::pow(static_cast<double>(kBeta2), t);
    p -= kLr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + kEps);
  }
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 || (std::strcmp(argv[3], "bf16") != 0 && std::strcmp(argv[3], "fp16") != 0)) {
    std::fprintf(stderr, "usage: %s N STEPS bf16|fp16\n", argv[0]);
    return 2;
  }
  char* end = nullptr;
  const long long n_arg = std::strtoll(argv[1], &end, 10);
  const int steps = std::atoi(argv[2]);
  if (*end != '\0' || n_arg < 1 || steps < 1) {
    std::fprintf(stderr, "ds_zero3_step: N and STEPS must be positive integers\n");
    return 2;
  }
  const int64_t n = n_arg;
  const bool bf16 = std::strcmp(argv[3], "bf16") == 0;
  at::set_num_threads(omp_get_max_threads());

  const size_t fp32_bytes = static_cast<size_t>(n) * sizeof(float);
  auto fp32 = torch::TensorOptions().dtype(torch::kFloat32);
  auto half = torch::TensorOptions().dtype(bf16 ? torch::kBFloat16 : torch::kFloat16);
  torch::Tensor p = torch::from_blob(map_thp(fp32_bytes), {n}, fp32);
  torch::Tensor g = torch::from_blob(map_thp(fp32_bytes), {n}, fp32);
  torch::Tensor m = torch::from_blob(map_thp(fp32_bytes), {n}, fp32);
  torch::Tensor v = torch::from_blob(map_thp(fp32_bytes), {n}, fp32);
  torch::Tensor lp = torch::from_blob(map_thp(static_cast<size_t>(n) * 2), {n}, half);
  float* pp = p.data_ptr<float>();
  float* gp = g.data_ptr<float>();
  float* mp = m.data_ptr<float>();
  float* vp = v.data_ptr<float>();
  auto* lpp = static_cast<uint16_t*>(lp.data_ptr());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {  // first touch on the threads that will stream them
    pp[i] = init_param(i);
    gp[i] = init_grad(i);
    mp[i] = 0;
    vp[i] = 0;
    lpp[i] = 0;
  }

  create_adam_optimizer(0, kLr, kBeta1, kBeta2, kEps, kWd, /*adamw_mode=*/true,
                        /*should_log=*/false);
  std::vector<double> times, unscale_times, kernel_times, copy_times;
  for (int k = 0; k < kWarmup + steps; ++k) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    g.mul_(1. / kCombinedScale);
    const auto t1 = clock::now();
    ds_adam_step(0, static_cast<size_t>(k + 1), kLr, kBeta1, kBeta2, kEps, kWd,
                 /*bias_correction=*/true, p, g, m, v);
    const auto t2 = clock::now();
    lp.copy_(p);
    const auto t3 = clock::now();
    if (k < kWarmup) continue;
    auto seconds = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
    times.push_back(seconds(t0, t3));
    unscale_times.push_back(seconds(t0, t1));
    kernel_times.push_back(seconds(t1, t2));
    copy_times.push_back(seconds(t2, t3));
  }
  destroy_adam_optimizer(0);

  // Sampled elements, the last ones included (DeepSpeed's scalar tail): the master against the
  // reference, the copy against the master rounded by torch.
  double max_err = 0;
  int64_t copy_mismatches = 0;
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < n; i += std::max<int64_t>(1, n / 4096)) idx.push_back(i);
  for (int64_t i = std::max<int64_t>(0, n - 300); i < n; ++i) idx.push_back(i);
  const torch::Tensor rounded = p.to(half.dtype());
  const auto* rounded_bits = static_cast<const uint16_t*>(rounded.data_ptr());
  for (int64_t i : idx) {
    max_err = std::max(max_err,
                       std::fabs(static_cast<double>(pp[i]) - reference_param(i, kWarmup + steps)));
    copy_mismatches += lpp[i] != rounded_bits[i];
  }
  const bool ok = max_err < 1e-5 && copy_mismatches == 0;

#if defined(__AVX512__)
  const char* simd = "AVX512";
#elif defined(__AVX256__)
  const char* simd = "AVX2";
#else
  const char* simd = "scalar";
#endif
  const double med = median(times);
  std::printf(
      "{\"impl\":\"deepspeed-zero3-cpu-step\",\"copy_dtype\":\"%s\",\"simd\":\"%s\","
      "\"params\":%lld,\"threads\":%d,\"torch_threads\":%d,\"steps\":%d,\"median_s\":%.6f,"
      "\"unscale_median_s\":%.6f,\"kernel_median_s\":%.6f,\"copy_median_s\":%.6f,"
      "\"mparams_per_s\":%.1f,\"kernel_mparams_per_s\":%.1f,\"max_abs_err_vs_reference\":%.3g,"
      "\"copy_mismatches\":%lld,\"verified\":%s}\n",
      bf16 ? "bf16" : "fp16", simd, static_cast<long long>(n), omp_get_max_threads(),
      at::get_num_threads(), steps, med, median(unscale_times), median(kernel_times),
      median(copy_times), n / med / 1e6, n / median(kernel_times) / 1e6, max_err,
      static_cast<long long>(copy_mismatches), ok ? "true" : "false");
  if (!ok) {
    std::fprintf(stderr,
                 "ds_zero3_step: master off the AdamW reference by %.3g, %lld copied elements "
                 "differ from the rounded master\n",
                 max_err, static_cast<long long>(copy_mismatches));
    return 3;
  }
  return 0;
}
