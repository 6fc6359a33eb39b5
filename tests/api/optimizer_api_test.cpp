// The optimizer through the C API, as a framework drives it: steps over states streamed from NVMe
// in many sub-groups must equal CpuAdam applied directly to the same data, bit for bit; overflow
// skips, clipping, step counts, state access, checkpoints (round trip, damage, interruption) and
// every refused call.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <strata/strata.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/owner_process.h"
#include "optim/cpu_adam.h"
#include "optim/half_convert.h"

namespace {

namespace fs = std::filesystem;
using strata::DType;

std::string scratch_dir(const std::string& name) {
  const char* base = std::getenv("STRATA_TEST_DIR");
  fs::path dir = fs::path(base != nullptr ? base : "/tmp") /
                 ("optimizer-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

uint32_t dsize(strata_dtype d) {
  return d == STRATA_DTYPE_F32 ? 4 : 2;
}

DType internal(strata_dtype d) {
  return static_cast<DType>(d);
}

// Values in `dtype` made from floats; back() widens them again.
std::vector<unsigned char> encode(const std::vector<float>& values, strata_dtype dtype) {
  std::vector<unsigned char> out(values.size() * dsize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == STRATA_DTYPE_F32) {
      std::memcpy(&out[4 * i], &values[i], 4);
    } else {
      const uint16_t h = dtype == STRATA_DTYPE_BF16 ? strata::optim::float_to_bf16(values[i])
                                                    : strata::optim::float_to_fp16(values[i]);
      std::memcpy(&out[2 * i], &h, 2);
    }
  }
  return out;
}

std::vector<float> widen(const std::vector<unsigned char>& bytes, strata_dtype dtype) {
  const size_t n = bytes.size() / dsize(dtype);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == STRATA_DTYPE_F32) {
      std::memcpy(&out[i], &bytes[4 * i], 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &bytes[2 * i], 2);
      out[i] = dtype == STRATA_DTYPE_BF16 ? strata::optim::bf16_to_float(h)
                                          : strata::optim::fp16_to_float(h);
    }
  }
  return out;
}

std::vector<float> random_values(size_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// One parameter as the test keeps it: handles, and the reference states CpuAdam updates directly.
struct RefParam {
  std::string name;
  size_t n = 0;
  strata_tensor param = STRATA_TENSOR_NONE;
  strata_tensor grad = STRATA_TENSOR_NONE;
  std::vector<float> master, m, v;
  std::vector<unsigned char> grad_bytes;  // this step's gradient, as written
};

struct ModelSetup {
  strata_dtype param_dtype = STRATA_DTYPE_BF16;
  strata_dtype grad_dtype = STRATA_DTYPE_BF16;
  std::vector<size_t> sizes = {30000, 50001, 12345};
  uint64_t sub_group_bytes = 16 * 1024;  // 4096 elements: 25 sub-groups in all
  double max_grad_norm = 0;
  int check_overflow = 1;
  int overlap_backward = 0;
  uint64_t pinned_budget = 640 * 1024;  // too small for streaming: tensors held in pinned memory
  // Gradients written on the (emulated) device, as backward on a GPU makes them.
  bool gradients_on_device = false;
  // Gradients written in pinned memory, as backward computing on the CPU makes them.
  bool gradients_in_pinned = false;
  // Where parameters and gradients rest (LoRA adapters: PINNED, their states then too).
  strata_tier home = STRATA_TIER_NVME;
};

class Optimizer : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override {
    destroy();
    fs::remove_all(dir_);
  }
  void destroy() {
    if (rt_ != nullptr) EXPECT_EQ(strata_runtime_destroy(rt_), STRATA_OK);
    rt_ = nullptr;
    params_.clear();
  }

  // A runtime whose pinned budget (640 KiB) is about half the 1.1 MB of optimizer states: they
  // must stream from NVMe, in 25 sub-groups.
  void create(const ModelSetup& setup) {
    setup_ = setup;
    strata_config c;
    strata_config_init(&c);
    c.nvme_path = dir_.c_str();
    c.nvme_capacity_bytes = 64ull << 20;
    c.pinned_budget_bytes = setup.pinned_budget;
    c.device_budget_bytes = 1ull << 20;
    c.device_backend = STRATA_DEVICE_EMULATED;
    c.queue_depth = 8;
    c.optimizer_threads = 2;
    ASSERT_EQ(strata_runtime_create(&c, &rt_), STRATA_OK) << strata_last_error(nullptr);
    strata_optimizer_options o;
    ASSERT_EQ(strata_optimizer_options_init(&o), STRATA_OK);
    o.sub_group_bytes = setup.sub_group_bytes;
    o.max_grad_norm = setup.max_grad_norm;
    o.check_overflow = setup.check_overflow;
    o.overlap_backward = setup.overlap_backward;
    ASSERT_EQ(strata_optimizer_configure(rt_, &o), STRATA_OK) << strata_last_error(rt_);
    strata_optimizer_group g;
    ASSERT_EQ(strata_optimizer_group_init(&g), STRATA_OK);
    g.lr = 1e-2;
    g.weight_decay = 0.05;
    uint32_t index = 99;
    ASSERT_EQ(strata_optimizer_add_group(rt_, &g, &index), STRATA_OK) << strata_last_error(rt_);
    ASSERT_EQ(index, 0u);
    group_ = g;
    for (size_t i = 0; i < setup.sizes.size(); ++i) add_param(setup.sizes[i], 100 + i);
    adam_ = strata::optim::CpuAdam::create({}).value();
  }

  strata_tensor register_tensor(const std::string& name, uint64_t bytes, strata_dtype dtype,
                                strata_tensor_kind kind, strata_tier home = STRATA_TIER_NVME) {
    strata_tensor_desc d{};
    d.struct_size = sizeof d;
    d.name = name.c_str();
    d.bytes = bytes;
    d.dtype = dtype;
    d.kind = kind;
    d.layer = 0;
    d.home_tier = home;
    strata_tensor t = STRATA_TENSOR_NONE;
    EXPECT_EQ(strata_tensor_register(rt_, &d, &t), STRATA_OK) << strata_last_error(rt_);
    return t;
  }

  void add_param(size_t n, uint64_t seed) {
    RefParam p;
    p.name = "layers." + std::to_string(params_.size()) + ".weight";
    p.n = n;
    p.param = register_tensor(p.name, n * dsize(setup_.param_dtype), setup_.param_dtype,
                              STRATA_KIND_PARAMETER, setup_.home);
    p.grad = register_tensor(p.name + ".grad", n * dsize(setup_.grad_dtype), setup_.grad_dtype,
                             STRATA_KIND_GRADIENT, setup_.home);
    const auto bytes = encode(random_values(n, seed, 1.0f), setup_.param_dtype);
    ASSERT_EQ(strata_tensor_write(rt_, p.param, bytes.data(), 0, bytes.size()), STRATA_OK);
    ASSERT_EQ(strata_optimizer_add_param(rt_, 0, p.param, p.grad), STRATA_OK)
        << strata_last_error(rt_);
    p.master = widen(bytes, setup_.param_dtype);
    p.m.assign(n, 0.0f);
    p.v.assign(n, 0.0f);
    params_.push_back(std::move(p));
  }

  // Writes a fresh gradient (loss-scaled) into every parameter's gradient tensor.
  void write_gradients(uint64_t seed, float loss_scale) {
    for (size_t i = 0; i < params_.size(); ++i) {
      RefParam& p = params_[i];
      auto g = random_values(p.n, seed * 31 + i, 0.05f * loss_scale);
      p.grad_bytes = encode(g, setup_.grad_dtype);
      if (setup_.gradients_on_device || setup_.gradients_in_pinned) {
        strata_acquired a{};
        a.struct_size = sizeof a;
        const strata_tier tier =
            setup_.gradients_on_device ? STRATA_TIER_DEVICE : STRATA_TIER_PINNED;
        ASSERT_EQ(strata_acquire(rt_, p.grad, tier, STRATA_ACQUIRE_DISCARD, &a), STRATA_OK)
            << strata_last_error(rt_);
        std::memcpy(a.data, p.grad_bytes.data(), p.grad_bytes.size());
        ASSERT_EQ(strata_release(rt_, p.grad, STRATA_RELEASE_DIRTY, nullptr), STRATA_OK);
        continue;
      }
      ASSERT_EQ(strata_tensor_write(rt_, p.grad, p.grad_bytes.data(), 0, p.grad_bytes.size()),
                STRATA_OK)
          << strata_last_error(rt_);
    }
  }

  // The reference: CpuAdam on the test's own arrays, statistics summed in parameter order.
  // Returns the unscaled norm.
  double reference_step(int64_t step, double loss_scale, double max_norm) {
    strata::optim::GradStats total;
    for (const RefParam& p : params_) {
      const strata::optim::GradSlice s{p.grad_bytes.data(), internal(setup_.grad_dtype), p.n};
      auto stats = adam_->grad_stats({&s, 1});
      EXPECT_TRUE(stats.is_ok());
      total.found_nonfinite |= stats->found_nonfinite;
      total.sum_squares += stats->sum_squares;
    }
    strata::optim::AdamWParams a;
    a.lr = group_.lr;
    a.beta1 = group_.beta1;
    a.beta2 = group_.beta2;
    a.eps = group_.eps;
    a.weight_decay = group_.weight_decay;
    a.decoupled = group_.decoupled_weight_decay != 0;
    a.step = step;
    a.grad_scale = strata::optim::unscale_and_clip(total, loss_scale, max_norm);
    for (RefParam& p : params_) {
      strata::optim::AdamWSlice s;
      s.param = p.master.data();
      s.m = p.m.data();
      s.v = p.v.data();
      s.grad = p.grad_bytes.data();
      s.grad_dtype = internal(setup_.grad_dtype);
      s.n = p.n;
      EXPECT_TRUE(adam_->step(a, {&s, 1}).is_ok());
    }
    return std::sqrt(total.sum_squares) / loss_scale;
  }

  std::vector<float> read_state(const RefParam& p, strata_optimizer_state state) {
    std::vector<float> out(p.n);
    EXPECT_EQ(strata_optimizer_read_state(rt_, p.param, state, out.data(), p.n * 4), STRATA_OK)
        << strata_last_error(rt_);
    return out;
  }

  // Strata's states and parameter tensors equal the reference, bit for bit.
  void expect_matches_reference(const std::string& when) {
    for (const RefParam& p : params_) {
      const auto master = read_state(p, STRATA_OPTIMIZER_MASTER);
      const auto m = read_state(p, STRATA_OPTIMIZER_EXP_AVG);
      const auto v = read_state(p, STRATA_OPTIMIZER_EXP_AVG_SQ);
      ASSERT_EQ(std::memcmp(master.data(), p.master.data(), p.n * 4), 0) << when << " " << p.name;
      ASSERT_EQ(std::memcmp(m.data(), p.m.data(), p.n * 4), 0) << when << " " << p.name;
      ASSERT_EQ(std::memcmp(v.data(), p.v.data(), p.n * 4), 0) << when << " " << p.name;
      std::vector<unsigned char> weights(p.n * dsize(setup_.param_dtype));
      ASSERT_EQ(strata_tensor_read(rt_, p.param, weights.data(), 0, weights.size()), STRATA_OK)
          << strata_last_error(rt_);
      const auto expected = encode(p.master, setup_.param_dtype);
      ASSERT_EQ(weights, expected) << when << " " << p.name << " weights";
    }
  }

  struct Snapshot {
    std::vector<std::vector<float>> states;
    int64_t step = 0;
  };
  Snapshot snapshot() {
    Snapshot s;
    for (const RefParam& p : params_) {
      for (auto k :
           {STRATA_OPTIMIZER_MASTER, STRATA_OPTIMIZER_EXP_AVG, STRATA_OPTIMIZER_EXP_AVG_SQ}) {
        s.states.push_back(read_state(p, k));
      }
    }
    EXPECT_EQ(strata_optimizer_get_step(rt_, &s.step), STRATA_OK);
    return s;
  }
  void expect_snapshot(const Snapshot& want, const std::string& when) {
    const Snapshot got = snapshot();
    EXPECT_EQ(got.step, want.step) << when;
    ASSERT_EQ(got.states.size(), want.states.size());
    for (size_t i = 0; i < got.states.size(); ++i) {
      ASSERT_EQ(std::memcmp(got.states[i].data(), want.states[i].data(), got.states[i].size() * 4),
                0)
          << when << ": state " << i;
    }
  }

  std::string dir_;
  ModelSetup setup_;
  strata_runtime* rt_ = nullptr;
  strata_optimizer_group group_{};
  std::vector<RefParam> params_;
  std::unique_ptr<strata::optim::CpuAdam> adam_;
};

