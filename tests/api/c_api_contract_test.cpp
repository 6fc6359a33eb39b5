// The C API contract as docs/c-api.md states it, one rule per test, through the public header
// (fault injection and one look at a tensor's failure flag reach inside; nothing else does):
// discard semantics, versioned structs, handles of another runtime, budgets and NVMe space
// reserved when promised, misuse refused, errors that belong to their tensor, waits that can
// never end failing at once, and optimizer options.
#include <gtest/gtest.h>
#include <strata/strata.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "api/runtime_handle.h"
#include "api/versioned_struct.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = 1ull << 20;

class Contract : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("STRATA_TEST_DIR");
    dir_ = (fs::path(base != nullptr ? base : "/tmp") /
            ("contract-" +
             std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "-" +
             std::to_string(getpid())))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    strata_config_init(&config_);
    config_.nvme_path = dir_.c_str();
    config_.nvme_capacity_bytes = 64 * kMiB;
    config_.pinned_budget_bytes = 2 * kMiB;
    config_.device_budget_bytes = 1 * kMiB;
    config_.device_backend = STRATA_DEVICE_EMULATED;
    config_.queue_depth = 8;
  }
  void TearDown() override {
    for (strata_runtime* rt : {rt_, other_}) {
      if (rt != nullptr) EXPECT_EQ(strata_runtime_destroy(rt), STRATA_OK);
    }
    fs::remove_all(dir_);
  }

  void create(const char* faults = nullptr) {
    if (faults != nullptr) setenv("STRATA_FAULTS", faults, 1);
    const int rc = strata_runtime_create(&config_, &rt_);
    if (faults != nullptr) unsetenv("STRATA_FAULTS");
    ASSERT_EQ(rc, STRATA_OK) << strata_last_error(nullptr);
  }

  static strata_tensor_desc desc(uint64_t bytes, const char* name = "t") {
    strata_tensor_desc d{};
    d.struct_size = sizeof d;
    d.name = name;
    d.bytes = bytes;
    d.dtype = STRATA_DTYPE_F32;
    d.kind = STRATA_KIND_PARAMETER;
    d.layer = 0;
    d.home_tier = STRATA_TIER_NVME;
    return d;
  }

  strata_tensor register_tensor(strata_runtime* rt, uint64_t bytes, const char* name = "t") {
    const strata_tensor_desc d = desc(bytes, name);
    strata_tensor t = STRATA_TENSOR_NONE;
    EXPECT_EQ(strata_tensor_register(rt, &d, &t), STRATA_OK) << strata_last_error(rt);
    return t;
  }

  void write_pattern(strata_tensor t, uint64_t bytes, unsigned char value) {
    std::vector<unsigned char> data(bytes, value);
    ASSERT_EQ(strata_tensor_write(rt_, t, data.data(), 0, bytes), STRATA_OK)
        << strata_last_error(rt_);
  }

  int acquire(strata_tensor t, strata_tier tier, uint32_t flags, void** data = nullptr) {
    strata_acquired a{};
    a.struct_size = sizeof a;
    const int rc = strata_acquire(rt_, t, tier, flags, &a);
    if (data != nullptr) *data = a.data;
    return rc;
  }

  // A new optimizer group with the defaults; its index.
  uint32_t add_group() {
    strata_optimizer_group g;
    strata_optimizer_group_init(&g);
    uint32_t index = 0;
    EXPECT_EQ(strata_optimizer_add_group(rt_, &g, &index), STRATA_OK) << error();
    return index;
  }

  // A written 16 KiB parameter "p" and its gradient "p.grad", put under the optimizer in `group`.
  std::pair<strata_tensor, strata_tensor> add_param(uint32_t group) {
    const strata_tensor p = register_tensor(rt_, 16 * 1024, "p");
    write_pattern(p, 16 * 1024, 0);
    strata_tensor_desc gd = desc(16 * 1024, "p.grad");
    gd.kind = STRATA_KIND_GRADIENT;
    strata_tensor grad = STRATA_TENSOR_NONE;
    EXPECT_EQ(strata_tensor_register(rt_, &gd, &grad), STRATA_OK) << error();
    EXPECT_EQ(strata_optimizer_add_param(rt_, group, p, grad), STRATA_OK) << error();
    return {p, grad};
  }

  // Waits (bounded) until the tensor carries an asynchronous failure.
  bool wait_for_failure(strata_tensor t) {
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < deadline) {
      auto info = rt_->impl->scheduler().describe(strata::sched::TensorHandle::from_u64(t));
      if (info && info->has_error) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }

  std::string error() const { return strata_last_error(rt_); }

  std::string dir_;
  strata_config config_{};
  strata_runtime* rt_ = nullptr;
  strata_runtime* other_ = nullptr;
};

// ---- 1. Discard and never-written tensors ----------------------------------------------------

