// STRATA_TENSOR_READ_ONLY (strata.h; issue 22): a frozen base weight is loaded once, read from
// NVMe as often as the pinned budget forces it out, and never written back. The calls that would
// write it fail with STRATA_E_INVALID before they change anything.
#include <gtest/gtest.h>
#include <strata/strata.h>

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "model/test_dir.h"

namespace {

namespace fs = std::filesystem;
constexpr uint64_t kMiB = 1024 * 1024;
constexpr uint64_t kBase = 4 * kMiB;  // each frozen weight

class ReadOnlyTensor : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = strata::testing::scratch_dir("read-only-tensor").string();
    strata_config c;
    strata_config_init(&c);
    c.nvme_path = dir_.c_str();
    c.nvme_capacity_bytes = 128 * kMiB;
    // Two weights and the staging buffers: a third weight evicts one.
    c.pinned_budget_bytes = 12 * kMiB;
    c.device_budget_bytes = 16 * kMiB;
    c.device_backend = STRATA_DEVICE_EMULATED;
    ASSERT_EQ(strata_runtime_create(&c, &rt_), STRATA_OK) << strata_last_error(nullptr);
  }
  void TearDown() override {
    if (rt_ != nullptr) EXPECT_EQ(strata_runtime_destroy(rt_), STRATA_OK);
    fs::remove_all(dir_);
  }
  strata_tensor register_tensor(const std::string& name, uint32_t flags,
                                strata_tensor_kind kind = STRATA_KIND_PARAMETER) {
    strata_tensor_desc d{};
    d.struct_size = sizeof d;
    d.name = name.c_str();
    d.bytes = kBase;
    d.dtype = STRATA_DTYPE_U8;
    d.kind = kind;
    d.home_tier = STRATA_TIER_NVME;
    d.flags = flags;
    strata_tensor t = STRATA_TENSOR_NONE;
    EXPECT_EQ(strata_tensor_register(rt_, &d, &t), STRATA_OK) << strata_last_error(rt_);
    return t;
  }
  strata_stats stats() {
    strata_stats st{};
    st.struct_size = sizeof st;
    EXPECT_EQ(strata_get_stats(rt_, &st), STRATA_OK);
    return st;
  }
  static std::vector<unsigned char> pattern(int seed) {
    std::vector<unsigned char> bytes(kBase);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 7 + seed);
    return bytes;
  }

  strata_runtime* rt_ = nullptr;
  std::string dir_;
};

TEST_F(ReadOnlyTensor, FrozenWeightsAreReadFromNvmeEveryStepAndNeverWrittenBack) {
  std::vector<strata_tensor> base;
  for (int i = 0; i < 4; ++i) {
    base.push_back(register_tensor("base." + std::to_string(i), STRATA_TENSOR_READ_ONLY));
    ASSERT_EQ(strata_tensor_write(rt_, base.back(), pattern(i).data(), 0, kBase), STRATA_OK)
        << strata_last_error(rt_);
  }
  ASSERT_EQ(strata_sync(rt_), STRATA_OK);
  const strata_stats loaded = stats();
  EXPECT_EQ(loaded.nvme_bytes_written_by_kind[STRATA_KIND_PARAMETER], 4 * kBase);

  // Forward in order, backward in reverse, three steps: 4 weights of 4 MiB through 12 MiB.
  for (int step = 0; step < 3; ++step) {
    for (int pass = 0; pass < 2; ++pass) {
      for (int k = 0; k < 4; ++k) {
        const int i = pass == 0 ? k : 3 - k;
        strata_acquired a{};
        a.struct_size = sizeof a;
        ASSERT_EQ(strata_acquire(rt_, base[static_cast<size_t>(i)], STRATA_TIER_PINNED, 0, &a),
                  STRATA_OK)
            << strata_last_error(rt_);
        EXPECT_EQ(std::memcmp(a.data, pattern(i).data(), kBase), 0) << "weight " << i;
        ASSERT_EQ(strata_release(rt_, base[static_cast<size_t>(i)], 0, nullptr), STRATA_OK);
      }
    }
  }
  ASSERT_EQ(strata_sync(rt_), STRATA_OK);
  const strata_stats after = stats();
  EXPECT_EQ(after.nvme_bytes_written_by_kind[STRATA_KIND_PARAMETER], 4 * kBase)
      << "a frozen weight was written back";
  // The budget holds two of the four: every pass read some of them again.
  EXPECT_GE(after.nvme_bytes_read_by_kind[STRATA_KIND_PARAMETER] -
                loaded.nvme_bytes_read_by_kind[STRATA_KIND_PARAMETER],
            6 * kBase);
  for (int k = 0; k < STRATA_STATS_KIND_SLOTS; ++k) {
    if (k == STRATA_KIND_PARAMETER) continue;
    EXPECT_EQ(after.nvme_bytes_written_by_kind[k], 0u) << "kind " << k;
  }
}