TEST_F(Optimizer, StepsOverStreamedSubGroupsEqualCpuAdamAppliedDirectly) {
  const strata_dtype params[] = {STRATA_DTYPE_F32, STRATA_DTYPE_BF16};
  const strata_dtype grads[] = {STRATA_DTYPE_F32, STRATA_DTYPE_BF16, STRATA_DTYPE_F16};
  for (strata_dtype pd : params) {
    for (strata_dtype gd : grads) {
      const std::string what =
          "param dtype " + std::to_string(pd) + ", grad dtype " + std::to_string(gd);
      ModelSetup setup;
      setup.param_dtype = pd;
      setup.grad_dtype = gd;
      create(setup);
      if (HasFatalFailure()) return;
      for (int step = 1; step <= 3; ++step) {
        const float loss_scale = gd == STRATA_DTYPE_F16 ? 1024.0f : 1.0f;
        write_gradients(step, loss_scale);
        strata_optimizer_result result{};
        result.struct_size = sizeof result;
        ASSERT_EQ(strata_optimizer_step(rt_, loss_scale, &result), STRATA_OK)
            << strata_last_error(rt_);
        const double norm = reference_step(step, loss_scale, 0);
        EXPECT_EQ(result.found_nonfinite, 0);
        EXPECT_EQ(result.step, step);
        EXPECT_DOUBLE_EQ(result.grad_norm, norm);
        expect_matches_reference(what + ", step " + std::to_string(step));
        if (HasFatalFailure()) return;
      }
      destroy();
    }
  }
}

// Gradients made on the device, streaming on: each parameter and its gradient are held on the
// device and pass through pinned pieces of a sub-group; the result is the same, bit for bit, and
// no pinned buffer of a parameter's or gradient's size ever exists.
TEST_F(Optimizer, DeviceGradientsUpdatedThroughPinnedPiecesEqualCpuAdamAppliedDirectly) {
  for (strata_dtype pd : {STRATA_DTYPE_F32, STRATA_DTYPE_BF16}) {
    for (strata_dtype gd : {STRATA_DTYPE_F32, STRATA_DTYPE_BF16}) {
      const std::string what =
          "param dtype " + std::to_string(pd) + ", grad dtype " + std::to_string(gd);
      ModelSetup setup;
      setup.param_dtype = pd;
      setup.grad_dtype = gd;
      setup.pinned_budget = 4ull << 20;  // streaming on: 1 MiB of staging (128 KiB chunks)
      setup.gradients_on_device = true;
      create(setup);
      if (HasFatalFailure()) return;
      for (int step = 1; step <= 3; ++step) {
        write_gradients(step, 1.0f);
        strata_optimizer_result result{};
        result.struct_size = sizeof result;
        ASSERT_EQ(strata_optimizer_step(rt_, 1.0, &result), STRATA_OK) << strata_last_error(rt_);
        const double norm = reference_step(step, 1.0, 0);
        EXPECT_DOUBLE_EQ(result.grad_norm, norm) << what;
        expect_matches_reference(what + ", step " + std::to_string(step));
        if (HasFatalFailure()) return;
      }
      strata_stats st{};
      st.struct_size = sizeof st;
      ASSERT_EQ(strata_get_stats(rt_, &st), STRATA_OK);
      // The gradients, made on the device, met pinned memory only as two pieces of a sub-group
      // (4096 elements), never whole (up to 50001 elements). (The parameters were written and
      // are read back through pinned memory by this test itself, so their peak says nothing.)
      const uint64_t piece = 4096 * 4;
      EXPECT_LE(st.pinned.kinds[STRATA_KIND_GRADIENT].peak_in_use_bytes, 2 * piece) << what;
      EXPECT_GT(st.pinned.kinds[STRATA_KIND_GRADIENT].peak_in_use_bytes, 0u) << what;
      destroy();
    }
  }
}

