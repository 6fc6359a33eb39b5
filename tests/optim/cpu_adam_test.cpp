// CpuAdam::step on every SIMD path this CPU has: against the float64 reference, against the
// scalar path bit for bit, across thread counts and slicings bit for bit, and its argument checks.
#include "optim/cpu_adam.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "adam_test_util.h"

namespace strata::optim {
namespace {

using testing::Gradients;
using testing::make_gradients;
using testing::make_states;
using testing::reference_step;
using testing::Rng;
using testing::same_bits;
using testing::scaled_error;
using testing::States;

constexpr double kTolerance = 1e-6;
const DType kGradTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

std::unique_ptr<CpuAdam> make_adam(SimdLevel level, int threads) {
  CpuAdamOptions options;
  options.threads = threads;
  options.simd = level;
  auto adam = CpuAdam::create(options);
  EXPECT_TRUE(adam.is_ok()) << adam.status().message();
  return adam.is_ok() ? std::move(*adam) : nullptr;
}

AdamWSlice slice_of(States& s, const Gradients& g, void* out, DType out_dtype, size_t begin = 0,
                    size_t n = SIZE_MAX) {
  if (n == SIZE_MAX) n = s.p.size() - begin;
  AdamWSlice slice;
  slice.param = s.p.data() + begin;
  slice.m = s.m.data() + begin;
  slice.v = s.v.data() + begin;
  slice.grad = static_cast<const unsigned char*>(g.data()) + begin * dtype_size(g.dtype);
  slice.grad_dtype = g.dtype;
  slice.param_out = out == nullptr ? nullptr : static_cast<uint16_t*>(out) + begin;
  slice.param_out_dtype = out_dtype;
  slice.n = n;
  return slice;
}

class CpuAdamPath : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override {
    if (!cpu_supports(GetParam())) {
      GTEST_SKIP() << "this CPU does not support " << to_string(GetParam());
    }
  }
};

// Every combination of gradient dtype, param_out dtype, Adam/AdamW and a length with every kind of
// tail, over three steps with loss-scaled gradients and a clipping factor folded into grad_scale.
TEST_P(CpuAdamPath, MatchesFloat64ReferenceOnEveryLengthDtypeAndVariant) {
  auto adam = make_adam(GetParam(), 2);
  ASSERT_NE(adam, nullptr);
  const size_t lengths[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 1000, 40001};
  const float loss_scale = 1024.0f;
  const double clip = 0.7;
  double worst = 0;
  for (DType grad_dtype : kGradTypes) {
    for (int out_kind = 0; out_kind < 3; ++out_kind) {
      for (bool decoupled : {true, false}) {
        for (size_t n : lengths) {
          SCOPED_TRACE(std::string(to_string(grad_dtype)) + " out=" + std::to_string(out_kind) +
                       (decoupled ? " AdamW" : " Adam") + " n=" + std::to_string(n));
          Rng rng(n * 131 + out_kind * 7 + (decoupled ? 1 : 0));
          States s = make_states(n, rng, 0.05f);
          std::vector<uint16_t> out(n, 0xDEAD);
          const DType out_dtype = out_kind == 2 ? DType::kFloat16 : DType::kBFloat16;
          for (int64_t step = 1; step <= 3; ++step) {
            Gradients g = make_gradients(n, grad_dtype, rng, 0.05f * loss_scale);
            AdamWParams h;
            h.lr = 1e-3;
            h.weight_decay = 0.01;
            h.decoupled = decoupled;
            h.step = step;
            h.grad_scale = static_cast<float>(1.0 / loss_scale * clip);
            const States before = s;
            const AdamWSlice slice =
                slice_of(s, g, out_kind == 0 ? nullptr : out.data(), out_dtype);
            ASSERT_TRUE(adam->step(h, {&slice, 1}).is_ok());
            for (size_t i = 0; i < n; ++i) {
              const auto r = reference_step(h, g.value(i), before.p[i], before.m[i], before.v[i]);
              const double ep = scaled_error(s.p[i], r.p, r.sp);
              const double em = scaled_error(s.m[i], r.m, r.sm);
              const double ev = scaled_error(s.v[i], r.v, r.sv);
              worst = std::max({worst, ep, em, ev});
              ASSERT_LE(ep, kTolerance) << "p[" << i << "] " << s.p[i] << " vs " << r.p;
              ASSERT_LE(em, kTolerance) << "m[" << i << "] " << s.m[i] << " vs " << r.m;
              ASSERT_LE(ev, kTolerance) << "v[" << i << "] " << s.v[i] << " vs " << r.v;
              if (out_kind == 1) ASSERT_EQ(out[i], float_to_bf16(s.p[i])) << i;
              if (out_kind == 2) ASSERT_EQ(out[i], float_to_fp16(s.p[i])) << i;
            }
          }
        }
      }
    }
  }
  RecordProperty("worst_scaled_error", std::to_string(worst));
  std::printf("[ %s ] worst scaled error vs float64: %.3g\n", to_string(GetParam()), worst);
}

// The SIMD paths follow adamw_element.h operation by operation: same bits as the scalar path,
// including on zeros, subnormals, huge values, infinities and NaNs.
TEST_P(CpuAdamPath, BitIdenticalToScalarPathIncludingSpecialValues) {
  auto adam = make_adam(GetParam(), 1);
  auto scalar = make_adam(SimdLevel::kScalar, 1);
  ASSERT_NE(adam, nullptr);
  ASSERT_NE(scalar, nullptr);
  const float specials[] = {0.0f,     -0.0f,     1e-40f, -1e-45f,  3e38f, -3e38f,
                            INFINITY, -INFINITY, NAN,    65504.0f, 1e-8f, 1.0f};
  const size_t n = 4099;
  for (DType grad_dtype : kGradTypes) {
    for (int out_kind = 0; out_kind < 3; ++out_kind) {
      for (bool decoupled : {true, false}) {
        Rng rng(77 + out_kind);
        States a = make_states(n, rng, 0.1f);
        Gradients g = make_gradients(n, grad_dtype, rng, 0.1f);
        for (size_t i = 0; i < n; i += 97) {
          const float x = specials[(i / 97) % std::size(specials)];
          switch ((i / 97) % 4) {
            case 0:
              g.set(i, x);
              break;
            case 1:
              a.p[i] = x;
              break;
            case 2:
              a.m[i] = x;
              break;
            default:
              a.v[i] = std::fabs(x);
              break;
          }
        }
        States b = a;
        std::vector<uint16_t> out_a(n), out_b(n);
        const DType out_dtype = out_kind == 2 ? DType::kFloat16 : DType::kBFloat16;
        AdamWParams h;
        h.weight_decay = 0.1;
        h.decoupled = decoupled;
        h.step = 5;
        h.grad_scale = 0.5f;
        const AdamWSlice sa = slice_of(a, g, out_kind ? out_a.data() : nullptr, out_dtype);
        const AdamWSlice sb = slice_of(b, g, out_kind ? out_b.data() : nullptr, out_dtype);
        ASSERT_TRUE(adam->step(h, {&sa, 1}).is_ok());
        ASSERT_TRUE(scalar->step(h, {&sb, 1}).is_ok());
        for (size_t i = 0; i < n; ++i) {
          ASSERT_TRUE(same_bits(a.p[i], b.p[i])) << i << ": " << a.p[i] << " vs " << b.p[i];
          ASSERT_TRUE(same_bits(a.m[i], b.m[i])) << i;
          ASSERT_TRUE(same_bits(a.v[i], b.v[i])) << i;
          if (out_kind == 1) ASSERT_EQ(out_a[i], out_b[i]) << i;
          if (out_kind == 2 && !std::isnan(a.p[i])) ASSERT_EQ(out_a[i], out_b[i]) << i;
        }
      }
    }
  }
}

// The unit of work a thread claims, and the split of a tensor into slices, cannot change a bit.
TEST_P(CpuAdamPath, ThreadCountAndSlicingDoNotChangeAnyBit) {
  const size_t n = 3 * CpuAdam::kStepChunk + 12345;
  Rng rng(5);
  const States initial = make_states(n, rng, 0.01f);
  const Gradients g = make_gradients(n, DType::kBFloat16, rng, 0.01f);
  AdamWParams h;
  h.weight_decay = 0.05;
  h.step = 2;

  States expected = initial;
  std::vector<uint16_t> expected_out(n);
  {
    auto one = make_adam(GetParam(), 1);
    const AdamWSlice whole = slice_of(expected, g, expected_out.data(), DType::kBFloat16);
    ASSERT_TRUE(one->step(h, {&whole, 1}).is_ok());
  }
  for (int threads : {2, 3, 5}) {
    auto adam = make_adam(GetParam(), threads);
    States s = initial;
    std::vector<uint16_t> out(n);
    // Uneven slices, an empty one among them, boundaries off any vector width.
    const size_t cuts[] = {0, 1, 1, 1000, 1001, 40000, 65536 + 7, n - 3, n};
    std::vector<AdamWSlice> slices;
    for (size_t k = 0; k + 1 < std::size(cuts); ++k) {
      slices.push_back(
          slice_of(s, g, out.data(), DType::kBFloat16, cuts[k], cuts[k + 1] - cuts[k]));
    }
    ASSERT_TRUE(adam->step(h, slices).is_ok());
    ASSERT_EQ(0, std::memcmp(s.p.data(), expected.p.data(), n * 4)) << threads << " threads";
    ASSERT_EQ(0, std::memcmp(s.m.data(), expected.m.data(), n * 4)) << threads << " threads";
    ASSERT_EQ(0, std::memcmp(s.v.data(), expected.v.data(), n * 4)) << threads << " threads";
    ASSERT_EQ(out, expected_out) << threads << " threads";
  }
}

// Folding is exact where the arithmetic is: a power-of-two loss scale undone by grad_scale gives
// the very bits of the unscaled gradients.
TEST_P(CpuAdamPath, UnscalingFoldedIntoGradScaleIsExactForPowersOfTwo) {
  auto adam = make_adam(GetParam(), 2);
  const size_t n = 1037;
  for (DType dtype : kGradTypes) {
    Rng rng(9);
    const States initial = make_states(n, rng, 0.01f);
    Gradients plain = make_gradients(n, dtype, rng, 0.01f);
    Gradients scaled = plain;
    for (size_t i = 0; i < n; ++i) scaled.set(i, plain.value(i) * 256.0f);
    States a = initial, b = initial;
    AdamWParams h;
    h.grad_scale = 0.5f;  // a clip factor
    const AdamWSlice sa = slice_of(a, plain, nullptr, DType::kBFloat16);
    ASSERT_TRUE(adam->step(h, {&sa, 1}).is_ok());
    h.grad_scale = 0.5f / 256.0f;
    const AdamWSlice sb = slice_of(b, scaled, nullptr, DType::kBFloat16);
    ASSERT_TRUE(adam->step(h, {&sb, 1}).is_ok());
    EXPECT_EQ(0, std::memcmp(a.p.data(), b.p.data(), n * 4)) << to_string(dtype);
    EXPECT_EQ(0, std::memcmp(a.m.data(), b.m.data(), n * 4)) << to_string(dtype);
  }
}

// With weight decay, Adam and AdamW differ; without it they are the same algorithm.
TEST_P(CpuAdamPath, AdamAndAdamWDifferOnlyThroughWeightDecay) {
  auto adam = make_adam(GetParam(), 1);
  const size_t n = 257;
  Rng rng(3);
  const States initial = make_states(n, rng, 0.01f);
  const Gradients g = make_gradients(n, DType::kFloat32, rng, 0.01f);
  auto run = [&](bool decoupled, double wd) {
    States s = initial;
    AdamWParams h;
    h.decoupled = decoupled;
    h.weight_decay = wd;
    h.lr = 1e-2;
    const AdamWSlice slice = slice_of(s, g, nullptr, DType::kBFloat16);
    EXPECT_TRUE(adam->step(h, {&slice, 1}).is_ok());
    return s.p;
  };
  EXPECT_EQ(run(true, 0.0), run(false, 0.0));
  EXPECT_NE(run(true, 0.1), run(false, 0.1));
}

// The copy goes out with streaming stores once its pointer is 16-byte aligned, the elements
// before that through the tail path: at every starting alignment and length, the same bits as
// the scalar path and not one byte outside the copy written.
TEST_P(CpuAdamPath, WeightCopyIsExactAtEveryAlignmentAndWritesNothingOutsideIt) {
  auto adam = make_adam(GetParam(), 1);
  auto scalar = make_adam(SimdLevel::kScalar, 1);
  ASSERT_NE(adam, nullptr);
  ASSERT_NE(scalar, nullptr);
  constexpr uint16_t kGuard = 0xDEAD;
  constexpr size_t kMargin = 16;
  for (DType out_dtype : {DType::kBFloat16, DType::kFloat16}) {
    // Every start within a 64-byte line: the AVX-512 path streams whole lines after a head.
    for (size_t shift = 0; shift < 33; ++shift) {
      for (size_t n : {1, 3, 7, 8, 9, 15, 33, 100, 1001}) {
        SCOPED_TRACE(std::string(to_string(out_dtype)) + " shift=" + std::to_string(shift) +
                     " n=" + std::to_string(n));
        Rng rng(n * 17 + shift);
        States a = make_states(n, rng, 0.1f);
        const Gradients g = make_gradients(n, DType::kFloat32, rng, 0.1f);
        States b = a;
        // 64-byte aligned storage, so that `shift` alone decides the copy's alignment.
        struct alignas(64) Line {
          uint16_t h[32];
        };
        std::vector<Line> out_a((n + 2 * kMargin + 31) / 32 + 1), out_b(out_a.size());
        auto* base_a = out_a.front().h;
        auto* base_b = out_b.front().h;
        std::fill(base_a, base_a + out_a.size() * 32, kGuard);
        std::fill(base_b, base_b + out_b.size() * 32, kGuard);
        AdamWParams h;
        h.weight_decay = 0.01;
        h.step = 3;
        const AdamWSlice sa = slice_of(a, g, base_a + kMargin + shift, out_dtype);
        const AdamWSlice sb = slice_of(b, g, base_b + kMargin + shift, out_dtype);
        ASSERT_TRUE(adam->step(h, {&sa, 1}).is_ok());
        ASSERT_TRUE(scalar->step(h, {&sb, 1}).is_ok());
        ASSERT_EQ(0, std::memcmp(a.p.data(), b.p.data(), n * 4));
        for (size_t i = 0; i < out_a.size() * 32; ++i) {
          const bool inside = i >= kMargin + shift && i < kMargin + shift + n;
          ASSERT_EQ(base_a[i], base_b[i]) << i;
          if (!inside) ASSERT_EQ(base_a[i], kGuard) << i;
        }
      }
    }
  }
}

// step_traffic, the bench's bound, moves what step() moves: p, m, v += scale * g exactly (the
// additions round as fp32 ones do) and the copy from the new p, on every dtype and tail, with
// either loop; the prefetched one exists exactly on AVX-512 (AVX2's update prefetches already).
TEST_P(CpuAdamPath, TrafficPassAddsTheScaledGradientAndWritesTheCopy) {
  auto adam = make_adam(GetParam(), 2);
  ASSERT_NE(adam, nullptr);
  EXPECT_EQ(adam->has_prefetched_traffic(), GetParam() == SimdLevel::kAvx512);
  std::vector<CpuAdam::TrafficLoop> loops{CpuAdam::TrafficLoop::kTheUpdates};
  if (adam->has_prefetched_traffic()) loops.push_back(CpuAdam::TrafficLoop::kPrefetched);
  for (CpuAdam::TrafficLoop loop : loops)
    for (DType grad_dtype : kGradTypes) {
      for (int out_kind = 0; out_kind < 3; ++out_kind) {
        for (uint64_t n :
             {uint64_t{5}, uint64_t{64}, uint64_t{1000}, 3 * CpuAdam::kStepChunk + 13}) {
          SCOPED_TRACE(std::string(to_string(grad_dtype)) + " out=" + std::to_string(out_kind) +
                       " n=" + std::to_string(n) +
                       " loop=" + std::to_string(static_cast<int>(loop)));
          Rng rng(n + out_kind);
          States s = make_states(n, rng, 0.1f);
          const Gradients g = make_gradients(n, grad_dtype, rng, 0.1f);
          const States before = s;
          std::vector<uint16_t> out(n, 0xDEAD);
          const DType out_dtype = out_kind == 2 ? DType::kFloat16 : DType::kBFloat16;
          const AdamWSlice slice = slice_of(s, g, out_kind == 0 ? nullptr : out.data(), out_dtype);
          ASSERT_TRUE(adam->step_traffic(0.5f, {&slice, 1}, loop).is_ok());
          for (size_t i = 0; i < n; ++i) {
            // Exact in double, then one rounding to fp32: what a single fp32 addition gives.
            const double x = static_cast<double>(g.value(i)) * 0.5;
            ASSERT_EQ(s.p[i], static_cast<float>(before.p[i] + x)) << i;
            ASSERT_EQ(s.m[i], static_cast<float>(before.m[i] + x)) << i;
            ASSERT_EQ(s.v[i], static_cast<float>(before.v[i] + x)) << i;
            if (out_kind == 1) ASSERT_EQ(out[i], float_to_bf16(s.p[i])) << i;
            if (out_kind == 2) ASSERT_EQ(out[i], float_to_fp16(s.p[i])) << i;
          }
        }
      }
    }
  const AdamWSlice none{};
  EXPECT_EQ(adam->step_traffic(NAN, {&none, 1}).code(), STRATA_E_INVALID);
  if (!adam->has_prefetched_traffic()) {
    EXPECT_EQ(adam->step_traffic(0.5f, {&none, 1}, CpuAdam::TrafficLoop::kPrefetched).code(),
              STRATA_E_UNSUPPORTED);
  }
}

INSTANTIATE_TEST_SUITE_P(Simd, CpuAdamPath,
                         ::testing::Values(SimdLevel::kScalar, SimdLevel::kAvx2,
                                           SimdLevel::kAvx512),
                         [](const auto& info) { return std::string(to_string(info.param)); });

class CpuAdamArguments : public ::testing::Test {
 protected:
  void SetUp() override {
    auto adam = CpuAdam::create({.threads = 2});
    ASSERT_TRUE(adam.is_ok()) << adam.status().message();
    adam_ = std::move(*adam);
    Rng rng(1);
    states_ = make_states(n_, rng, 0.01f);
    grads_ = make_gradients(n_, DType::kFloat32, rng, 0.01f);
    before_ = states_;
  }
  // A failed call must not have written anything.
  void expect_untouched() {
    EXPECT_EQ(states_.p, before_.p);
    EXPECT_EQ(states_.m, before_.m);
    EXPECT_EQ(states_.v, before_.v);
  }
  void expect_invalid(const AdamWParams& h, std::vector<AdamWSlice> slices) {
    const Status status = adam_->step(h, slices);
    EXPECT_EQ(status.code(), STRATA_E_INVALID) << status.message();
    EXPECT_FALSE(status.message().empty());
    expect_untouched();
  }