TEST_F(Contract, AReadModeAcquireOfADiscardedTensorIsRefusedNotAnsweredWithStaleBytes) {
  create();
  const strata_tensor t = register_tensor(rt_, 64 * 1024);
  write_pattern(t, 64 * 1024, 0x5a);
  ASSERT_EQ(strata_tensor_discard(rt_, t), STRATA_OK);
  EXPECT_EQ(acquire(t, STRATA_TIER_PINNED, 0), STRATA_E_STATE);
  EXPECT_NE(error().find("no contents"), std::string::npos) << error();
  EXPECT_EQ(acquire(t, STRATA_TIER_DEVICE, 0), STRATA_E_STATE);
  std::vector<unsigned char> out(64 * 1024);
  EXPECT_EQ(strata_tensor_read(rt_, t, out.data(), 0, out.size()), STRATA_E_STATE);
}

TEST_F(Contract, ADiscardedTensorIsReadableAgainOnlyAfterItIsWritten) {
  create();
  const strata_tensor t = register_tensor(rt_, 64 * 1024);
  write_pattern(t, 64 * 1024, 0x11);
  ASSERT_EQ(strata_tensor_discard(rt_, t), STRATA_OK);
  // An acquire with DISCARD and a release count as a write, clean or dirty.
  void* data = nullptr;
  ASSERT_EQ(acquire(t, STRATA_TIER_PINNED, STRATA_ACQUIRE_DISCARD, &data), STRATA_OK) << error();
  std::memset(data, 0x22, 64 * 1024);
  ASSERT_EQ(strata_release(rt_, t, 0, nullptr), STRATA_OK);
  std::vector<unsigned char> out(64 * 1024);
  ASSERT_EQ(strata_tensor_read(rt_, t, out.data(), 0, out.size()), STRATA_OK) << error();
  EXPECT_EQ(out[0], 0x22);
  EXPECT_EQ(out.back(), 0x22);
}

TEST_F(Contract, ARegisteredTensorNeverWrittenCannotBeReadOrAcquiredForReading) {
  create();
  const strata_tensor t = register_tensor(rt_, 4096);
  EXPECT_EQ(acquire(t, STRATA_TIER_PINNED, 0), STRATA_E_STATE);
  std::vector<unsigned char> out(4096);
  EXPECT_EQ(strata_tensor_read(rt_, t, out.data(), 0, out.size()), STRATA_E_STATE);
  EXPECT_EQ(acquire(t, STRATA_TIER_PINNED, STRATA_ACQUIRE_DISCARD), STRATA_OK) << error();
  EXPECT_EQ(strata_release(rt_, t, STRATA_RELEASE_DIRTY, nullptr), STRATA_OK);
}

TEST_F(Contract, AFreshAllocationIsAcquiredWithUndefinedContentsAsMallocIs) {
  create();
  for (uint32_t flags : {0u, STRATA_MALLOC_OFFLOADABLE}) {
    strata_tensor a = STRATA_TENSOR_NONE;
    ASSERT_EQ(strata_malloc(rt_, 8192, STRATA_TIER_PINNED, flags, &a), STRATA_OK) << error();
    void* data = nullptr;
    EXPECT_EQ(acquire(a, STRATA_TIER_PINNED, 0, &data), STRATA_OK) << error();
    EXPECT_NE(data, nullptr);
    EXPECT_EQ(strata_release(rt_, a, 0, nullptr), STRATA_OK);
    // Discarded, it has no contents, like any tensor.
    ASSERT_EQ(strata_tensor_discard(rt_, a), STRATA_OK);
    EXPECT_EQ(acquire(a, STRATA_TIER_PINNED, 0), STRATA_E_STATE);
    EXPECT_EQ(strata_free(rt_, a), STRATA_OK);
  }
}

// ---- 2. Versioned structs --------------------------------------------------------------------

// A struct from a newer header: this library's struct, then `extra` bytes of fields it lacks.
template <typename T>
struct Newer {
  T known;
  unsigned char extra[16];
};