// Loading leaves the parameters in pinned memory (strata_tensor_write goes through it). Where
// each is held on the device for its update (its gradient made there, streaming on), it goes
// there too: the update leaves no parameter in pinned memory, where it would otherwise be the
// newest copy and stay, step after step, a whole parameter of the pinned budget.
TEST_F(Optimizer, AParameterLoadingLeftInPinnedMemoryIsUpdatedOnTheDeviceAndLeavesPinnedMemory) {
  ModelSetup setup;
  setup.pinned_budget = 4ull << 20;
  setup.gradients_on_device = true;
  create(setup);
  if (HasFatalFailure()) return;
  auto stats = [&] {
    strata_stats st{};
    st.struct_size = sizeof st;
    EXPECT_EQ(strata_get_stats(rt_, &st), STRATA_OK);
    return st;
  };
  uint64_t param_bytes = 0;
  for (const RefParam& p : params_) param_bytes += p.n * dsize(setup.param_dtype);
  ASSERT_GT(stats().pinned.kinds[STRATA_KIND_PARAMETER].in_use_bytes, 0u)
      << "loading should leave parameters in pinned memory";
  for (int step = 1; step <= 2; ++step) {
    write_gradients(step, 1.0f);
    strata_optimizer_result result{};
    result.struct_size = sizeof result;
    ASSERT_EQ(strata_optimizer_step(rt_, 1.0, &result), STRATA_OK) << strata_last_error(rt_);
    reference_step(step, 1.0, 0);
    const strata_stats st = stats();
    EXPECT_EQ(st.pinned.kinds[STRATA_KIND_PARAMETER].in_use_bytes, 0u) << "step " << step;
    // Every parameter on the device (its buffers rounded up to the allocation granule).
    EXPECT_GE(st.device.kinds[STRATA_KIND_PARAMETER].in_use_bytes, param_bytes) << "step " << step;
  }
  expect_matches_reference("after two steps");
}

// The overflow check reads a device gradient through its pieces too: an inf in the last
// sub-group of the last parameter is found, and the step skipped.
TEST_F(Optimizer, ANonFiniteDeviceGradientIsFoundThroughItsPieces) {
  ModelSetup setup;
  setup.grad_dtype = STRATA_DTYPE_F32;
  setup.pinned_budget = 4ull << 20;
  setup.gradients_on_device = true;
  create(setup);
  write_gradients(1, 1.0f);
  RefParam& last = params_.back();
  strata_acquired a{};
  a.struct_size = sizeof a;
  ASSERT_EQ(strata_acquire(rt_, last.grad, STRATA_TIER_DEVICE, 0, &a), STRATA_OK)
      << strata_last_error(rt_);
  static_cast<float*>(a.data)[last.n - 1] = std::numeric_limits<float>::infinity();
  ASSERT_EQ(strata_release(rt_, last.grad, STRATA_RELEASE_DIRTY, nullptr), STRATA_OK);
  const Snapshot before = snapshot();
  strata_optimizer_result result{};
  result.struct_size = sizeof result;
  ASSERT_EQ(strata_optimizer_step(rt_, 1.0, &result), STRATA_OK) << strata_last_error(rt_);
  EXPECT_EQ(result.found_nonfinite, 1);
  expect_snapshot(before, "after a skipped step");
}

// Backward computing on the CPU makes its gradients in pinned memory. When pinned pressure spills
// them to NVMe before the step, the optimizer reads them back into pinned memory, not onto the
// device through pieces: on a CPU run the device is host memory outside the pinned budget (the
// quick start's host peak grew by a gradient and a parameter of the largest layer when it did).
TEST_F(Optimizer, GradientsMadeInPinnedMemoryNeverGoToTheDeviceEvenAfterASpill) {
  ModelSetup setup;
  setup.pinned_budget = 4ull << 20;  // streaming on, as in the device-gradient tests
  setup.gradients_in_pinned = true;
  create(setup);
  if (HasFatalFailure()) return;
  for (int step = 1; step <= 2; ++step) {
    write_gradients(step, 1.0f);
    if (HasFatalFailure()) return;
    // Written back, then pushed out of pinned memory by an allocation of all of it but the
    // staging buffers (kind OTHER), which never leave.
    ASSERT_EQ(strata_sync(rt_), STRATA_OK) << strata_last_error(rt_);
    strata_stats st{};
    st.struct_size = sizeof st;
    ASSERT_EQ(strata_get_stats(rt_, &st), STRATA_OK);
    const uint64_t staging = st.pinned.kinds[STRATA_KIND_OTHER].in_use_bytes;
    strata_tensor filler = STRATA_TENSOR_NONE;
    ASSERT_EQ(strata_malloc(rt_, setup.pinned_budget - staging, STRATA_TIER_PINNED, 0, &filler),
              STRATA_OK)
        << strata_last_error(rt_);
    ASSERT_EQ(strata_get_stats(rt_, &st), STRATA_OK);
    ASSERT_EQ(st.pinned.kinds[STRATA_KIND_GRADIENT].in_use_bytes, 0u) << "not spilled";
    ASSERT_EQ(strata_free(rt_, filler), STRATA_OK) << strata_last_error(rt_);
    strata_optimizer_result result{};
    result.struct_size = sizeof result;
    ASSERT_EQ(strata_optimizer_step(rt_, 1.0, &result), STRATA_OK) << strata_last_error(rt_);
    EXPECT_DOUBLE_EQ(result.grad_norm, reference_step(step, 1.0, 0));
    expect_matches_reference("step " + std::to_string(step));
    if (HasFatalFailure()) return;
  }
  strata_stats st{};
  st.struct_size = sizeof st;
  ASSERT_EQ(strata_get_stats(rt_, &st), STRATA_OK);
  EXPECT_EQ(st.device.peak_in_use_bytes, 0u);
}

TEST_F(Optimizer, StatesReallyStreamFromNvme) {
  create(ModelSetup{});
  write_gradients(1, 1.0f);
  strata_stats before{};
  before.struct_size = sizeof before;
  ASSERT_EQ(strata_get_stats(rt_, &before), STRATA_OK);
  ASSERT_EQ(strata_optimizer_step(rt_, 1.0, nullptr), STRATA_OK) << strata_last_error(rt_);
  strata_stats after{};
  after.struct_size = sizeof after;
  ASSERT_EQ(strata_get_stats(rt_, &after), STRATA_OK);
  // 1.1 MB of states cannot stay in a 640 KiB budget: most of them come back from NVMe.
  EXPECT_GT(after.nvme_bytes_read - before.nvme_bytes_read, 600u * 1024);
  EXPECT_LE(after.pinned.peak_in_use_bytes, 640u * 1024);
}

