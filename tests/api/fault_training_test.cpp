// Faults end to end (issue 8): the framework stand-in trains while STRATA_FAULTS injects faults
// under the runtime's I/O engine, and the test checks the four promises:
//  1. every failure reaches the caller as an error code (nothing is swallowed);
//  2. what is worth retrying is retried inside Strata (EAGAIN, short transfers, stalls never
//     reach the caller), and what is not (EIO, ENOSPC) is reported, after which the caller's
//     retry of the step succeeds;
//  3. no tensor loses its last good copy: once the faults stop, every tensor reads back the
//     contents of the last step that wrote it;
//  4. every injected corruption is detected: checksum failures counted by the extent store equal
//     the corruptions the injector made, and no step ever sees a wrong byte.
// The counts come from the runtime's internals (the injector and the extent store), which this
// test reaches through the handle; the training itself uses only strata.h.
#include <gtest/gtest.h>
#include <strata/strata.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "api/framework_standin.h"
#include "api/runtime.h"
#include "api/runtime_handle.h"
#include "io/fault_injection.h"

namespace {

namespace fs = std::filesystem;
using strata::io::FaultKind;
using strata::testing::FrameworkStandin;
using strata::testing::StandinOptions;

class FaultTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("STRATA_TEST_DIR");
    dir_ =
        fs::path(base != nullptr ? base : "/tmp") /
        ("faults-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
         "-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    standin_.reset();
    if (rt_ != nullptr) {
      EXPECT_EQ(strata_runtime_destroy(rt_), STRATA_OK);
    }
    fs::remove_all(dir_);
  }

  // Budgets far below the model, so every step streams tensors through NVMe. One block per
  // tensor (block_size above the largest), so one corrupted transfer is one corrupted extent.
  void start(const char* faults) {
    strata_config c;
    strata_config_init(&c);
    const std::string dir = dir_.string();
    c.nvme_path = dir.c_str();
    c.nvme_capacity_bytes = 256ull << 20;
    // 512 KiB of device budget, where the emulated device's slab fragments below what the pool's
    // count allows: the scheduler makes more room (reliability finding 8, docs/reliability.md).
    c.pinned_budget_bytes = 2ull << 20;
    c.device_budget_bytes = 512ull << 10;
    c.device_backend = STRATA_DEVICE_EMULATED;
    c.queue_depth = 8;
    c.block_size = 1u << 20;
    setenv("STRATA_FAULTS", faults, 1);
    const int rc = strata_runtime_create(&c, &rt_);
    unsetenv("STRATA_FAULTS");
    ASSERT_EQ(rc, STRATA_OK) << strata_last_error(nullptr);
    injector_ = dynamic_cast<strata::io::FaultInjectingEngine*>(&rt_->impl->engine());
    ASSERT_NE(injector_, nullptr) << "STRATA_FAULTS did not wrap the engine";
  }

  // Setup may itself meet the faults (its writes reach NVMe once the pinned budget is full): the
  // caller flushes and sets up again, as it would retry a step. Errors are counted like a step's.
  // whole_blocks: tensor sizes in whole 4 KiB units, so that no byte a read transfers is padding
  // outside the checksummed contents (a corruption there is harmless and goes unnoticed).
  void setup_with_retries(bool whole_blocks = false) {
    int rc = STRATA_E_IO;
    for (int attempt = 0; attempt < 10 && rc != STRATA_OK; ++attempt) {
      StandinOptions options;
      options.layers = 4;
      options.compute = std::chrono::microseconds(0);
      if (whole_blocks) options.param_bytes = {3 * 4096, 16 * 4096, 50 * 4096};
      standin_ = std::make_unique<FrameworkStandin>(rt_, options);
      rc = standin_->setup();
      if (rc != STRATA_OK) {
        ++errors_[rc];
        flush();
      }
    }
    ASSERT_EQ(rc, STRATA_OK) << strata_last_error(rt_);
  }

  // Writes back what failed to write (strata_sync retries it), counting each failure reported.
  void flush() {
    for (int attempt = 0; attempt < 10; ++attempt) {
      const int sync = strata_sync(rt_);
      if (sync == STRATA_OK) return;
      ++errors_[sync];
    }
  }

  uint64_t checksum_failures() const { return rt_->impl->store().stats().checksum_failures; }

  // Runs steps until `clean` steps in a row succeed; returns the error codes seen since the
  // runtime was created (setup included), by code.
  std::map<int, int> train_until_clean(int clean, int max_steps) {
    int in_a_row = 0;
    for (int s = 0; s < max_steps && in_a_row < clean; ++s) {
      const int rc = standin_->step();
      EXPECT_EQ(standin_->mismatch(), "") << "a step saw wrong bytes";
      if (rc == STRATA_OK) {
        ++in_a_row;
        continue;
      }
      in_a_row = 0;
      ++errors_[rc];
      EXPECT_NE(std::string(strata_last_error(rt_)), "") << "an error without its context";
      // What a framework does after a failed step: flush, then run the step again.
      flush();
    }
    EXPECT_EQ(in_a_row, clean) << "training did not recover within " << max_steps << " steps";
    return errors_;
  }