TEST_F(Contract, EveryInStructWithUnknownNonZeroFieldsIsRefusedAndWithZeroFieldsAccepted) {
  Newer<strata_config> config{};
  config.known = config_;
  config.known.struct_size = sizeof config;
  config.extra[3] = 1;
  strata_runtime* rt = nullptr;
  EXPECT_EQ(strata_runtime_create(&config.known, &rt), STRATA_E_UNSUPPORTED);
  config.extra[3] = 0;
  ASSERT_EQ(strata_runtime_create(&config.known, &rt_), STRATA_OK) << strata_last_error(nullptr);

  Newer<strata_tensor_desc> d{};
  d.known = desc(4096);
  d.known.struct_size = sizeof d;
  d.extra[0] = 7;
  strata_tensor t = STRATA_TENSOR_NONE;
  EXPECT_EQ(strata_tensor_register(rt_, &d.known, &t), STRATA_E_UNSUPPORTED);
  EXPECT_NE(error().find("does not know"), std::string::npos) << error();
  d.extra[0] = 0;
  EXPECT_EQ(strata_tensor_register(rt_, &d.known, &t), STRATA_OK) << error();

  Newer<strata_optimizer_group> g{};
  strata_optimizer_group_init(&g.known);
  g.known.struct_size = sizeof g;
  g.extra[15] = 1;
  uint32_t index = 0;
  EXPECT_EQ(strata_optimizer_add_group(rt_, &g.known, &index), STRATA_E_UNSUPPORTED);
  g.extra[15] = 0;
  ASSERT_EQ(strata_optimizer_add_group(rt_, &g.known, &index), STRATA_OK) << error();
  g.extra[15] = 1;
  EXPECT_EQ(strata_optimizer_set_group(rt_, index, &g.known), STRATA_E_UNSUPPORTED);

  Newer<strata_optimizer_options> o{};
  strata_optimizer_options_init(&o.known);
  o.known.struct_size = sizeof o;
  o.extra[8] = 1;
  EXPECT_EQ(strata_optimizer_configure(rt_, &o.known), STRATA_E_UNSUPPORTED);
  o.extra[8] = 0;
  EXPECT_EQ(strata_optimizer_configure(rt_, &o.known), STRATA_OK) << error();
}

TEST_F(Contract, EveryOutStructFromANewerHeaderGetsItsUnknownFieldsZeroed) {
  create();
  const strata_tensor t = register_tensor(rt_, 4096);
  write_pattern(t, 4096, 1);

  Newer<strata_acquired> a{};
  a.known.struct_size = sizeof a;
  std::memset(a.extra, 0xab, sizeof a.extra);
  ASSERT_EQ(strata_acquire(rt_, t, STRATA_TIER_PINNED, 0, &a.known), STRATA_OK) << error();
  EXPECT_NE(a.known.data, nullptr);
  EXPECT_EQ(a.known.struct_size, sizeof a);
  for (unsigned char b : a.extra) EXPECT_EQ(b, 0);
  ASSERT_EQ(strata_release(rt_, t, 0, nullptr), STRATA_OK);

  Newer<strata_stats> s{};
  s.known.struct_size = sizeof s;
  std::memset(s.extra, 0xab, sizeof s.extra);
  ASSERT_EQ(strata_get_stats(rt_, &s.known), STRATA_OK) << error();
  EXPECT_GT(s.known.pinned.reserved_bytes + s.known.pinned.in_use_bytes, 0u);
  for (unsigned char b : s.extra) EXPECT_EQ(b, 0);

  Newer<strata_optimizer_group> g{};
  strata_optimizer_group_init(&g.known);
  uint32_t index = 0;
  ASSERT_EQ(strata_optimizer_add_group(rt_, &g.known, &index), STRATA_OK);
  g.known.struct_size = sizeof g;
  std::memset(g.extra, 0xab, sizeof g.extra);
  ASSERT_EQ(strata_optimizer_get_group(rt_, index, &g.known), STRATA_OK) << error();
  for (unsigned char b : g.extra) EXPECT_EQ(b, 0);

  Newer<strata_optimizer_options> o{};
  o.known.struct_size = sizeof o;
  std::memset(o.extra, 0xab, sizeof o.extra);
  ASSERT_EQ(strata_optimizer_get_options(rt_, &o.known), STRATA_OK) << error();
  EXPECT_EQ(o.known.check_overflow, 1);
  for (unsigned char b : o.extra) EXPECT_EQ(b, 0);

  Newer<strata_optimizer_result> r{};
  r.known.struct_size = sizeof r;
  std::memset(r.extra, 0xab, sizeof r.extra);
  ASSERT_EQ(strata_optimizer_step(rt_, 1.0, &r.known), STRATA_OK) << error();
  EXPECT_EQ(r.known.step, 1);
  for (unsigned char b : r.extra) EXPECT_EQ(b, 0);
}

TEST_F(Contract, AStructSmallerThanItsFirstVersionIsInvalidNotHalfFilled) {
  create();
  const strata_tensor t = register_tensor(rt_, 4096);
  write_pattern(t, 4096, 1);
  // An acquire whose struct could not hold the data pointer must not succeed without it.
  strata_acquired a{};
  a.struct_size = offsetof(strata_acquired, data);
  EXPECT_EQ(strata_acquire(rt_, t, STRATA_TIER_PINNED, 0, &a), STRATA_E_INVALID);
  EXPECT_NE(error().find("first version"), std::string::npos) << error();
  strata_stats s{};
  s.struct_size = offsetof(strata_stats, nvme_bytes_read);
  EXPECT_EQ(strata_get_stats(rt_, &s), STRATA_E_INVALID);
  strata_tensor_desc d = desc(4096);
  d.struct_size = offsetof(strata_tensor_desc, dtype);
  strata_tensor u = STRATA_TENSOR_NONE;
  EXPECT_EQ(strata_tensor_register(rt_, &d, &u), STRATA_E_INVALID);
}