// States streaming through a pinned pool that holds little more than the optimizer's read-ahead
// window are written through: every sub-group is written back once as soon as it is updated, so
// each step writes exactly the states' bytes, every step alike (sched::optimizer_writes_through).
// Left to the room search, which few sub-groups stayed dirty from one step to the next depended
// on thread timing, and identical steps wrote different byte counts (docs/planner.md).
TEST_F(Optimizer, StatesStreamingThroughALittlePoolAreWrittenOnceEveryStep) {
  create(ModelSetup{});  // 1.1 MB of states, a 640 KiB pool, 48 KiB sub-groups
  if (HasFatalFailure()) return;
  uint64_t state_bytes = 0;
  for (const RefParam& p : params_) state_bytes += p.n * 4;
  const int kinds[] = {STRATA_KIND_MASTER_WEIGHT, STRATA_KIND_ADAM_M, STRATA_KIND_ADAM_V};
  for (int step = 1; step <= 4; ++step) {
    write_gradients(step, 1.0f);
    strata_stats before{};
    before.struct_size = sizeof before;
    ASSERT_EQ(strata_get_stats(rt_, &before), STRATA_OK);
    ASSERT_EQ(strata_optimizer_step(rt_, 1.0, nullptr), STRATA_OK) << strata_last_error(rt_);
    reference_step(step, 1.0, 0);
    strata_stats after{};
    after.struct_size = sizeof after;
    ASSERT_EQ(strata_get_stats(rt_, &after), STRATA_OK);
    for (int kind : kinds) {
      const uint64_t written =
          after.nvme_bytes_written_by_kind[kind] - before.nvme_bytes_written_by_kind[kind];
      // The first step also writes out what registering the parameters left dirty.
      if (step == 1) {
        EXPECT_GE(written, state_bytes) << "kind " << kind;
      } else {
        EXPECT_EQ(written, state_bytes) << "step " << step << ", kind " << kind;
      }
    }
  }
  expect_matches_reference("after four steps");
}

// A parameter resting in memory (home PINNED or DEVICE, as LoRA adapters beside a streamed
// base) keeps its states at home in pinned memory: steps equal the reference bit for bit and not
// one byte goes to or comes from NVMe, states included.
TEST_F(Optimizer, StatesOfParametersRestingInMemoryStayInPinnedMemoryOffNvme) {
  for (strata_tier home : {STRATA_TIER_PINNED, STRATA_TIER_DEVICE}) {
    ModelSetup setup;
    setup.home = home;
    setup.pinned_budget = 8ull << 20;  // the 1.1 MB of states and the 0.4 MB of tensors, whole
    setup.gradients_in_pinned = home == STRATA_TIER_PINNED;
    setup.gradients_on_device = home == STRATA_TIER_DEVICE;
    create(setup);
    if (HasFatalFailure()) return;
    strata_stats before{};
    before.struct_size = sizeof before;
    ASSERT_EQ(strata_get_stats(rt_, &before), STRATA_OK);
    for (int step = 1; step <= 3; ++step) {
      write_gradients(step, 1.0f);
      ASSERT_EQ(strata_optimizer_step(rt_, 1.0, nullptr), STRATA_OK) << strata_last_error(rt_);
      reference_step(step, 1.0, 0);
      ASSERT_EQ(strata_sync(rt_), STRATA_OK) << strata_last_error(rt_);
    }
    strata_stats after{};
    after.struct_size = sizeof after;
    ASSERT_EQ(strata_get_stats(rt_, &after), STRATA_OK);
    EXPECT_EQ(after.nvme_bytes_written, before.nvme_bytes_written) << "home " << home;
    EXPECT_EQ(after.nvme_bytes_read, before.nvme_bytes_read) << "home " << home;
    EXPECT_EQ(after.nvme_bytes_written, 0u) << "home " << home << ": nothing, ever";
    expect_matches_reference("home " + std::to_string(home));
    if (HasFatalFailure()) return;
    destroy();
  }
}

// Such states count whole against the pinned pool: a budget that cannot hold them is refused when
// the parameter is added, with the reason, instead of failing in a later step.
TEST_F(Optimizer, StatesAtHomeInPinnedMemoryThatCannotFitAreRefusedWhenAdded) {
  ModelSetup setup;
  setup.home = STRATA_TIER_PINNED;
  setup.sizes = {};
  create(setup);
  if (HasFatalFailure()) return;
  const size_t n = 100000;  // 1.2 MB of states: more than the 640 KiB budget
  strata_tensor p =
      register_tensor("big", n * 2, STRATA_DTYPE_BF16, STRATA_KIND_PARAMETER, STRATA_TIER_PINNED);
  strata_tensor g = register_tensor("big.grad", n * 2, STRATA_DTYPE_BF16, STRATA_KIND_GRADIENT,
                                    STRATA_TIER_PINNED);
  const auto bytes = encode(random_values(n, 7, 1.0f), STRATA_DTYPE_BF16);
  ASSERT_EQ(strata_tensor_write(rt_, p, bytes.data(), 0, bytes.size()), STRATA_OK);
  EXPECT_EQ(strata_optimizer_add_param(rt_, 0, p, g), STRATA_E_PINNED_BUDGET);
  EXPECT_NE(std::string(strata_last_error(rt_)).find("home is not NVMe"), std::string::npos)
      << strata_last_error(rt_);
}

TEST_F(Optimizer, ClippingEqualsTheReference) {
  ModelSetup setup;
  setup.max_grad_norm = 0.5;
  create(setup);
  for (int step = 1; step <= 2; ++step) {
    write_gradients(step, 128.0f);
    strata_optimizer_result result{};
    result.struct_size = sizeof result;
    ASSERT_EQ(strata_optimizer_step(rt_, 128.0, &result), STRATA_OK) << strata_last_error(rt_);
    const double norm = reference_step(step, 128.0, 0.5);
    EXPECT_GT(norm, 0.5) << "the test must actually clip";
    EXPECT_DOUBLE_EQ(result.grad_norm, norm);
    expect_matches_reference("clipped step " + std::to_string(step));
  }
}

TEST_F(Optimizer, OverflowSkipsTheStepAndKeepsTheCount) {
  create(ModelSetup{});
  write_gradients(1, 1.0f);
  ASSERT_EQ(strata_optimizer_step(rt_, 1.0, nullptr), STRATA_OK) << strata_last_error(rt_);
  reference_step(1, 1.0, 0);
  const Snapshot before = snapshot();
  write_gradients(2, 1.0f);
  // One infinity in the middle of the second parameter.
  RefParam& p = params_[1];
  const auto inf = encode({INFINITY}, setup_.grad_dtype);
  ASSERT_EQ(strata_tensor_write(rt_, p.grad, inf.data(), 777 * inf.size(), inf.size()), STRATA_OK);
  strata_optimizer_result result{};
  result.struct_size = sizeof result;
  ASSERT_EQ(strata_optimizer_step(rt_, 1.0, &result), STRATA_OK) << strata_last_error(rt_);
  EXPECT_EQ(result.found_nonfinite, 1);
  EXPECT_EQ(result.step, 1);
  expect_snapshot(before, "after a skipped step");
  expect_matches_reference("after a skipped step");
}

TEST_F(Optimizer, SetStepChangesTheBiasCorrection) {
  create(ModelSetup{});
  int64_t step = -1;
  ASSERT_EQ(strata_optimizer_get_step(rt_, &step), STRATA_OK);
  EXPECT_EQ(step, 0);
  ASSERT_EQ(strata_optimizer_set_step(rt_, 41), STRATA_OK);
  ASSERT_EQ(strata_optimizer_get_step(rt_, &step), STRATA_OK);
  EXPECT_EQ(step, 41);
  write_gradients(1, 1.0f);
  ASSERT_EQ(strata_optimizer_step(rt_, 1.0, nullptr), STRATA_OK) << strata_last_error(rt_);
  reference_step(42, 1.0, 0);
  ASSERT_EQ(strata_optimizer_get_step(rt_, &step), STRATA_OK);
  EXPECT_EQ(step, 42);
  expect_matches_reference("after set_step(41) and a step");
}