  const size_t n_ = 100;
  std::unique_ptr<CpuAdam> adam_;
  States states_, before_;
  Gradients grads_;
};

TEST_F(CpuAdamArguments, RejectsHyperparametersTorchRejects) {
  const AdamWSlice good = slice_of(states_, grads_, nullptr, DType::kBFloat16);
  auto with = [](auto change) {
    AdamWParams h;
    change(h);
    return h;
  };
  expect_invalid(with([](AdamWParams& h) { h.lr = -1; }), {good});
  expect_invalid(with([](AdamWParams& h) { h.beta1 = 1.0; }), {good});
  expect_invalid(with([](AdamWParams& h) { h.beta2 = -0.1; }), {good});
  expect_invalid(with([](AdamWParams& h) { h.eps = -1e-8; }), {good});
  expect_invalid(with([](AdamWParams& h) { h.weight_decay = -0.01; }), {good});
  expect_invalid(with([](AdamWParams& h) { h.step = 0; }), {good});
  expect_invalid(with([](AdamWParams& h) { h.lr = NAN; }), {good});
  expect_invalid(with([](AdamWParams& h) { h.grad_scale = INFINITY; }), {good});
}

TEST_F(CpuAdamArguments, RejectsBadSlicesBeforeTouchingAnyOfThem) {
  const AdamWParams h;
  const AdamWSlice good = slice_of(states_, grads_, nullptr, DType::kBFloat16, 0, 50);
  AdamWSlice bad = slice_of(states_, grads_, nullptr, DType::kBFloat16, 50, 50);

  AdamWSlice null_m = bad;
  null_m.m = nullptr;
  expect_invalid(h, {good, null_m});

  AdamWSlice int8_grad = bad;
  int8_grad.grad_dtype = DType::kInt8;
  expect_invalid(h, {good, int8_grad});

  std::vector<uint16_t> out(n_);
  AdamWSlice fp32_out = bad;
  fp32_out.param_out = out.data();
  fp32_out.param_out_dtype = DType::kFloat32;
  expect_invalid(h, {good, fp32_out});

  AdamWSlice misaligned = bad;
  misaligned.param = reinterpret_cast<float*>(reinterpret_cast<char*>(misaligned.param) + 2);
  expect_invalid(h, {good, misaligned});

  AdamWSlice overlapping = bad;
  overlapping.v = overlapping.m + 10;
  expect_invalid(h, {good, overlapping});

  // An empty slice may carry null pointers.
  AdamWSlice empty;
  EXPECT_TRUE(adam_->step(h, {&empty, 1}).is_ok());
  expect_untouched();
}

TEST(CpuAdamCreate, ForcingAnUnsupportedLevelFailsCleanly) {
  if (cpu_supports(SimdLevel::kAvx512)) GTEST_SKIP() << "every level is supported here";
  auto adam = CpuAdam::create({.threads = 1, .simd = SimdLevel::kAvx512});
  ASSERT_FALSE(adam.is_ok());
  EXPECT_EQ(adam.status().code(), STRATA_E_UNSUPPORTED);
}

TEST(CpuAdamCreate, DefaultsToTheBestLevelAndBindsToAnExistingNode) {
  auto adam = CpuAdam::create({.threads = 2, .numa_node = 0});
  ASSERT_TRUE(adam.is_ok()) << adam.status().message();
  EXPECT_EQ((*adam)->simd_level(), best_simd_level());
  EXPECT_EQ((*adam)->threads(), 2);

  auto missing = CpuAdam::create({.threads = 2, .numa_node = 4095});
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), STRATA_E_INVALID);
  EXPECT_NE(missing.status().message().find("4095"), std::string::npos);
}

TEST(SimdLevel, NamesRoundTripAndScalarIsAlwaysThere) {
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    EXPECT_EQ(parse_simd_level(to_string(level)), level);
  }
  EXPECT_FALSE(parse_simd_level("sse9"));
  EXPECT_TRUE(cpu_supports(SimdLevel::kScalar));
  EXPECT_TRUE(cpu_supports(best_simd_level()));
  EXPECT_STREQ(simd_level_name(), to_string(best_simd_level()));
  const auto levels = supported_simd_levels();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), SimdLevel::kScalar);
  EXPECT_EQ(levels.back(), best_simd_level());
}

}  // namespace
}  // namespace strata::optim