TEST_F(Contract, AnOlderConfigWithoutTheLayoutFieldGetsTheDefaultLayout) {
  // A header from before nvme_layout: the field is not read (the garbage there is ignored).
  strata_config older = config_;
  older.struct_size = offsetof(strata_config, nvme_layout);
  older.nvme_layout = static_cast<strata_nvme_layout>(77);
  ASSERT_EQ(strata_runtime_create(&older, &rt_), STRATA_OK) << strata_last_error(nullptr);
  EXPECT_EQ(rt_->impl->config().nvme_layout, STRATA_NVME_EXTENTS);
}

TEST_F(Contract, AFirstVersionConfigsPaddingAfterNumaNodeIsNotReadAsTraceEvents) {
  // The first version ended with numa_node, 4 bytes short of its 8-byte size; trace_events lies
  // in those bytes now. A first-version caller's padding is whatever its stack held.
  strata_config first = config_;
  first.struct_size = offsetof(strata_config, numa_node) + 8;
  ASSERT_EQ(first.struct_size % 8, 0u);
  first.trace_events = 0xffffffffu;  // past the limit, were it read
  ASSERT_EQ(strata_runtime_create(&first, &rt_), STRATA_OK) << strata_last_error(nullptr);
  EXPECT_EQ(rt_->impl->config().trace_events, 0u);
  EXPECT_EQ(strata_export_trace(rt_, (dir_ + "/trace.json").c_str()), STRATA_E_STATE);
  // One size up, the field is read.
  strata_config second = config_;
  second.struct_size = offsetof(strata_config, planned_tensors) + 8;
  second.trace_events = 0xffffffffu;
  EXPECT_EQ(strata_runtime_create(&second, &other_), STRATA_E_INVALID);
}

TEST_F(Contract, PlannedTensorsAreCheckedUnderEveryPolicy) {
  // The default policy sizes nothing from them, but a bad array is still the caller's bug.
  strata_tensor_desc planned[2] = {desc(4096, "a"), desc(4096, "b")};
  config_.planned_tensors = planned;
  config_.planned_tensor_count = 2;
  for (int bad = 0; bad < 4; ++bad) {
    planned[0] = desc(4096, "a");
    planned[1] = desc(4096, "b");
    switch (bad) {
      case 0:
        planned[1].bytes = 0;
        break;
      case 1:
        planned[1].dtype = static_cast<strata_dtype>(77);
        break;
      case 2:
        planned[1].kind = static_cast<strata_tensor_kind>(77);
        break;
      case 3:
        planned[0].struct_size = 8;  // below the first version
        break;
    }
    EXPECT_EQ(strata_runtime_create(&config_, &rt_), STRATA_E_INVALID) << "case " << bad;
    EXPECT_NE(std::string(strata_last_error(nullptr)).find("planned_tensors"), std::string::npos)
        << strata_last_error(nullptr);
  }
  planned[0] = desc(4096, "a");
  planned[1] = desc(4096, "b");
  ASSERT_EQ(strata_runtime_create(&config_, &rt_), STRATA_OK) << strata_last_error(nullptr);
}

TEST_F(Contract, ZeroInfinityBuffersThatDoNotFitThePinnedBudgetFailAtCreation) {
  // Slots of 100,000 f32 elements (400 KB) for 300 KiB tensors: DeepSpeed's buffer_size rule.
  // Five such slots do not fit 1 MiB, so creation fails as DeepSpeed's engine does at start,
  // instead of charging pools past the arena's budget and failing a write-back later.
  strata_tensor_desc planned[4] = {desc(300 * 1024, "z0"), desc(300 * 1024, "z1"),
                                   desc(300 * 1024, "z2"), desc(300 * 1024, "z3")};
  config_.policy = STRATA_POLICY_ZERO_INFINITY;
  config_.stream_chunk_bytes = STRATA_STREAMING_OFF;
  config_.planned_tensors = planned;
  config_.planned_tensor_count = 4;
  config_.zero_sub_group_elements = 100000;
  config_.zero_param_buffer_elements = 100000;
  config_.pinned_budget_bytes = 1 * kMiB;
  EXPECT_EQ(strata_runtime_create(&config_, &rt_), STRATA_E_PINNED_BUDGET);
  EXPECT_NE(std::string(strata_last_error(nullptr)).find("ZeRO-Infinity's pinned buffers"),
            std::string::npos)
      << strata_last_error(nullptr);
  // With room for them, every write and write-back fits, and the stats stay within the budget.
  config_.pinned_budget_bytes = 16 * kMiB;
  ASSERT_EQ(strata_runtime_create(&config_, &rt_), STRATA_OK) << strata_last_error(nullptr);
  std::vector<unsigned char> bytes(300 * 1024, 7);
  for (const strata_tensor_desc& d : planned) {
    strata_tensor t = STRATA_TENSOR_NONE;
    ASSERT_EQ(strata_tensor_register(rt_, &d, &t), STRATA_OK) << error();
    ASSERT_EQ(strata_tensor_write(rt_, t, bytes.data(), 0, bytes.size()), STRATA_OK) << error();
  }
  ASSERT_EQ(strata_sync(rt_), STRATA_OK) << error();
  strata_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(strata_get_stats(rt_, &s), STRATA_OK);
  EXPECT_LE(s.pinned.peak_in_use_bytes, s.pinned_budget_bytes);
  EXPECT_LE(s.pinned.peak_reserved_bytes, s.pinned_budget_bytes);
}