TEST_F(Optimizer, WrittenStatesAreReadBackAndUsedByTheNextStep) {
  create(ModelSetup{});
  for (size_t i = 0; i < params_.size(); ++i) {
    RefParam& p = params_[i];
    p.m = random_values(p.n, 500 + i, 0.01f);
    p.v = random_values(p.n, 600 + i, 0.001f);
    for (float& x : p.v) x = x * x;
    p.master = random_values(p.n, 700 + i, 1.0f);
    ASSERT_EQ(
        strata_optimizer_write_state(rt_, p.param, STRATA_OPTIMIZER_EXP_AVG, p.m.data(), p.n * 4),
        STRATA_OK);
    ASSERT_EQ(strata_optimizer_write_state(rt_, p.param, STRATA_OPTIMIZER_EXP_AVG_SQ, p.v.data(),
                                           p.n * 4),
              STRATA_OK);
    ASSERT_EQ(strata_optimizer_write_state(rt_, p.param, STRATA_OPTIMIZER_MASTER, p.master.data(),
                                           p.n * 4),
              STRATA_OK);
    EXPECT_EQ(read_state(p, STRATA_OPTIMIZER_EXP_AVG), p.m);
    EXPECT_EQ(read_state(p, STRATA_OPTIMIZER_EXP_AVG_SQ), p.v);
    EXPECT_EQ(read_state(p, STRATA_OPTIMIZER_MASTER), p.master);
  }
  write_gradients(1, 1.0f);
  ASSERT_EQ(strata_optimizer_step(rt_, 1.0, nullptr), STRATA_OK) << strata_last_error(rt_);
  reference_step(1, 1.0, 0);
  expect_matches_reference("step after write_state");
}

TEST_F(Optimizer, OverlapWithBackwardUpdatesOnGradReadyAndEqualsTheReference) {
  ModelSetup setup;
  setup.check_overflow = 0;
  setup.overlap_backward = 1;
  create(setup);
  for (int step = 1; step <= 2; ++step) {
    write_gradients(step, 1.0f);
    // Backward finishes the last layer first.
    for (size_t i = params_.size(); i-- > 0;) {
      ASSERT_EQ(strata_optimizer_grad_ready(rt_, params_[i].param), STRATA_OK)
          << strata_last_error(rt_);
    }
    EXPECT_EQ(strata_optimizer_grad_ready(rt_, params_[0].param), STRATA_E_STATE);
    ASSERT_EQ(strata_optimizer_step(rt_, 1.0, nullptr), STRATA_OK) << strata_last_error(rt_);
    reference_step(step, 1.0, 0);
    expect_matches_reference("overlapped step " + std::to_string(step));
  }
  // Consumed gradients are discarded: reading one is refused, not stale bytes.
  std::vector<unsigned char> buffer(16);
  EXPECT_EQ(strata_tensor_read(rt_, params_[0].grad, buffer.data(), 0, buffer.size()),
            STRATA_E_STATE);
}

TEST_F(Optimizer, GradReadyBeforeStepGivesTheSameResult) {
  ModelSetup setup;
  setup.max_grad_norm = 0.5;
  create(setup);
  write_gradients(1, 4.0f);
  ASSERT_EQ(strata_optimizer_grad_ready(rt_, params_[2].param), STRATA_OK)
      << strata_last_error(rt_);
  ASSERT_EQ(strata_optimizer_grad_ready(rt_, params_[0].param), STRATA_OK)
      << strata_last_error(rt_);
  ASSERT_EQ(strata_optimizer_step(rt_, 4.0, nullptr), STRATA_OK) << strata_last_error(rt_);
  reference_step(1, 4.0, 0.5);
  expect_matches_reference("step after grad_ready");
}

TEST_F(Optimizer, StepDiscardsGradientsAndRefusesAStepWithoutNewOnes) {
  create(ModelSetup{});
  write_gradients(1, 1.0f);
  ASSERT_EQ(strata_optimizer_step(rt_, 1.0, nullptr), STRATA_OK) << strata_last_error(rt_);
  std::vector<unsigned char> buffer(16);
  EXPECT_EQ(strata_tensor_read(rt_, params_[1].grad, buffer.data(), 0, buffer.size()),
            STRATA_E_STATE);
  const Snapshot before = snapshot();
  EXPECT_EQ(strata_optimizer_step(rt_, 1.0, nullptr), STRATA_E_STATE);
  EXPECT_NE(std::string(strata_last_error(rt_)).find("no contents"), std::string::npos)
      << strata_last_error(rt_);
  expect_snapshot(before, "after a refused step");
}

// ---- Checkpoints ----