  fs::path dir_;
  strata_runtime* rt_ = nullptr;
  strata::io::FaultInjectingEngine* injector_ = nullptr;
  std::unique_ptr<FrameworkStandin> standin_;
  std::map<int, int> errors_;
};

TEST_F(FaultTraining, TransientFaultsAreRetriedInsideStrataAndNeverReachTheCaller) {
  start("any:eagain:every=3;any:short:every=2;any:stall:ms=2:every=9");
  setup_with_retries();
  for (int s = 0; s < 6; ++s) {
    ASSERT_EQ(standin_->step(), STRATA_OK) << strata_last_error(rt_) << standin_->mismatch();
  }
  ASSERT_EQ(strata_sync(rt_), STRATA_OK) << strata_last_error(rt_);
  EXPECT_EQ(standin_->verify_all(), STRATA_OK) << standin_->mismatch();
  EXPECT_GT(injector_->injected(FaultKind::kEagain), 0u);
  EXPECT_GT(injector_->injected(FaultKind::kShort), 0u);
  EXPECT_GT(injector_->injected(FaultKind::kStall), 0u);
}

// One fault of each hard kind, alone: that single failure must reach the caller, with its code.
struct HardFault {
  const char* spec;
  int code;
};
class OneHardFault : public FaultTraining, public ::testing::WithParamInterface<HardFault> {};

TEST_P(OneHardFault, ReachesTheCallerAndTheRetriedStepSucceeds) {
  start(GetParam().spec);
  setup_with_retries();
  const auto errors = train_until_clean(3, 20);
  EXPECT_EQ(injector_->injected_total(), 1u);
  EXPECT_GE(errors.count(GetParam().code) ? errors.at(GetParam().code) : 0, 1)
      << "the injected fault never reached the caller";
  for (const auto& [code, n] : errors) {
    EXPECT_EQ(code, GetParam().code) << n << " x " << strata_strerror(code);
  }
  ASSERT_EQ(strata_sync(rt_), STRATA_OK) << strata_last_error(rt_);
  EXPECT_EQ(standin_->verify_all(), STRATA_OK) << standin_->mismatch();
}

INSTANTIATE_TEST_SUITE_P(Faults, OneHardFault,
                         ::testing::Values(HardFault{"read:eio:every=7:count=1", STRATA_E_IO},
                                           HardFault{"write:eio:every=70:count=1", STRATA_E_IO},
                                           HardFault{"write:enospc:every=70:count=1",
                                                     STRATA_E_NOSPACE}),
                         [](const auto& info) {
                           return std::string(info.index == 0   ? "ReadEio"
                                              : info.index == 1 ? "WriteEio"
                                                                : "WriteEnospc");
                         });

TEST_F(FaultTraining, ManyHardFaultsNeverCostATensorItsLastGoodCopy) {
  start("read:eio:every=5:count=8;write:eio:every=4:count=8;write:enospc:every=9:count=4");
  setup_with_retries();
  const auto errors = train_until_clean(4, 80);
  EXPECT_EQ(injector_->injected(FaultKind::kEio), 16u);
  EXPECT_EQ(injector_->injected(FaultKind::kEnospc), 4u);
  int reported = 0;
  for (const auto& [code, n] : errors) {
    EXPECT_TRUE(code == STRATA_E_IO || code == STRATA_E_NOSPACE) << strata_strerror(code);
    reported += n;
  }
  EXPECT_GT(reported, 0);
  ASSERT_EQ(strata_sync(rt_), STRATA_OK) << strata_last_error(rt_);
  EXPECT_EQ(standin_->verify_all(), STRATA_OK) << standin_->mismatch();
}

TEST_F(FaultTraining, EveryInjectedCorruptionIsDetected) {
  // One corrupt rule: two firing on one transfer could flip the same bytes back.
  start("read:corrupt:bytes=7:every=3:count=18");
  setup_with_retries(/*whole_blocks=*/true);
  const auto errors = train_until_clean(3, 80);
  const uint64_t injected = injector_->injected(FaultKind::kCorrupt);
  EXPECT_EQ(injected, 18u);
  EXPECT_EQ(checksum_failures(), injected) << "injected corruptions against detected ones";
  for (const auto& [code, n] : errors) {
    EXPECT_EQ(code, STRATA_E_CORRUPT) << n << " x " << strata_strerror(code);
  }
  EXPECT_EQ(standin_->verify_all(), STRATA_OK) << standin_->mismatch();
}

}  // namespace