TEST_F(ReadOnlyTensor, CallsThatWouldWriteItAreRefusedAndChangeNothing) {
  const strata_tensor base = register_tensor("frozen.weight", STRATA_TENSOR_READ_ONLY);
  ASSERT_EQ(strata_tensor_write(rt_, base, pattern(1).data(), 0, kBase), STRATA_OK);

  strata_acquired a{};
  a.struct_size = sizeof a;
  EXPECT_EQ(strata_acquire(rt_, base, STRATA_TIER_PINNED, STRATA_ACQUIRE_DISCARD, &a),
            STRATA_E_INVALID);
  EXPECT_NE(std::string(strata_last_error(rt_)).find("read-only"), std::string::npos)
      << strata_last_error(rt_);

  ASSERT_EQ(strata_acquire(rt_, base, STRATA_TIER_PINNED, 0, &a), STRATA_OK);
  EXPECT_EQ(strata_release(rt_, base, STRATA_RELEASE_DIRTY, nullptr), STRATA_E_INVALID);
  EXPECT_NE(std::string(strata_last_error(rt_)).find("the acquire stays"), std::string::npos);
  // The refused release left the acquire: reloading is refused while it lasts.
  EXPECT_EQ(strata_tensor_write(rt_, base, pattern(2).data(), 0, kBase), STRATA_E_STATE);
  EXPECT_EQ(strata_release(rt_, base, 0, nullptr), STRATA_OK);
  EXPECT_EQ(strata_release(rt_, base, 0, nullptr), STRATA_E_STATE) << "acquired once only";

  strata_optimizer_group group;
  ASSERT_EQ(strata_optimizer_group_init(&group), STRATA_OK);
  uint32_t index = 0;
  ASSERT_EQ(strata_optimizer_add_group(rt_, &group, &index), STRATA_OK) << strata_last_error(rt_);
  const strata_tensor grad = register_tensor("frozen.weight.grad", 0, STRATA_KIND_GRADIENT);
  EXPECT_EQ(strata_optimizer_add_param(rt_, index, base, grad), STRATA_E_INVALID);
  EXPECT_NE(std::string(strata_last_error(rt_)).find("frozen parameter"), std::string::npos);

  // Reloading (a checkpoint of the base) is strata_tensor_write, and it is allowed.
  ASSERT_EQ(strata_tensor_write(rt_, base, pattern(3).data(), 0, kBase), STRATA_OK);
  std::vector<unsigned char> back(kBase);
  ASSERT_EQ(strata_tensor_read(rt_, base, back.data(), 0, kBase), STRATA_OK);
  EXPECT_EQ(back, pattern(3));
}

TEST_F(ReadOnlyTensor, UnknownFlagsAreRefusedAndAnOlderDescriptorMeansNone) {
  strata_tensor_desc d{};
  d.struct_size = sizeof d;
  d.name = "flags";
  d.bytes = kBase;
  d.dtype = STRATA_DTYPE_U8;
  d.kind = STRATA_KIND_PARAMETER;
  d.home_tier = STRATA_TIER_NVME;
  d.flags = 2;
  strata_tensor t = STRATA_TENSOR_NONE;
  EXPECT_EQ(strata_tensor_register(rt_, &d, &t), STRATA_E_INVALID);
  EXPECT_EQ(t, STRATA_TENSOR_NONE);

  // The header before flags ended at home_tier: such a caller's tensors are writable.
  d.flags = 0;
  d.struct_size = offsetof(strata_tensor_desc, flags);
  ASSERT_EQ(strata_tensor_register(rt_, &d, &t), STRATA_OK) << strata_last_error(rt_);
  strata_acquired a{};
  a.struct_size = sizeof a;
  ASSERT_EQ(strata_acquire(rt_, t, STRATA_TIER_PINNED, STRATA_ACQUIRE_DISCARD, &a), STRATA_OK);
  EXPECT_EQ(strata_release(rt_, t, STRATA_RELEASE_DIRTY, nullptr), STRATA_OK);
}

}  // namespace
