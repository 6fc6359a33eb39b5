// CpuAdam against torch.optim.AdamW / torch.optim.Adam themselves: the same initial weights and
// gradients go to /usr/bin/python3 running tests/optim/torch_adamw_reference.py, several steps
// from fresh optimizer state, and the final weights, moments and low-precision copies are compared.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "adam_test_util.h"
#include "optim/cpu_adam.h"

#ifndef STRATA_TORCH_ADAMW_SCRIPT
#error "tests/optim/CMakeLists.txt defines STRATA_TORCH_ADAMW_SCRIPT"
#endif

namespace strata::optim {
namespace {

namespace fs = std::filesystem;
using testing::Gradients;
using testing::make_gradients;
using testing::reference_step;
using testing::Rng;
using testing::scaled_error;

constexpr const char* kPython = "/usr/bin/python3";

bool torch_available() {
  static const bool available =
      std::system((std::string(kPython) + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0;
  return available;
}

fs::path scratch_dir(const std::string& name) {
  const char* env = std::getenv("STRATA_TEST_DIR");
  fs::path dir = fs::path(env ? env : fs::temp_directory_path().string()) /
                 (name + "." + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

template <typename T>
void write_file(const fs::path& path, const std::vector<T>& data) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(data.data()),
            static_cast<std::streamsize>(data.size() * sizeof(T)));
  ASSERT_TRUE(out.good()) << path;
}

template <typename T>
std::vector<T> read_file(const fs::path& path, size_t n) {
  std::vector<T> data(n);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(n * sizeof(T)));
  EXPECT_EQ(static_cast<size_t>(in.gcount()), n * sizeof(T)) << path;
  return data;
}

struct Case {
  bool decoupled;
  DType grad_dtype;
  double lr;
  bool foreach = false;
};

// Every case's inputs and torch's outputs. Importing torch takes seconds, so one Python process
// runs all cases, the first time a test asks.
const Case kCases[] = {
    {true, DType::kFloat32, 1e-3},       {true, DType::kBFloat16, 1e-3},
    {true, DType::kFloat16, 1e-3},       {false, DType::kFloat32, 1e-3},
    {false, DType::kBFloat16, 1e-3},     {false, DType::kFloat16, 1e-3},
    {true, DType::kFloat32, 3e-2, true}, {false, DType::kBFloat16, 3e-2, true},
};
constexpr size_t kN = 10007;  // odd: every path's tail is exercised
constexpr int kSteps = 5;

struct CaseData {
  Case c;
  AdamWParams h;  // all but step and grad_scale
  std::vector<float> p0;
  std::vector<Gradients> grads;
  std::vector<float> scales;
  std::vector<float> torch_p, torch_m, torch_v;
  std::vector<uint16_t> torch_bf16, torch_fp16;
};

std::string describe(const Case& c) {
  return std::string(c.decoupled ? "AdamW" : "Adam") + " grads=" + to_string(c.grad_dtype) +
         " lr=" + std::to_string(c.lr) + (c.foreach ? " foreach" : "");
}

CaseData make_inputs(const Case& c) {
  CaseData d;
  d.c = c;
  const float loss_scale = 512.0f;
  const float clip[kSteps] = {1.0f, 0.83f, 1.0f, 0.41f, 0.97f};
  Rng rng(static_cast<uint64_t>(c.decoupled) * 10 + static_cast<uint64_t>(c.grad_dtype));
  d.p0.resize(kN);
  for (float& x : d.p0) x = rng.uniform(-1.0f, 1.0f);
  for (int k = 0; k < kSteps; ++k) {
    d.grads.push_back(make_gradients(kN, c.grad_dtype, rng, 0.02f * loss_scale));
    d.scales.push_back(clip[k] / loss_scale);
  }
  d.h.lr = c.lr;
  d.h.beta1 = 0.9;
  d.h.beta2 = 0.999;
  d.h.eps = 1e-8;
  d.h.weight_decay = 0.01;
  d.h.decoupled = c.decoupled;
  return d;
}

void write_case(const CaseData& d, const fs::path& dir) {
  fs::create_directories(dir);
  write_file(dir / "p0.bin", d.p0);
  for (int k = 0; k < kSteps; ++k) {
    const fs::path path = dir / ("grad" + std::to_string(k + 1) + ".bin");
    if (d.c.grad_dtype == DType::kFloat32) {
      write_file(path, d.grads[k].f32);
    } else {
      write_file(path, d.grads[k].h16);
    }
  }
  std::ofstream config(dir / "config.json");
  char buffer[512];
  std::snprintf(buffer, sizeof buffer,
                "{\"n\": %zu, \"steps\": %d, \"lr\": %.17g, \"beta1\": %.17g, \"beta2\": %.17g, "
                "\"eps\": %.17g, \"weight_decay\": %.17g, \"decoupled\": %s, "
                "\"grad_dtype\": \"%s\", \"foreach\": %s, \"grad_scales\": [",
                kN, kSteps, d.h.lr, d.h.beta1, d.h.beta2, d.h.eps, d.h.weight_decay,
                d.c.decoupled ? "true" : "false", to_string(d.c.grad_dtype),
                d.c.foreach ? "true" : "false");
  config << buffer;
  for (int k = 0; k < kSteps; ++k) {
    std::snprintf(buffer, sizeof buffer, "%s%.9g", k ? ", " : "", d.scales[k]);
    config << buffer;
  }
  config << "]}\n";
}

// Empty when torch could not be run; *error says why.
const std::vector<CaseData>& torch_cases(std::string* error) {
  static std::string failure;
  static const std::vector<CaseData> cases = [] {
    std::vector<CaseData> all;
    const fs::path root = scratch_dir("torch_adamw");
    std::string command = std::string(kPython) + " " + STRATA_TORCH_ADAMW_SCRIPT;
    for (size_t i = 0; i < std::size(kCases); ++i) {
      all.push_back(make_inputs(kCases[i]));
      write_case(all.back(), root / std::to_string(i));
      command += " " + (root / std::to_string(i)).string();
    }
    command += " 2>" + (root / "stderr.txt").string();
    if (std::system(command.c_str()) != 0) {
      std::ifstream in(root / "stderr.txt");
      failure = command + " failed:\n" + std::string(std::istreambuf_iterator<char>(in), {});
      return std::vector<CaseData>{};
    }
    for (size_t i = 0; i < all.size(); ++i) {
      const fs::path dir = root / std::to_string(i);
      all[i].torch_p = read_file<float>(dir / "p.bin", kN);
      all[i].torch_m = read_file<float>(dir / "m.bin", kN);
      all[i].torch_v = read_file<float>(dir / "v.bin", kN);
      all[i].torch_bf16 = read_file<uint16_t>(dir / "p_bf16.bin", kN);
      all[i].torch_fp16 = read_file<uint16_t>(dir / "p_fp16.bin", kN);
    }
    fs::remove_all(root);
    return all;
  }();
  *error = failure;
  return cases;
}

void check_case(const CaseData& d) {
  SCOPED_TRACE(describe(d.c));
  const size_t n = kN;
  // Strata from the same fresh state (m = v = 0).
  auto adam = CpuAdam::create({.threads = 2});
  ASSERT_TRUE(adam.is_ok()) << adam.status().message();
  AdamWParams h = d.h;
  std::vector<float> p = d.p0, m(n, 0.0f), v(n, 0.0f);
  std::vector<float> last_p, last_m, last_v;
  // The magnitudes the final values are judged against, carried through the steps.
  std::vector<testing::Magnitudes> magnitudes(n), last_magnitudes;
  for (size_t i = 0; i < n; ++i) magnitudes[i] = {std::fabs(d.p0[i]), 0.0, 0.0};
  for (int k = 0; k < kSteps; ++k) {
    h.step = k + 1;
    h.grad_scale = d.scales[k];
    last_p = p, last_m = m, last_v = v;
    last_magnitudes = magnitudes;
    for (size_t i = 0; i < n; ++i) {
      const auto r = reference_step(h, d.grads[k].value(i), p[i], m[i], v[i], &magnitudes[i]);
      magnitudes[i] = {r.sp, r.sm, r.sv};
    }
    AdamWSlice slice{p.data(),       m.data(), v.data(),         d.grads[k].data(),
                     d.c.grad_dtype, nullptr,  DType::kBFloat16, n};
    ASSERT_TRUE((*adam)->step(h, {&slice, 1}).is_ok());
  }
  // The low-precision copies, written by the kernel: the last step again, on a copy of the
  // pre-step state, with param_out set.
  std::vector<uint16_t> out_bf16(n), out_fp16(n);
  for (DType out_dtype : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<float> pp = last_p, mm = last_m, vv = last_v;
    auto& out = out_dtype == DType::kBFloat16 ? out_bf16 : out_fp16;
    AdamWSlice slice{pp.data(),      mm.data(),  vv.data(), d.grads[kSteps - 1].data(),
                     d.c.grad_dtype, out.data(), out_dtype, n};
    ASSERT_TRUE((*adam)->step(h, {&slice, 1}).is_ok());
    ASSERT_EQ(pp, p);  // writing the copy does not change the update
  }

  double worst = 0;
  size_t copy_differences = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto& s = last_magnitudes[i];
    const auto r =
        reference_step(h, d.grads[kSteps - 1].value(i), last_p[i], last_m[i], last_v[i], &s);
    const double ep = scaled_error(p[i], d.torch_p[i], r.sp);
    const double em = scaled_error(m[i], d.torch_m[i], r.sm);
    const double ev = scaled_error(v[i], d.torch_v[i], r.sv);
    worst = std::max({worst, ep, em, ev});
    ASSERT_LE(ep, 1e-6) << "p[" << i << "] strata " << p[i] << " torch " << d.torch_p[i];
    ASSERT_LE(em, 1e-6) << "m[" << i << "] strata " << m[i] << " torch " << d.torch_m[i];
    ASSERT_LE(ev, 1e-6) << "v[" << i << "] strata " << v[i] << " torch " << d.torch_v[i];
    // Where the fp32 weights agree, the rounded copies must agree exactly (both round to nearest
    // even); where they differ by an ulp the copies may land one bf16/fp16 step apart.
    for (auto [ours, theirs] :
         {std::pair{out_bf16[i], d.torch_bf16[i]}, std::pair{out_fp16[i], d.torch_fp16[i]}}) {
      if (ours == theirs) continue;
      ++copy_differences;
      ASSERT_NE(p[i], d.torch_p[i]) << "copies differ at " << i << " though the weights agree";
      ASSERT_LE(std::abs(static_cast<int>(ours) - static_cast<int>(theirs)), 1) << i;
    }
  }
  std::printf("[ %s ] worst scaled error vs torch: %.3g, copies one step apart: %zu of %zu\n",
              describe(d.c).c_str(), worst, copy_differences, 2 * n);
}

class TorchAdamW : public ::testing::Test {
 protected:
  void SetUp() override {
    // Run the batch first and probe only when it fails: each probe costs a torch import.
    if (torch_cases(&error_).empty() && !torch_available()) {
      GTEST_SKIP() << kPython << " -c 'import torch' failed: Debian's python3-torch is needed";
    }
  }
  void check(bool decoupled, bool foreach) {
    const auto& cases = torch_cases(&error_);
    ASSERT_FALSE(cases.empty()) << error_;
    int checked = 0;
    for (const CaseData& d : cases) {
      if (d.c.decoupled != decoupled || d.c.foreach != foreach) continue;
      check_case(d);
      ++checked;
    }
    EXPECT_GT(checked, 0);
  }
  std::string error_;
};

// fp32, bf16 and fp16 gradients, lr 1e-3, torch's default (single-tensor) implementation.
TEST_F(TorchAdamW, AdamWMatchesTorchForEveryGradientDtype) {
  check(true, false);
}

TEST_F(TorchAdamW, AdamWithL2DecayMatchesTorchAdam) {
  check(false, false);
}

// torch's multi-tensor implementation and a large learning rate.
TEST_F(TorchAdamW, MatchesTorchForeachImplementationAndALargeLearningRate) {
  check(true, true);
  check(false, true);
}

}  // namespace
}  // namespace strata::optim