TEST_F(Optimizer, ExportThenImportRestoresExactStatesGroupsAndStep) {
  create(ModelSetup{});
  for (int step = 1; step <= 2; ++step) {
    write_gradients(step, 1.0f);
    ASSERT_EQ(strata_optimizer_step(rt_, 1.0, nullptr), STRATA_OK) << strata_last_error(rt_);
  }
  const Snapshot saved = snapshot();
  const std::string path = dir_ + "/optim.ckpt";
  ASSERT_EQ(strata_optimizer_export(rt_, path.c_str()), STRATA_OK) << strata_last_error(rt_);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // Change everything, then import.
  write_gradients(3, 1.0f);
  ASSERT_EQ(strata_optimizer_step(rt_, 1.0, nullptr), STRATA_OK) << strata_last_error(rt_);
  strata_optimizer_group g = group_;
  g.lr = 0.5;
  ASSERT_EQ(strata_optimizer_set_group(rt_, 0, &g), STRATA_OK);
  ASSERT_EQ(strata_optimizer_import(rt_, path.c_str()), STRATA_OK) << strata_last_error(rt_);
  expect_snapshot(saved, "after import");
  strata_optimizer_group restored{};
  restored.struct_size = sizeof restored;
  ASSERT_EQ(strata_optimizer_get_group(rt_, 0, &restored), STRATA_OK);
  EXPECT_EQ(restored.lr, group_.lr);
  // A second runtime with the same parameters (fresh states) imports the same file.
  destroy();
  create(ModelSetup{});
  ASSERT_EQ(strata_optimizer_import(rt_, path.c_str()), STRATA_OK) << strata_last_error(rt_);
  expect_snapshot(saved, "import into a new runtime");
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}
void write_file(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST_F(Optimizer, AFlippedByteIsCorruptAndChangesNothing) {
  create(ModelSetup{});
  write_gradients(1, 1.0f);
  ASSERT_EQ(strata_optimizer_step(rt_, 1.0, nullptr), STRATA_OK) << strata_last_error(rt_);
  const std::string path = dir_ + "/optim.ckpt";
  ASSERT_EQ(strata_optimizer_export(rt_, path.c_str()), STRATA_OK) << strata_last_error(rt_);
  const auto good = read_file(path);
  ASSERT_GT(good.size(), 1000000u);
  // Different states in memory than in the file, so "unchanged" means something.
  write_gradients(2, 1.0f);
  ASSERT_EQ(strata_optimizer_step(rt_, 1.0, nullptr), STRATA_OK) << strata_last_error(rt_);
  const Snapshot before = snapshot();
  // Header fields (step, record count), a parameter name, data of the first and last records,
  // a record checksum and the trailer; then a sample of random positions.
  std::vector<size_t> positions = {8,
                                   12,
                                   20,
                                   24,
                                   33,
                                   120,
                                   140,
                                   5000,
                                   good.size() / 2,
                                   good.size() - 40,
                                   good.size() - 30,
                                   good.size() - 1};
  std::mt19937_64 rng(7);
  for (int i = 0; i < 12; ++i) positions.push_back(8 + rng() % (good.size() - 8));
  for (size_t at : positions) {
    auto bad = good;
    bad[at] ^= 0x10;
    write_file(path, bad);
    EXPECT_EQ(strata_optimizer_import(rt_, path.c_str()), STRATA_E_CORRUPT)
        << "byte " << at << ": " << strata_last_error(rt_);
  }
  expect_snapshot(before, "after corrupt imports");
  // And the good file still imports.
  write_file(path, good);
  EXPECT_EQ(strata_optimizer_import(rt_, path.c_str()), STRATA_OK) << strata_last_error(rt_);
}

TEST_F(Optimizer, ATruncatedOrExtendedFileIsRefused) {
  create(ModelSetup{});
  const std::string path = dir_ + "/optim.ckpt";
  ASSERT_EQ(strata_optimizer_export(rt_, path.c_str()), STRATA_OK) << strata_last_error(rt_);
  const auto good = read_file(path);
  const Snapshot before = snapshot();
  for (size_t size : {size_t{0}, size_t{10}, size_t{63}, size_t{64}, size_t{200}, good.size() / 3,
                      good.size() - 24, good.size() - 1}) {
    write_file(path, std::vector<char>(good.begin(), good.begin() + static_cast<long>(size)));
    const int rc = strata_optimizer_import(rt_, path.c_str());
    EXPECT_EQ(rc, STRATA_E_CORRUPT) << "size " << size << ": " << strata_last_error(rt_);
  }
  auto longer = good;
  longer.push_back(0);
  write_file(path, longer);
  EXPECT_EQ(strata_optimizer_import(rt_, path.c_str()), STRATA_E_CORRUPT);
  expect_snapshot(before, "after refused imports");
}

TEST_F(Optimizer, MismatchedCheckpointsAreInvalid) {
  create(ModelSetup{});
  const std::string path = dir_ + "/optim.ckpt";
  ASSERT_EQ(strata_optimizer_export(rt_, path.c_str()), STRATA_OK) << strata_last_error(rt_);
  const auto good = read_file(path);
  // Another version, with a valid header checksum: refused as INVALID, not CORRUPT.
  {
    auto other = good;
    const uint32_t version = 2;
    std::memcpy(&other[8], &version, 4);
    uint32_t header_bytes;
    std::memcpy(&header_bytes, &other[12], 4);
    const uint64_t sum = XXH3_64bits(other.data(), header_bytes - 8);
    std::memcpy(&other[header_bytes - 8], &sum, 8);
    write_file(path, other);
    EXPECT_EQ(strata_optimizer_import(rt_, path.c_str()), STRATA_E_INVALID)
        << strata_last_error(rt_);
    EXPECT_NE(std::string(strata_last_error(rt_)).find("version"), std::string::npos);
  }
  // Not a checkpoint at all.
  write_file(path, std::vector<char>(4096, 'x'));
  EXPECT_EQ(strata_optimizer_import(rt_, path.c_str()), STRATA_E_INVALID);
  // A model with other sizes, then one with an extra parameter.
  write_file(path, good);
  destroy();
  ModelSetup other;
  other.sizes = {30000, 50002, 12345};
  create(other);
  EXPECT_EQ(strata_optimizer_import(rt_, path.c_str()), STRATA_E_INVALID) << strata_last_error(rt_);
  destroy();
  other.sizes = {30000, 50001, 12345, 7};
  create(other);
  EXPECT_EQ(strata_optimizer_import(rt_, path.c_str()), STRATA_E_INVALID) << strata_last_error(rt_);
}

// The child: exports states that are a pure function of k, for k = 1, 2, ..., until killed.
[[noreturn]] void export_forever(const std::string& dir, const std::string& path, int ready_fd) {
  strata_config c;
  strata_config_init(&c);
  c.nvme_path = dir.c_str();
  c.nvme_capacity_bytes = 64ull << 20;
  c.pinned_budget_bytes = 4ull << 20;
  c.device_budget_bytes = 1ull << 20;
  c.device_backend = STRATA_DEVICE_EMULATED;
  c.optimizer_threads = 1;
  strata_runtime* rt = nullptr;
  if (strata_runtime_create(&c, &rt) != STRATA_OK) _exit(2);
  strata_optimizer_group g;
  strata_optimizer_group_init(&g);
  uint32_t index = 0;
  if (strata_optimizer_add_group(rt, &g, &index) != STRATA_OK) _exit(3);
  const size_t n = 200000;
  strata_tensor params[2];
  for (int i = 0; i < 2; ++i) {
    const std::string name = "p" + std::to_string(i);
    strata_tensor_desc d{sizeof d, name.c_str(),    n * 4, STRATA_DTYPE_F32, STRATA_KIND_PARAMETER,
                         0,        STRATA_TIER_NVME};
    strata_tensor grad = STRATA_TENSOR_NONE;
    if (strata_tensor_register(rt, &d, &params[i]) != STRATA_OK) _exit(4);
    const std::string gname = name + ".grad";
    d.name = gname.c_str();
    d.kind = STRATA_KIND_GRADIENT;
    if (strata_tensor_register(rt, &d, &grad) != STRATA_OK) _exit(4);
    std::vector<float> zeros(n, 0.0f);
    if (strata_tensor_write(rt, params[i], zeros.data(), 0, n * 4) != STRATA_OK) _exit(5);
    if (strata_optimizer_add_param(rt, 0, params[i], grad) != STRATA_OK) _exit(6);
  }
  std::vector<float> values(n);
  for (int64_t k = 1;; ++k) {
    for (int i = 0; i < 2; ++i) {
      for (int s = 0; s < 3; ++s) {
        for (size_t e = 0; e < n; ++e) values[e] = static_cast<float>(k * 1000 + i * 100 + s) + e;
        if (strata_optimizer_write_state(rt, params[i], static_cast<strata_optimizer_state>(s),
                                         values.data(), n * 4) != STRATA_OK) {
          _exit(7);
        }
      }
    }
    if (strata_optimizer_set_step(rt, k) != STRATA_OK) _exit(8);
    if (strata_optimizer_export(rt, path.c_str()) != STRATA_OK) _exit(9);
    if (k == 1) {
      const char byte = 1;
      if (write(ready_fd, &byte, 1) != 1) _exit(10);
    }
  }
}

TEST_F(Optimizer, AnInterruptedExportNeverReplacesAGoodCheckpoint) {
  const std::string path = dir_ + "/optim.ckpt";
  std::mt19937_64 rng(getpid());
  int64_t last_step = 0;
  for (int round = 0; round < 6; ++round) {
    const std::string child_dir = dir_ + "/child" + std::to_string(round);
    fs::create_directories(child_dir);
    int ready[2];
    ASSERT_EQ(pipe(ready), 0);
    // No runtime (hence no thread) exists in this process while it forks.
    ASSERT_EQ(rt_, nullptr);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(ready[0]);
      export_forever(child_dir, path, ready[1]);
    }
    close(ready[1]);
    char byte = 0;
    ASSERT_EQ(read(ready[0], &byte, 1), 1) << "the child died before its first export";
    close(ready[0]);
    usleep(static_cast<useconds_t>(rng() % 60000));
    ASSERT_EQ(kill(child, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the child exited with " << WEXITSTATUS(status);

    // The file at path is always one complete export, of some k >= the last one seen.
    strata_config c;
    strata_config_init(&c);
    c.nvme_path = dir_.c_str();
    c.nvme_capacity_bytes = 64ull << 20;
    c.pinned_budget_bytes = 4ull << 20;
    c.device_budget_bytes = 1ull << 20;
    c.device_backend = STRATA_DEVICE_EMULATED;
    c.optimizer_threads = 1;
    ASSERT_EQ(strata_runtime_create(&c, &rt_), STRATA_OK);
    strata_optimizer_group g;
    strata_optimizer_group_init(&g);
    uint32_t index = 0;
    ASSERT_EQ(strata_optimizer_add_group(rt_, &g, &index), STRATA_OK);
    const size_t n = 200000;
    strata_tensor params[2];
    for (int i = 0; i < 2; ++i) {
      const std::string name = "p" + std::to_string(i);
      params[i] = register_tensor(name, n * 4, STRATA_DTYPE_F32, STRATA_KIND_PARAMETER);
      const strata_tensor grad =
          register_tensor(name + ".grad", n * 4, STRATA_DTYPE_F32, STRATA_KIND_GRADIENT);
      std::vector<float> zeros(n, 0.0f);
      ASSERT_EQ(strata_tensor_write(rt_, params[i], zeros.data(), 0, n * 4), STRATA_OK);
      ASSERT_EQ(strata_optimizer_add_param(rt_, 0, params[i], grad), STRATA_OK);
    }
    ASSERT_EQ(strata_optimizer_import(rt_, path.c_str()), STRATA_OK)
        << "round " << round << ": " << strata_last_error(rt_);
    int64_t k = 0;
    ASSERT_EQ(strata_optimizer_get_step(rt_, &k), STRATA_OK);
    ASSERT_GE(k, 1);
    std::vector<float> got(n);
    for (int i = 0; i < 2; ++i) {
      for (int s = 0; s < 3; ++s) {
        ASSERT_EQ(strata_optimizer_read_state(
                      rt_, params[i], static_cast<strata_optimizer_state>(s), got.data(), n * 4),
                  STRATA_OK);
        for (size_t e = 0; e < n; e += 997) {
          ASSERT_EQ(got[e], static_cast<float>(k * 1000 + i * 100 + s) + e)
              << "round " << round << " k " << k << " param " << i << " state " << s;
        }
      }
    }
    last_step = k;
    // The killed exporter's temporary (there is one whenever the kill came mid-export) was
    // removed by the import: its writer is gone.
    for (const auto& entry : fs::directory_iterator(dir_)) {
      EXPECT_EQ(entry.path().filename().string().rfind(".optim.ckpt.tmp.", 0), std::string::npos)
          << "round " << round << " left " << entry.path();
    }
    destroy();
    fs::remove_all(child_dir);
  }
  EXPECT_GE(last_step, 1);
}

TEST_F(Optimizer, AnExportRemovesStaleTemporariesButNeverOneStillBeingWritten) {
  create(ModelSetup{});
  const std::string path = dir_ + "/optim.ckpt";
  // A writer that is gone: a child that exited and was reaped, so its pid names no process.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  const strata::OwnerStamp self = strata::this_process_stamp();
  strata::OwnerStamp gone = self;
  gone.pid = child;
  strata::OwnerStamp reused = self;  // this pid, but another process (another start time)
  reused.start_ticks += 1;
  strata::OwnerStamp earlier_boot = self;
  earlier_boot.boot = self.boot == "00000000" ? "11111111" : "00000000";
  const std::string prefix = dir_ + "/.optim.ckpt.tmp.";
  const std::string stale = prefix + strata::format_stamp(gone) + ".0";
  const std::string live = prefix + strata::format_stamp(self) + ".7";
  const std::string reused_pid = prefix + strata::format_stamp(reused) + ".8";
  const std::string rebooted = prefix + strata::format_stamp(earlier_boot) + ".9";
  const std::string foreign = prefix + std::to_string(child) + ".3";  // not a stamp: not ours
  const std::string unrelated = dir_ + "/.other.ckpt.tmp." + strata::format_stamp(gone) + ".0";
  for (const std::string& f : {stale, live, reused_pid, rebooted, foreign, unrelated}) {
    std::ofstream(f) << "partial";
  }
  // A writer in another pid namespace is seen by its lock alone.
  const std::string locked = prefix + strata::format_stamp(gone) + ".5";
  std::ofstream(locked) << "partial";
  const int held = open(locked.c_str(), O_RDONLY);
  ASSERT_GE(held, 0);
  ASSERT_EQ(flock(held, LOCK_EX), 0);
  ASSERT_EQ(strata_optimizer_export(rt_, path.c_str()), STRATA_OK) << strata_last_error(rt_);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_FALSE(fs::exists(reused_pid)) << "a pid reused by another process is not the writer";
  EXPECT_FALSE(fs::exists(rebooted)) << "a writer of an earlier boot is gone";
  EXPECT_TRUE(fs::exists(foreign)) << "a name without a stamp is never touched";
  EXPECT_TRUE(fs::exists(unrelated)) << "another checkpoint's temporaries are not ours";
  EXPECT_TRUE(fs::exists(locked)) << "a temporary whose lock is held is in use";
  close(held);
  EXPECT_TRUE(fs::exists(path));
}

// ---- Refused calls ----

TEST_F(Optimizer, InvalidCallsReturnTheirCodesWithAMessage) {
  create(ModelSetup{});
  const RefParam& p = params_[0];
  const strata_tensor other_param =
      register_tensor("other", 4096 * 2, STRATA_DTYPE_BF16, STRATA_KIND_PARAMETER);
  const strata_tensor other_grad =
      register_tensor("other.grad", 4096 * 2, STRATA_DTYPE_BF16, STRATA_KIND_GRADIENT);
  const strata_tensor int8 = register_tensor("int8", 4096, STRATA_DTYPE_I8, STRATA_KIND_PARAMETER);
  const strata_tensor small_grad =
      register_tensor("small.grad", 100, STRATA_DTYPE_BF16, STRATA_KIND_GRADIENT);
  std::vector<float> buffer(p.n + 1);
  strata_optimizer_group bad_group;
  strata_optimizer_group_init(&bad_group);
  bad_group.beta1 = 1.0;
  strata_optimizer_group zero_size;
  strata_optimizer_group_init(&zero_size);
  zero_size.struct_size = 0;
  strata_optimizer_options overlap_and_check;
  strata_optimizer_options_init(&overlap_and_check);
  overlap_and_check.overlap_backward = 1;
  strata_optimizer_options sub_group_change;
  strata_optimizer_options_init(&sub_group_change);
  sub_group_change.sub_group_bytes = 8192;
  strata_optimizer_group out{};
  out.struct_size = sizeof out;
  uint32_t index = 0;
  int64_t step = 0;
  strata_runtime* rt = rt_;
  const strata_tensor unknown = (uint64_t{77} << 32) | 5;

  struct Case {
    const char* what;
    int expected;
    int rc;
  };
  const Case cases[] = {
      {"group_init NULL", STRATA_E_INVALID, strata_optimizer_group_init(nullptr)},
      {"options_init NULL", STRATA_E_INVALID, strata_optimizer_options_init(nullptr)},
      {"step on NULL runtime", STRATA_E_INVALID, strata_optimizer_step(nullptr, 1.0, nullptr)},
      {"add_group NULL group", STRATA_E_INVALID, strata_optimizer_add_group(rt, nullptr, &index)},
      {"add_group NULL index", STRATA_E_INVALID, strata_optimizer_add_group(rt, &group_, nullptr)},
      {"add_group beta1 1", STRATA_E_INVALID, strata_optimizer_add_group(rt, &bad_group, &index)},
      {"add_group struct_size 0", STRATA_E_INVALID,
       strata_optimizer_add_group(rt, &zero_size, &index)},
      {"set_group unknown index", STRATA_E_INVALID, strata_optimizer_set_group(rt, 9, &group_)},
      {"get_group unknown index", STRATA_E_INVALID, strata_optimizer_get_group(rt, 9, &out)},
      {"get_group NULL", STRATA_E_INVALID, strata_optimizer_get_group(rt, 0, nullptr)},
      {"add_param unknown group", STRATA_E_INVALID,
       strata_optimizer_add_param(rt, 9, other_param, other_grad)},
      {"add_param unknown handle", STRATA_E_BAD_HANDLE,
       strata_optimizer_add_param(rt, 0, unknown, other_grad)},
      {"add_param twice", STRATA_E_STATE, strata_optimizer_add_param(rt, 0, p.param, p.grad)},
      {"add_param grad as param", STRATA_E_INVALID,
       strata_optimizer_add_param(rt, 0, other_grad, other_param)},
      {"add_param int8", STRATA_E_INVALID, strata_optimizer_add_param(rt, 0, int8, other_grad)},
      {"add_param size mismatch", STRATA_E_INVALID,
       strata_optimizer_add_param(rt, 0, other_param, small_grad)},
      {"add_param no contents", STRATA_E_STATE,
       strata_optimizer_add_param(rt, 0, other_param, other_grad)},
      {"add_param grad of another", STRATA_E_INVALID,
       strata_optimizer_add_param(rt, 0, other_param, p.grad)},
      {"configure overlap with check", STRATA_E_INVALID,
       strata_optimizer_configure(rt, &overlap_and_check)},
      {"configure sub-groups late", STRATA_E_STATE,
       strata_optimizer_configure(rt, &sub_group_change)},
      {"configure NULL", STRATA_E_INVALID, strata_optimizer_configure(rt, nullptr)},
      {"grad_ready not under optimizer", STRATA_E_STATE,
       strata_optimizer_grad_ready(rt, other_param)},
      {"grad_ready unknown handle", STRATA_E_BAD_HANDLE, strata_optimizer_grad_ready(rt, unknown)},
      {"grad_ready gradient unwritten", STRATA_E_STATE, strata_optimizer_grad_ready(rt, p.param)},
      {"step loss_scale 0", STRATA_E_INVALID, strata_optimizer_step(rt, 0.0, nullptr)},
      {"step loss_scale nan", STRATA_E_INVALID, strata_optimizer_step(rt, NAN, nullptr)},
      {"step without gradients", STRATA_E_STATE, strata_optimizer_step(rt, 1.0, nullptr)},
      {"get_step NULL", STRATA_E_INVALID, strata_optimizer_get_step(rt, nullptr)},
      {"set_step negative", STRATA_E_INVALID, strata_optimizer_set_step(rt, -1)},
      {"read_state wrong size", STRATA_E_INVALID,
       strata_optimizer_read_state(rt, p.param, STRATA_OPTIMIZER_MASTER, buffer.data(),
                                   (p.n + 1) * 4)},
      {"read_state unknown state", STRATA_E_INVALID,
       strata_optimizer_read_state(rt, p.param, static_cast<strata_optimizer_state>(7),
                                   buffer.data(), p.n * 4)},
      {"read_state NULL", STRATA_E_INVALID,
       strata_optimizer_read_state(rt, p.param, STRATA_OPTIMIZER_MASTER, nullptr, p.n * 4)},
      {"read_state not under optimizer", STRATA_E_STATE,
       strata_optimizer_read_state(rt, other_param, STRATA_OPTIMIZER_MASTER, buffer.data(),
                                   4096 * 4)},
      {"write_state unknown handle", STRATA_E_BAD_HANDLE,
       strata_optimizer_write_state(rt, unknown, STRATA_OPTIMIZER_MASTER, buffer.data(), p.n * 4)},
      {"export NULL path", STRATA_E_INVALID, strata_optimizer_export(rt, nullptr)},
      {"export into a missing directory", STRATA_E_INVALID,
       strata_optimizer_export(rt, (dir_ + "/no/such/dir/x").c_str())},
      {"import missing file", STRATA_E_INVALID,
       strata_optimizer_import(rt, (dir_ + "/missing").c_str())},
      {"import a directory", STRATA_E_INVALID, strata_optimizer_import(rt, dir_.c_str())},
      {"discard unknown handle", STRATA_E_BAD_HANDLE, strata_tensor_discard(rt, unknown)},
      {"discard NULL runtime", STRATA_E_INVALID, strata_tensor_discard(nullptr, p.grad)},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.rc, c.expected) << c.what;
  }
  // Each refusal left a message naming the call (checked on a few representative ones).
  EXPECT_EQ(strata_optimizer_add_param(rt, 0, other_param, small_grad), STRATA_E_INVALID);
  EXPECT_NE(std::string(strata_last_error(rt)).find("strata_optimizer_add_param"),
            std::string::npos);
  EXPECT_NE(std::string(strata_last_error(rt)).find("elements"), std::string::npos)
      << strata_last_error(rt);
  EXPECT_EQ(strata_optimizer_step(rt, -1.0, nullptr), STRATA_E_INVALID);
  EXPECT_NE(std::string(strata_last_error(rt)).find("loss_scale"), std::string::npos);
  // Nothing above changed the optimizer.
  ASSERT_EQ(strata_optimizer_get_step(rt, &step), STRATA_OK);
  EXPECT_EQ(step, 0);
}

TEST_F(Optimizer, APinnedBudgetTooSmallForAParameterIsRefusedUpFront) {
  create(ModelSetup{});
  // 640 KiB budget: a 100K-element fp32 parameter fits, but not with its gradient (800 KB).
  const strata_tensor big =
      register_tensor("big", 100000 * 4, STRATA_DTYPE_F32, STRATA_KIND_PARAMETER);
  const strata_tensor big_grad =
      register_tensor("big.grad", 100000 * 4, STRATA_DTYPE_F32, STRATA_KIND_GRADIENT);
  std::vector<float> zeros(100000, 0.0f);
  ASSERT_EQ(strata_tensor_write(rt_, big, zeros.data(), 0, zeros.size() * 4), STRATA_OK);
  EXPECT_EQ(strata_optimizer_add_param(rt_, 0, big, big_grad), STRATA_E_PINNED_BUDGET);
  EXPECT_NE(std::string(strata_last_error(rt_)).find("pinned"), std::string::npos);
}

// ---- strata_tensor_discard ----

TEST_F(Optimizer, DiscardedTensorsRefuseReadsUntilWrittenAgain) {
  create(ModelSetup{});
  const strata_tensor t = register_tensor("scratch", 8192, STRATA_DTYPE_U8, STRATA_KIND_OTHER);
  std::vector<unsigned char> data(8192, 0xAB), back(8192);
  ASSERT_EQ(strata_tensor_write(rt_, t, data.data(), 0, data.size()), STRATA_OK);
  ASSERT_EQ(strata_sync(rt_), STRATA_OK);
  ASSERT_EQ(strata_tensor_discard(rt_, t), STRATA_OK) << strata_last_error(rt_);
  EXPECT_EQ(strata_tensor_read(rt_, t, back.data(), 0, back.size()), STRATA_E_STATE);
  // Acquire with DISCARD works on a discarded tensor; its release makes it readable again.
  strata_acquired a{};
  a.struct_size = sizeof a;
  ASSERT_EQ(strata_acquire(rt_, t, STRATA_TIER_PINNED, STRATA_ACQUIRE_DISCARD, &a), STRATA_OK)
      << strata_last_error(rt_);
  EXPECT_EQ(strata_tensor_discard(rt_, t), STRATA_E_STATE) << "discard while acquired";
  std::memset(a.data, 0x5C, a.bytes);
  ASSERT_EQ(strata_release(rt_, t, STRATA_RELEASE_DIRTY, nullptr), STRATA_OK);
  ASSERT_EQ(strata_tensor_read(rt_, t, back.data(), 0, back.size()), STRATA_OK);
  EXPECT_EQ(back, std::vector<unsigned char>(8192, 0x5C));
  // Discarded again, then a write makes it readable.
  ASSERT_EQ(strata_tensor_discard(rt_, t), STRATA_OK);
  EXPECT_EQ(strata_tensor_read(rt_, t, back.data(), 0, back.size()), STRATA_E_STATE);
  ASSERT_EQ(strata_tensor_write(rt_, t, data.data(), 0, data.size()), STRATA_OK);
  ASSERT_EQ(strata_tensor_read(rt_, t, back.data(), 0, back.size()), STRATA_OK);
  EXPECT_EQ(back, data);
}

}  // namespace