TEST_F(Contract, AStructSizeThatIsNotAMultipleOfEightOrIsTooSmallIsInvalid) {
  create();
  strata_tensor_desc d = desc(4096);
  strata_tensor t = STRATA_TENSOR_NONE;
  for (size_t size : {size_t{0}, size_t{4}, sizeof d - 4, sizeof d + 4, size_t{65544}}) {
    d.struct_size = size;
    EXPECT_EQ(strata_tensor_register(rt_, &d, &t), STRATA_E_INVALID) << size;
  }
  strata_stats s{};
  s.struct_size = 12;
  EXPECT_EQ(strata_get_stats(rt_, &s), STRATA_E_INVALID);
  strata_config c = config_;
  c.struct_size = 3;
  strata_runtime* rt = nullptr;
  EXPECT_EQ(strata_runtime_create(&c, &rt), STRATA_E_INVALID);
}

// ---- 3. Handles belong to their runtime ------------------------------------------------------

TEST_F(Contract, AHandleUsedWithAnotherRuntimeIsABadHandle) {
  create();
  const std::string other_dir = dir_ + "/other";
  fs::create_directories(other_dir);
  strata_config other = config_;
  other.nvme_path = other_dir.c_str();
  ASSERT_EQ(strata_runtime_create(&other, &other_), STRATA_OK) << strata_last_error(nullptr);
  const strata_tensor a = register_tensor(rt_, 4096, "a");
  const strata_tensor b = register_tensor(other_, 4096, "b");
  EXPECT_NE(a, b);
  write_pattern(a, 4096, 3);
  std::vector<unsigned char> out(4096);
  EXPECT_EQ(strata_tensor_read(other_, a, out.data(), 0, out.size()), STRATA_E_BAD_HANDLE);
  EXPECT_NE(std::string(strata_last_error(other_)).find("another runtime"), std::string::npos);
  EXPECT_EQ(strata_tensor_unregister(rt_, b), STRATA_E_BAD_HANDLE);
  EXPECT_EQ(acquire(b, STRATA_TIER_PINNED, STRATA_ACQUIRE_DISCARD), STRATA_E_BAD_HANDLE);
  EXPECT_EQ(strata_tensor_discard(other_, a), STRATA_E_BAD_HANDLE);
}

// ---- 4. Budgets are reserved at strata_malloc ------------------------------------------------

TEST_F(Contract, AResidentAllocationPastItsBudgetFailsAtTheCallWithTheNumbers) {
  create();
  strata_tensor a = STRATA_TENSOR_NONE;
  EXPECT_EQ(strata_malloc(rt_, 3 * kMiB, STRATA_TIER_PINNED, 0, &a), STRATA_E_PINNED_BUDGET);
  EXPECT_NE(error().find("2.00 MiB"), std::string::npos) << error();
  EXPECT_EQ(a, STRATA_TENSOR_NONE);
  EXPECT_EQ(strata_malloc(rt_, 2 * kMiB, STRATA_TIER_DEVICE, 0, &a), STRATA_E_DEVICE_BUDGET);

  // Two that fit one by one but not together: the second fails at its call, not at an acquire.
  strata_tensor first = STRATA_TENSOR_NONE;
  strata_tensor second = STRATA_TENSOR_NONE;
  ASSERT_EQ(strata_malloc(rt_, 1536 * 1024, STRATA_TIER_PINNED, 0, &first), STRATA_OK) << error();
  EXPECT_EQ(strata_malloc(rt_, 1 * kMiB, STRATA_TIER_PINNED, 0, &second), STRATA_E_PINNED_BUDGET);
  EXPECT_NE(error().find("never leave"), std::string::npos) << error();
  strata_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(strata_get_stats(rt_, &s), STRATA_OK);
  EXPECT_GE(s.pinned.in_use_bytes, 1536u * 1024);  // the first is held from its call on
  ASSERT_EQ(strata_free(rt_, first), STRATA_OK);
  EXPECT_EQ(strata_malloc(rt_, 1 * kMiB, STRATA_TIER_PINNED, 0, &second), STRATA_OK) << error();
}

// ---- 5. NVMe space is reserved at registration -----------------------------------------------

