// Soak (issue 8): the framework stand-in trains for many steps on tight budgets, and what the
// process holds - resident memory, open file descriptors, pinned and device memory Strata has
// reserved, NVMe space in use - must stop growing once it has warmed up. Something that grows
// by a little every step (a leaked buffer, descriptor or extent) shows up as a later maximum
// above the warm maximum.
//
// Steps: STRATA_SOAK_STEPS (default 60, the CI's short form; ctest label soak-long runs 500).
// Warm-up is the first sixth of the steps (at least 10); the maximum over the last half may
// exceed the maximum over the steps between warm-up and half way by a small slack only.
#include <gtest/gtest.h>
#include <strata/strata.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "api/framework_standin.h"
#include "sanitizers.h"

namespace {

namespace fs = std::filesystem;

using strata::testing::kSanitized;

uint64_t rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmRSS:") {
      uint64_t kib = 0;
      status >> kib;
      return kib << 10;
    }
    status.ignore(1 << 16, '\n');
  }
  return 0;
}

uint64_t open_fds() {
  uint64_t n = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

struct Sample {
  uint64_t rss, fds, pinned_reserved, device_reserved, nvme_in_use;
};

struct Series {
  const char* name;
  uint64_t Sample::*field;
  uint64_t slack;
};

int soak_steps() {
  const char* text = std::getenv("STRATA_SOAK_STEPS");
  const int steps = text != nullptr ? std::atoi(text) : 60;
  return std::max(steps, 30);
}

TEST(Soak, ResourcesStopGrowingAfterWarmUp) {
  const char* base = std::getenv("STRATA_TEST_DIR");
  const fs::path dir =
      fs::path(base != nullptr ? base : "/tmp") / ("soak-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string dir_text = dir.string();

  strata_config c;
  strata_config_init(&c);
  c.nvme_path = dir_text.c_str();
  c.nvme_capacity_bytes = 128ull << 20;
  c.pinned_budget_bytes = 2ull << 20;
  // 4 MiB: with 1 MiB the emulated device's slab fragments below what the budget allows within a
  // few dozen steps (an open bug, docs/reliability.md); the soak is about leaks, and NVMe
  // traffic is assured by the pinned budget.
  c.device_budget_bytes = 1ull << 20;
  c.device_backend = STRATA_DEVICE_EMULATED;
  c.queue_depth = 8;
  c.trace_events = 4096;  // a full trace ring must not grow either
  strata_runtime* rt = nullptr;
  ASSERT_EQ(strata_runtime_create(&c, &rt), STRATA_OK) << strata_last_error(nullptr);

  strata::testing::StandinOptions options;
  options.compute = std::chrono::microseconds(0);
  strata::testing::FrameworkStandin standin(rt, options);
  ASSERT_EQ(standin.setup(), STRATA_OK) << strata_last_error(rt);

  const int steps = soak_steps();
  std::vector<Sample> samples;
  for (int s = 0; s < steps; ++s) {
    ASSERT_EQ(standin.step(), STRATA_OK)
        << "step " << s << ": " << strata_last_error(rt) << " " << standin.mismatch();
    strata_stats stats{};
    stats.struct_size = sizeof stats;
    ASSERT_EQ(strata_get_stats(rt, &stats), STRATA_OK);
    samples.push_back({rss_bytes(), open_fds(), stats.pinned.reserved_bytes,
                       stats.device.reserved_bytes, stats.nvme.in_use_bytes});
  }
  ASSERT_EQ(strata_sync(rt), STRATA_OK) << strata_last_error(rt);
  EXPECT_EQ(standin.verify_all(), STRATA_OK) << standin.mismatch();

  const int warm = std::max(10, steps / 6);
  const int half = steps / 2;
  // Slack: two descriptors, for the ones the runtime's memory sampler holds for an instant while
  // it reads /proc (a leak of one per step is far more); for pinned memory, the largest tensor
  // (page-rounded): the arena reserves exactly what is resident and fills up to its budget, so
  // which tensors are resident when a step ends moves the total anywhere between the budget
  // less one tensor that did not fit and the budget itself (it never exceeds the budget,
  // checked below; under ASan's slower timing 68 KiB of such noise was seen); none for the
  // device slab and NVMe space; for RSS, the allocator's own noise (glibc trims freed memory
  // lazily).
  const uint64_t largest_tensor =
      *std::max_element(options.param_bytes.begin(), options.param_bytes.end());
  const uint64_t pinned_slack = (largest_tensor + 4095) / 4096 * 4096;
  std::vector<Series> series = {{"open fds", &Sample::fds, 2},
                                {"pinned reserved bytes", &Sample::pinned_reserved, pinned_slack},
                                {"device reserved bytes", &Sample::device_reserved, 0},
                                {"nvme bytes in use", &Sample::nvme_in_use, 0}};
  // ASan keeps freed memory in quarantine (up to 256 MiB) and TSan its shadow: RSS is theirs.
  if (!kSanitized) series.push_back({"RSS", &Sample::rss, 4ull << 20});
  for (const Series& s : series) {
    uint64_t warm_max = 0, late_max = 0;
    for (int i = warm; i < half; ++i) warm_max = std::max(warm_max, samples[i].*s.field);
    for (int i = half; i < steps; ++i) late_max = std::max(late_max, samples[i].*s.field);
    std::printf(
        "soak: %-22s steps %d..%d max %llu, steps %d..%d max %llu (first %llu, last %llu)\n",
        s.name, warm, half - 1, static_cast<unsigned long long>(warm_max), half, steps - 1,
        static_cast<unsigned long long>(late_max),
        static_cast<unsigned long long>(samples.front().*s.field),
        static_cast<unsigned long long>(samples.back().*s.field));
    EXPECT_LE(late_max, warm_max + s.slack) << s.name << " grew after warm-up";
  }
  for (const Sample& sample : samples) {
    ASSERT_LE(sample.pinned_reserved, c.pinned_budget_bytes) << "pinned memory over its budget";
  }

  EXPECT_EQ(strata_runtime_destroy(rt), STRATA_OK);
  fs::remove_all(dir);
}

}  // namespace