TEST_F(Contract, RegisteringMoreThanTheNvmeTierHoldsFailsAtRegistrationWithTheNumbers) {
  config_.nvme_capacity_bytes = 16 * kMiB;
  create();
  const strata_tensor first = register_tensor(rt_, 10 * kMiB, "first");
  const strata_tensor_desc d = desc(10 * kMiB, "second");
  strata_tensor second = STRATA_TENSOR_NONE;
  EXPECT_EQ(strata_tensor_register(rt_, &d, &second), STRATA_E_NOSPACE);
  EXPECT_NE(error().find("nvme_capacity_bytes"), std::string::npos) << error();
  EXPECT_NE(error().find("second"), std::string::npos) << error();
  strata_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(strata_get_stats(rt_, &s), STRATA_OK);
  EXPECT_GE(s.nvme.in_use_bytes, 10 * kMiB);  // reserved before anything was written
  ASSERT_EQ(strata_tensor_unregister(rt_, first), STRATA_OK);
  EXPECT_EQ(strata_tensor_register(rt_, &d, &second), STRATA_OK) << error();
}

// ---- 6. Misuse is refused --------------------------------------------------------------------

TEST_F(Contract, FreeOfARegisteredTensorAndUnregisterOfAnAllocationAreRefused) {
  create();
  const strata_tensor t = register_tensor(rt_, 4096);
  EXPECT_EQ(strata_free(rt_, t), STRATA_E_STATE);
  EXPECT_NE(error().find("strata_tensor_unregister"), std::string::npos) << error();
  strata_tensor a = STRATA_TENSOR_NONE;
  ASSERT_EQ(strata_malloc(rt_, 4096, STRATA_TIER_PINNED, 0, &a), STRATA_OK);
  EXPECT_EQ(strata_tensor_unregister(rt_, a), STRATA_E_STATE);
  EXPECT_NE(error().find("strata_free"), std::string::npos) << error();
  // Both still there, and each goes the documented way.
  EXPECT_EQ(strata_tensor_unregister(rt_, t), STRATA_OK);
  EXPECT_EQ(strata_free(rt_, a), STRATA_OK);
}

TEST_F(Contract, LayerCallsOutsideAStepAreRefused) {
  create();
  EXPECT_EQ(strata_layer_begin(rt_, STRATA_PHASE_FORWARD, 0), STRATA_E_STATE);
  EXPECT_NE(error().find("outside a step"), std::string::npos) << error();
  EXPECT_EQ(strata_layer_end(rt_, STRATA_PHASE_FORWARD, 0), STRATA_E_STATE);
  ASSERT_EQ(strata_step_begin(rt_), STRATA_OK);
  EXPECT_EQ(strata_layer_begin(rt_, STRATA_PHASE_FORWARD, 0), STRATA_OK);
  EXPECT_EQ(strata_layer_end(rt_, STRATA_PHASE_FORWARD, 0), STRATA_OK);
  EXPECT_EQ(strata_step_end(rt_), STRATA_OK);
}

// ---- 7. Errors belong to the tensor that caused them -----------------------------------------

TEST_F(Contract, AFailedWriteBackOfAnUnregisteredTensorIsNotReportedBySync) {
  create("write:enospc:count=1");
  const strata_tensor victim = register_tensor(rt_, 1 * kMiB, "victim");
  write_pattern(victim, 1 * kMiB, 0x33);
  // Another tensor needs the pinned room: the victim is written back, and that write fails (the
  // write of `a` then fails at once: the room is held until the failure is reported).
  const strata_tensor a = register_tensor(rt_, 1536 * 1024, "a");
  std::vector<unsigned char> data(1536 * 1024, 0x44);
  (void)strata_tensor_write(rt_, a, data.data(), 0, data.size());
  ASSERT_TRUE(wait_for_failure(victim)) << "the injected write-back failure never happened";
  ASSERT_EQ(strata_tensor_unregister(rt_, victim), STRATA_OK) << error();
  EXPECT_EQ(strata_sync(rt_), STRATA_OK) << error();
}

TEST_F(Contract, ATensorWhoseWriteBackFailedIsReadBackWithItsKeptBytesAndSyncReportsOnce) {
  create("write:enospc:count=1");
  const strata_tensor t = register_tensor(rt_, 256 * 1024, "kept");
  write_pattern(t, 256 * 1024, 0x77);
  EXPECT_EQ(strata_sync(rt_), STRATA_E_NOSPACE);  // the write-back failed, and sync says so
  EXPECT_NE(error().find("kept"), std::string::npos) << error();
  // The data stayed in memory: it reads back, and the retried write-back succeeds.
  std::vector<unsigned char> out(256 * 1024);
  ASSERT_EQ(strata_tensor_read(rt_, t, out.data(), 0, out.size()), STRATA_OK) << error();
  EXPECT_EQ(out[0], 0x77);
  EXPECT_EQ(out.back(), 0x77);
  EXPECT_EQ(strata_sync(rt_), STRATA_OK) << error();
}

TEST_F(Contract, ReadingATensorWhoseWriteBackFailedUnreportedGivesItsBytes) {
  create("write:enospc:count=1");
  const strata_tensor victim = register_tensor(rt_, 1 * kMiB, "victim");
  write_pattern(victim, 1 * kMiB, 0x35);
  const strata_tensor a = register_tensor(rt_, 1536 * 1024, "a");
  std::vector<unsigned char> data(1536 * 1024, 0x45);
  (void)strata_tensor_write(rt_, a, data.data(), 0, data.size());
  ASSERT_TRUE(wait_for_failure(victim));
  std::vector<unsigned char> out(1 * kMiB);
  ASSERT_EQ(strata_tensor_read(rt_, victim, out.data(), 0, out.size()), STRATA_OK) << error();
  EXPECT_EQ(out[12345], 0x35);
  EXPECT_EQ(strata_sync(rt_), STRATA_E_NOSPACE);  // reported once, to the durability call
  EXPECT_EQ(strata_sync(rt_), STRATA_OK) << error();
}

// ---- 8. Waits that can never end fail at once ------------------------------------------------

TEST_F(Contract, AnAcquireThatCanNeverFitBesideResidentAllocationsFailsAtOnce) {
  create();
  strata_tensor held = STRATA_TENSOR_NONE;
  ASSERT_EQ(strata_malloc(rt_, 1536 * 1024, STRATA_TIER_PINNED, 0, &held), STRATA_OK) << error();
  const strata_tensor t = register_tensor(rt_, 1 * kMiB);
  const auto start = Clock::now();
  EXPECT_EQ(acquire(t, STRATA_TIER_PINNED, STRATA_ACQUIRE_DISCARD), STRATA_E_PINNED_BUDGET);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30)) << "it waited for its timeout";
  EXPECT_NE(error().find("never leave"), std::string::npos) << error();
}

TEST_F(Contract, AnAcquireBlockedByAFailedUnreportedWriteBackFailsAtOnceWithItsCause) {
  // Every write fails: the victim's write-back can never succeed until its failure is reported.
  create("write:enospc");
  const strata_tensor victim = register_tensor(rt_, 1536 * 1024, "victim");
  write_pattern(victim, 1536 * 1024, 0x66);
  const strata_tensor t = register_tensor(rt_, 1 * kMiB, "wanted");
  const auto start = Clock::now();
  const int rc = acquire(t, STRATA_TIER_PINNED, STRATA_ACQUIRE_DISCARD);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30)) << "it waited for its timeout";
  EXPECT_EQ(rc, STRATA_E_NOSPACE) << error();
  EXPECT_NE(error().find("victim"), std::string::npos) << error();
}

// ---- 9. Optimizer options --------------------------------------------------------------------

TEST_F(Contract, TensorsUnderTheOptimizerStayRegisteredAndAStaleHandleIsABadHandle) {
  create();
  const auto [p, grad] = add_param(add_group());
  ASSERT_FALSE(HasFailure());
  // Unregistered, either would leave every later step failing on it.
  for (strata_tensor t : {p, grad}) {
    EXPECT_EQ(strata_tensor_unregister(rt_, t), STRATA_E_STATE);
    EXPECT_NE(error().find("under the optimizer"), std::string::npos) << error();
  }
  std::vector<float> master(4096);
  EXPECT_EQ(strata_optimizer_read_state(rt_, p, STRATA_OPTIMIZER_MASTER, master.data(),
                                        master.size() * sizeof(float)),
            STRATA_OK)
      << error();
  // A tensor that is not under the optimizer, once unregistered, is a bad handle to every
  // optimizer call that takes a tensor, as to every other call.
  const strata_tensor other = register_tensor(rt_, 16 * 1024, "other");
  ASSERT_EQ(strata_tensor_unregister(rt_, other), STRATA_OK) << error();
  EXPECT_EQ(strata_optimizer_read_state(rt_, other, STRATA_OPTIMIZER_MASTER, master.data(),
                                        master.size() * sizeof(float)),
            STRATA_E_BAD_HANDLE);
  EXPECT_EQ(strata_optimizer_write_state(rt_, other, STRATA_OPTIMIZER_MASTER, master.data(),
                                         master.size() * sizeof(float)),
            STRATA_E_BAD_HANDLE);
  EXPECT_EQ(strata_optimizer_grad_ready(rt_, other), STRATA_E_BAD_HANDLE);
}

TEST_F(Contract, OptimizerOptionsChangeAfterAddParamExceptTheSubGroupSize) {
  create();
  const uint32_t index = add_group();
  strata_optimizer_options o;
  strata_optimizer_options_init(&o);
  o.sub_group_bytes = 64 * 1024;
  ASSERT_EQ(strata_optimizer_configure(rt_, &o), STRATA_OK) << error();
  add_param(index);
  ASSERT_FALSE(HasFailure());

  // Read, change one field, write back: allowed.
  strata_optimizer_options now{};
  now.struct_size = sizeof now;
  ASSERT_EQ(strata_optimizer_get_options(rt_, &now), STRATA_OK) << error();
  EXPECT_EQ(now.sub_group_bytes, 64u * 1024);
  now.max_grad_norm = 1.0;
  now.check_overflow = 0;
  ASSERT_EQ(strata_optimizer_configure(rt_, &now), STRATA_OK) << error();
  strata_optimizer_options after{};
  after.struct_size = sizeof after;
  ASSERT_EQ(strata_optimizer_get_options(rt_, &after), STRATA_OK);
  EXPECT_EQ(after.max_grad_norm, 1.0);
  EXPECT_EQ(after.check_overflow, 0);

  // The sub-group size is frozen: refused, with the value in force named, and nothing changed.
  now.sub_group_bytes = 128 * 1024;
  now.max_grad_norm = 2.0;
  EXPECT_EQ(strata_optimizer_configure(rt_, &now), STRATA_E_STATE);
  EXPECT_NE(error().find("65536"), std::string::npos) << error();
  ASSERT_EQ(strata_optimizer_get_options(rt_, &after), STRATA_OK);
  EXPECT_EQ(after.max_grad_norm, 1.0);
  EXPECT_EQ(after.sub_group_bytes, 64u * 1024);
}

}  // namespace

// ---- The versioned-struct rule itself, on a struct that has had two versions -----------------

namespace fake {
// Version 2 of a struct whose version 1 ended after `first`.
struct TwoVersions {
  size_t struct_size;
  uint64_t first;
  uint64_t second;
};
}  // namespace fake

template <>
inline constexpr size_t strata::api::kFirstVersionSize<fake::TwoVersions> =
    offsetof(fake::TwoVersions, second);

namespace {

TEST(VersionedStruct, AnOlderInStructTakesTheDefaultsOfWhatItLacks) {
  fake::TwoVersions older{offsetof(fake::TwoVersions, second), 5, 99};  // `second` is not there
  auto read = strata::api::read_struct_in(&older, fake::TwoVersions{0, 1, 2}, "fake");
  ASSERT_TRUE(read.is_ok()) << read.status().message();
  EXPECT_EQ(read->first, 5u);
  EXPECT_EQ(read->second, 2u);
  EXPECT_EQ(read->struct_size, sizeof(fake::TwoVersions));
}

TEST(VersionedStruct, AnOlderOutStructGetsTheFieldsItHasAndNothingBeyond) {
  fake::TwoVersions older{offsetof(fake::TwoVersions, second), 0, 99};
  ASSERT_TRUE(strata::api::check_struct_out(&older, "fake").is_ok());
  strata::api::write_struct_out(&older, fake::TwoVersions{sizeof(fake::TwoVersions), 7, 8});
  EXPECT_EQ(older.struct_size, offsetof(fake::TwoVersions, second));
  EXPECT_EQ(older.first, 7u);
  EXPECT_EQ(older.second, 99u) << "written past the caller's struct_size";
}

TEST(VersionedStruct, BelowTheFirstVersionOrOffTheAlignmentIsInvalid) {
  fake::TwoVersions bad{8, 0, 0};
  EXPECT_EQ(strata::api::check_struct_out(&bad, "fake").code(), STRATA_E_INVALID);
  bad.struct_size = 20;
  EXPECT_EQ(strata::api::check_struct_out(&bad, "fake").code(), STRATA_E_INVALID);
}

}  // namespace

namespace {

TEST_F(Contract, AnAllocationThatNeedsRoomHeldByATensorInUseFailsAtOnceRatherThanWaits) {
  create();
  const strata_tensor held = register_tensor(rt_, 1536 * 1024, "held");
  void* data = nullptr;
  ASSERT_EQ(acquire(held, STRATA_TIER_PINNED, STRATA_ACQUIRE_DISCARD, &data), STRATA_OK);
  strata_tensor a = STRATA_TENSOR_NONE;
  const auto start = Clock::now();
  // One thread: the release that would make room can only come after this call returns.
  EXPECT_EQ(strata_malloc(rt_, 1 * kMiB, STRATA_TIER_PINNED, STRATA_MALLOC_OFFLOADABLE, &a),
            STRATA_E_PINNED_BUDGET);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
  EXPECT_NE(error().find("does not wait for releases"), std::string::npos) << error();
  ASSERT_EQ(strata_release(rt_, held, STRATA_RELEASE_DIRTY, nullptr), STRATA_OK);
  // Released (dirty): the room is made by writing it back, and the allocation succeeds.
  EXPECT_EQ(strata_malloc(rt_, 1 * kMiB, STRATA_TIER_PINNED, STRATA_MALLOC_OFFLOADABLE, &a),
            STRATA_OK)
      << error();
}

}  // namespace
