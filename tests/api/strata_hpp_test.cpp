// strata/strata.hpp, the C++ wrapper, as a C++ framework uses it. Built against the shared
// library alone with -Wall -Wextra -Werror: the header needs nothing but the public C ABI. Each
// wrapper call is checked against what the C API reports for the same handles.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <strata/strata.hpp>  // first: the header must stand on its own
#include <string>
#include <type_traits>
#include <vector>

namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kWeightBytes = 512 * 1024;  // a quarter of the pinned budget
constexpr size_t kWeightWords = kWeightBytes / 4;

// What the header promises about every owning type, checked where it cannot regress silently.
template <typename T>
constexpr bool kMoveOnlyAndQuietToDestroy =
    std::is_nothrow_destructible_v<T>&& std::is_nothrow_move_constructible_v<T>&&
        std::is_nothrow_move_assignable_v<T> &&
    !std::is_copy_constructible_v<T> && !std::is_copy_assignable_v<T>;
static_assert(kMoveOnlyAndQuietToDestroy<strata::Runtime>);
static_assert(kMoveOnlyAndQuietToDestroy<strata::Tensor>);
static_assert(kMoveOnlyAndQuietToDestroy<strata::Allocation>);
static_assert(kMoveOnlyAndQuietToDestroy<strata::Acquired>);
static_assert(std::is_nothrow_destructible_v<strata::StepScope> &&
              !std::is_move_constructible_v<strata::StepScope>);
static_assert(std::is_nothrow_destructible_v<strata::LayerScope> &&
              !std::is_move_constructible_v<strata::LayerScope>);
static_assert(std::is_base_of_v<std::runtime_error, strata::Error>);

// Runs body, which must throw strata::Error, and returns it.
template <typename Body>
strata::Error error_from(Body&& body) {
  try {
    body();
  } catch (const strata::Error& e) {
    return e;
  }
  ADD_FAILURE() << "no strata::Error was thrown";
  return strata::Error(STRATA_OK, "");
}

std::vector<uint32_t> pattern(size_t words, uint32_t seed) {
  std::vector<uint32_t> v(words);
  std::iota(v.begin(), v.end(), seed * 1000003u);
  return v;
}

class StrataHpp : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("STRATA_TEST_DIR");
    dir_ = fs::path(base != nullptr ? base : "/tmp") /
           ("hpp-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
            "-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Budgets far below the tensors the tests use: their data has to go through NVMe.
  strata::Config small_config(const std::string& subdir = "") const {
    const fs::path path = subdir.empty() ? dir_ : dir_ / subdir;
    fs::create_directories(path);
    return strata::Config()
        .nvme_path(path.string())
        .nvme_capacity_bytes(64 * kMiB)
        .pinned_budget_bytes(2 * kMiB)
        .device_budget_bytes(1 * kMiB)
        .device_backend(STRATA_DEVICE_EMULATED)
        .queue_depth(8)
        .optimizer_threads(2);
  }

  static strata::Tensor weight(strata::Runtime& rt, int32_t layer, uint64_t bytes = kWeightBytes) {
    return rt.register_tensor("layers." + std::to_string(layer) + ".weight", bytes,
                              STRATA_DTYPE_BF16, STRATA_KIND_PARAMETER, layer);
  }

  fs::path dir_;
};

TEST_F(StrataHpp, RuntimeRoundTripsATensorThroughNvme) {
  strata::Runtime rt(small_config());
  // 4 MiB of weights against 2 MiB pinned and 1 MiB device: some must come back from NVMe.
  constexpr int32_t kLayers = 8;
  std::vector<strata::Tensor> weights;
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    weights.push_back(weight(rt, layer));
    weights.back().write(pattern(kWeightWords, layer));
  }
  rt.sync();
  EXPECT_GE(rt.stats().nvme_bytes_written, kLayers * kWeightBytes);

  {
    auto step = rt.step();
    for (int32_t layer = 0; layer < kLayers; ++layer) {
      auto in_layer = rt.layer(STRATA_PHASE_FORWARD, layer);
      strata::Acquired resident = weights[layer].acquire(STRATA_TIER_DEVICE);
      ASSERT_EQ(resident.bytes(), kWeightBytes);
      const auto words = resident.span<const uint32_t>();
      const auto expected = pattern(kWeightWords, layer);
      ASSERT_TRUE(std::equal(words.begin(), words.end(), expected.begin())) << "layer " << layer;
    }
    step.end();
  }
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    std::vector<uint32_t> back(kWeightWords);
    weights[layer].read(back);
    EXPECT_EQ(back, pattern(kWeightWords, layer)) << "layer " << layer;
  }
  EXPECT_GE(rt.stats().nvme_bytes_read, kMiB);
}

TEST_F(StrataHpp, ErrorsBecomeExceptionsWithCodeAndMessage) {
  const strata::Error creation =
      error_from([&] { strata::Runtime refused(small_config().queue_depth(0)); });
  EXPECT_EQ(creation.code(), STRATA_E_INVALID);
  EXPECT_NE(std::string(creation.what()).find("strata_runtime_create"), std::string::npos)
      << creation.what();
  EXPECT_STREQ(creation.what(), strata_last_error(nullptr));

  strata::Runtime rt(small_config());
  strata::Tensor t = weight(rt, 0, 4096);
  t.write(std::vector<unsigned char>(4096, 7));

  std::vector<unsigned char> past_the_end(16);
  const strata::Error range = error_from([&] { t.read(past_the_end, 4090); });
  EXPECT_EQ(range.code(), STRATA_E_INVALID);
  EXPECT_NE(std::string(range.what()).find("strata_tensor_read"), std::string::npos)
      << range.what();
  EXPECT_EQ(range.what(), rt.last_error());

  strata::Acquired held = t.acquire(STRATA_TIER_PINNED);
  const strata::Error acquired = error_from([&] { t.write(std::vector<unsigned char>(16, 1)); });
  EXPECT_EQ(acquired.code(), STRATA_E_STATE);
  EXPECT_NE(std::string(acquired.what()).find("strata_tensor_write"), std::string::npos)
      << acquired.what();

  // Callers that catch std::exception see the same text.
  try {
    rt.export_trace((dir_ / "trace.json").string());  // tracing is off in this config
    ADD_FAILURE() << "export_trace with tracing off succeeded";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("strata_export_trace"), std::string::npos) << e.what();
  }
}

// The guard over strata_acquire_timeout, and Tensor::write / read and Runtime::sync with a
// bound: a wait the caller bounds ends in strata::Error with STRATA_E_TIMEOUT, nothing acquired
// or copied; the same calls succeed once the room is released.
TEST_F(StrataHpp, ACallWithATimeoutThrowsTimeoutAndDoesNothing) {
  strata::Runtime rt(small_config());
  const uint64_t bytes = 1536 * 1024;  // two do not fit the 2 MiB pinned pool together
  strata::Tensor held = weight(rt, 0, bytes);
  strata::Tensor wanted = weight(rt, 1, bytes);
  held.write(std::vector<unsigned char>(bytes, 1));
  wanted.write(std::vector<unsigned char>(bytes, 2));
  rt.sync();
  {
    strata::Acquired holding = held.acquire(STRATA_TIER_PINNED);
    const strata::Error timed_out = error_from([&] {
      strata::Acquired never = wanted.acquire(STRATA_TIER_PINNED, 0, std::chrono::milliseconds(50));
    });
    EXPECT_EQ(timed_out.code(), STRATA_E_TIMEOUT) << timed_out.what();
    EXPECT_EQ(error_from([&] {
                strata::Acquired never =
                    wanted.acquire(STRATA_TIER_PINNED, 0, std::chrono::milliseconds(-1));
              }).code(),
              STRATA_E_INVALID);
    // The copies wait for the same room: each gives up, nothing copied either way.
    std::vector<unsigned char> buffer(bytes, 3);
    EXPECT_EQ(error_from([&] {
                wanted.write(buffer.data(), 0, bytes, std::chrono::milliseconds(50));
              }).code(),
              STRATA_E_TIMEOUT);
    EXPECT_EQ(error_from([&] {
                wanted.read(buffer.data(), 0, bytes, std::chrono::milliseconds(50));
              }).code(),
              STRATA_E_TIMEOUT);
    EXPECT_EQ(buffer, std::vector<unsigned char>(bytes, 3));
    EXPECT_EQ(error_from([&] { rt.sync(std::chrono::milliseconds(-1)); }).code(), STRATA_E_INVALID);
  }
  rt.sync(std::chrono::seconds(30));
  std::vector<unsigned char> back(bytes);
  wanted.read(back.data(), 0, bytes, std::chrono::seconds(30));
  EXPECT_EQ(back, std::vector<unsigned char>(bytes, 2));
  strata::Acquired got = wanted.acquire(STRATA_TIER_PINNED, 0, std::chrono::seconds(30));
  ASSERT_TRUE(got);
  EXPECT_EQ(got.span<unsigned char>()[0], 2);
}

TEST_F(StrataHpp, AcquiredGuardReleasesDirtyDataOnScopeExit) {
  strata::Runtime rt(small_config());
  strata::Tensor t = weight(rt, 0);
  t.write(std::vector<uint32_t>(kWeightWords, 0));
  rt.sync();
  const uint64_t written_before = rt.stats().nvme_bytes_written;

  const auto modified = pattern(kWeightWords, 42);
  {
    strata::Acquired acquired = t.acquire(STRATA_TIER_PINNED);
    auto words = acquired.span<uint32_t>();
    std::copy(modified.begin(), modified.end(), words.begin());
    acquired.mark_dirty();
    EXPECT_TRUE(acquired.dirty());
  }
  rt.sync();
  EXPECT_GE(rt.stats().nvme_bytes_written - written_before, kWeightBytes)
      << "the dirty release was not written back";

  // More other tensors than both tiers hold, so that t (the least recently used) leaves memory
  // and the read below comes from NVMe.
  std::vector<strata::Tensor> others;
  for (int32_t layer = 1; layer <= 8; ++layer) {
    others.push_back(weight(rt, layer));
    others.back().write(pattern(kWeightWords, layer));
    strata::Acquired on_device = others.back().acquire(STRATA_TIER_DEVICE);
  }
  const uint64_t read_before = rt.stats().nvme_bytes_read;
  std::vector<uint32_t> back(kWeightWords);
  t.read(back);
  EXPECT_EQ(back, modified);
  EXPECT_GE(rt.stats().nvme_bytes_read - read_before, kWeightBytes);

  // A guard that was never marked dirty releases clean: nothing more is written back for t.
  rt.sync();
  const uint64_t written_before_clean = rt.stats().nvme_bytes_written;
  { strata::Acquired clean = t.acquire(STRATA_TIER_PINNED); }
  rt.sync();
  EXPECT_EQ(rt.stats().nvme_bytes_written, written_before_clean);
  t.write(modified);  // released: writing is allowed again
}

// The stream a release passes: the one the guard was used on, kept by mark_dirty() and by a move,
// replaced by mark_dirty(stream), NULL (CUDA's default stream) until told. Before, only
// mark_dirty could name a stream, so a clean release of a DEVICE tensor read on a non-blocking
// stream passed the default stream, and Strata could refill the buffer while that stream still
// read it. (Its effect on a GPU: DeviceStream.AStreamTheCppGuardWasUsedOnOrdersTheBuffersReuse.)
TEST_F(StrataHpp, AcquiredGuardPassesTheStreamItWasUsedOn) {
  strata::Runtime rt(small_config());
  strata::Tensor t = weight(rt, 0);
  t.write(pattern(kWeightWords, 3));
  // Any value stands for a cudaStream_t here: the emulated device ignores it.
  int stream_a = 0, stream_b = 0;
  {
    strata::Acquired guard = t.acquire(STRATA_TIER_DEVICE);
    EXPECT_EQ(guard.device_stream(), nullptr) << "CUDA's default stream until told";
    guard.used_on_stream(&stream_a);
    guard.mark_dirty();
    EXPECT_EQ(guard.device_stream(), &stream_a) << "mark_dirty() keeps the stream";
    EXPECT_TRUE(guard.dirty());
    strata::Acquired moved = std::move(guard);
    EXPECT_EQ(moved.device_stream(), &stream_a);
    EXPECT_EQ(guard.device_stream(), nullptr);  // a moved-from guard is empty
    moved.mark_dirty(&stream_b);
    EXPECT_EQ(moved.device_stream(), &stream_b);
    EXPECT_NO_THROW(moved.release());
    EXPECT_EQ(moved.device_stream(), nullptr);
  }
  {
    strata::Acquired clean = t.acquire(STRATA_TIER_DEVICE);
    clean.used_on_stream(&stream_a);
    EXPECT_FALSE(clean.dirty()) << "naming a stream does not make the release dirty";
  }
  std::vector<uint32_t> back(kWeightWords);
  t.read(back);
  EXPECT_EQ(back, pattern(kWeightWords, 3));
}

TEST_F(StrataHpp, MovedFromObjectsAreEmptyAndSafeToDestroy) {
  strata::Runtime owner;  // declared first so that it dies after the tensors
  EXPECT_FALSE(owner);
  strata::Runtime first(small_config());
  strata::Tensor t = weight(first, 0, 4096);
  t.write(std::vector<unsigned char>(4096, 3));
  // The tensor keeps the C handle, which moving the Runtime wrapper does not change.
  owner = std::move(first);
  EXPECT_FALSE(first);
  EXPECT_EQ(first.get(), nullptr);
  EXPECT_EQ(error_from([&] { first.sync(); }).code(), STRATA_E_BAD_HANDLE);
  std::vector<unsigned char> check(16);
  t.read(check);
  EXPECT_EQ(check, std::vector<unsigned char>(16, 3));

  const strata_tensor handle = t.handle();
  strata::Tensor moved(std::move(t));
  EXPECT_FALSE(t);
  EXPECT_EQ(t.handle(), STRATA_TENSOR_NONE);
  EXPECT_EQ(t.bytes(), 0u);
  EXPECT_EQ(moved.handle(), handle);
  EXPECT_EQ(error_from([&] { t.read(check); }).code(), STRATA_E_BAD_HANDLE);
  EXPECT_EQ(error_from([&] { strata::Acquired never = t.acquire(STRATA_TIER_PINNED); }).code(),
            STRATA_E_BAD_HANDLE);

  // Move-assigning over a live tensor unregisters the one it held.
  strata::Tensor replaced = weight(owner, 1, 4096);
  const strata_tensor replaced_handle = replaced.handle();
  replaced = std::move(moved);
  EXPECT_EQ(replaced.handle(), handle);
  EXPECT_EQ(strata_tensor_unregister(owner.get(), replaced_handle), STRATA_E_BAD_HANDLE);

  strata::Allocation allocation = owner.allocate(64 * 1024, STRATA_TIER_PINNED);
  strata::Allocation allocation_moved = std::move(allocation);
  EXPECT_FALSE(allocation);
  EXPECT_EQ(error_from([&] { allocation.free(); }).code(), STRATA_E_BAD_HANDLE);

  strata::Acquired guard = replaced.acquire(STRATA_TIER_PINNED);
  strata::Acquired guard_moved = std::move(guard);
  EXPECT_FALSE(guard);
  EXPECT_EQ(guard.data(), nullptr);
  EXPECT_EQ(guard.bytes(), 0u);
  EXPECT_TRUE(guard.span<float>().empty());
  EXPECT_EQ(error_from([&] { guard.release(); }).code(), STRATA_E_BAD_HANDLE);
  ASSERT_TRUE(guard_moved);
  EXPECT_EQ(guard_moved.bytes(), 4096u);
  // Still acquired exactly once: one release ends it, and writing works again.
  EXPECT_EQ(error_from([&] { replaced.write(check); }).code(), STRATA_E_STATE);
  guard_moved = strata::Acquired();  // assigning over a live guard releases it
  replaced.write(check);
  // Every moved-from object above is destroyed here, at the end of scope, without effect.
}

// A C-side twin of one parameter, registered in a runtime the test drives without the wrapper.
strata_tensor raw_tensor(strata_runtime* rt, const std::string& name, size_t floats,
                         strata_tensor_kind kind) {
  const strata_tensor_desc desc =
      strata::tensor_desc(name.c_str(), floats * 4, STRATA_DTYPE_F32, kind, 0);
  strata_tensor t = STRATA_TENSOR_NONE;
  EXPECT_EQ(strata_tensor_register(rt, &desc, &t), STRATA_OK) << strata_last_error(rt);
  return t;
}

std::vector<float> values(size_t n, uint32_t seed, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * static_cast<float>(i) + seed);
  return v;
}

// The same model, optimizer settings and gradients through the wrapper and through the bare C
// API: every result, weight and state must be bit for bit the same.
TEST_F(StrataHpp, OptimizerStepMatchesTheCApi) {
  strata::Runtime wrapped(small_config("wrapped"));
  const strata::Config raw_config = small_config("raw");
  strata_runtime* raw = nullptr;
  ASSERT_EQ(strata_runtime_create(&raw_config.c, &raw), STRATA_OK) << strata_last_error(nullptr);
  // The raw runtime is destroyed however the test ends; the wrapped one destroys itself.
  const std::unique_ptr<strata_runtime, int (*)(strata_runtime*)> raw_owner(
      raw, &strata_runtime_destroy);

  strata::Optimizer optimizer = wrapped.optimizer();
  strata_optimizer_options options = strata::Optimizer::default_options();
  options.sub_group_bytes = 16 * 1024;  // several sub-groups per parameter
  options.max_grad_norm = 0.5;
  optimizer.configure(options);
  ASSERT_EQ(strata_optimizer_configure(raw, &options), STRATA_OK) << strata_last_error(raw);
  strata_optimizer_group group = strata::Optimizer::default_group();
  group.lr = 1e-2;
  group.weight_decay = 0.05;
  EXPECT_EQ(optimizer.add_group(group), 0u);
  uint32_t raw_group = 99;
  ASSERT_EQ(strata_optimizer_add_group(raw, &group, &raw_group), STRATA_OK);
  EXPECT_EQ(optimizer.get_group(0).lr, group.lr);
  EXPECT_EQ(optimizer.get_group(0).weight_decay, group.weight_decay);

  struct Param {
    size_t n;
    strata::Tensor param, grad;
    strata_tensor raw_param, raw_grad;
  };
  std::vector<Param> params;
  for (size_t n : {5000u, 12345u}) {
    const std::string name = "layers." + std::to_string(params.size()) + ".weight";
    Param p{
        n, wrapped.register_tensor(name, n * 4, STRATA_DTYPE_F32, STRATA_KIND_PARAMETER, 0),
        wrapped.register_tensor(name + ".grad", n * 4, STRATA_DTYPE_F32, STRATA_KIND_GRADIENT, 0),
        raw_tensor(raw, name, n, STRATA_KIND_PARAMETER),
        raw_tensor(raw, name + ".grad", n, STRATA_KIND_GRADIENT)};
    const auto initial = values(n, static_cast<uint32_t>(params.size()), 1.0f);
    p.param.write(initial);
    ASSERT_EQ(strata_tensor_write(raw, p.raw_param, initial.data(), 0, n * 4), STRATA_OK);
    optimizer.add_param(0, p.param.handle(), p.grad.handle());
    ASSERT_EQ(strata_optimizer_add_param(raw, 0, p.raw_param, p.raw_grad), STRATA_OK)
        << strata_last_error(raw);
    params.push_back(std::move(p));
  }

  auto expect_same_states = [&](const std::string& when) {
    for (const Param& p : params) {
      for (strata_optimizer_state state :
           {STRATA_OPTIMIZER_MASTER, STRATA_OPTIMIZER_EXP_AVG, STRATA_OPTIMIZER_EXP_AVG_SQ}) {
        std::vector<float> mine(p.n), theirs(p.n);
        optimizer.read_state(p.param.handle(), state, mine);
        ASSERT_EQ(strata_optimizer_read_state(raw, p.raw_param, state, theirs.data(), p.n * 4),
                  STRATA_OK);
        ASSERT_EQ(std::memcmp(mine.data(), theirs.data(), p.n * 4), 0)
            << when << ", state " << state;
      }
      std::vector<float> mine(p.n), theirs(p.n);
      p.param.read(mine);
      ASSERT_EQ(strata_tensor_read(raw, p.raw_param, theirs.data(), 0, p.n * 4), STRATA_OK);
      ASSERT_EQ(std::memcmp(mine.data(), theirs.data(), p.n * 4), 0) << when << ", weights";
    }
  };

  for (int64_t step = 1; step <= 3; ++step) {
    for (Param& p : params) {
      const auto grad = values(p.n, static_cast<uint32_t>(100 * step + p.n), 0.05f);
      p.grad.write(grad);
      ASSERT_EQ(strata_tensor_write(raw, p.raw_grad, grad.data(), 0, p.n * 4), STRATA_OK);
    }
    const strata_optimizer_result mine = optimizer.step(1.0);
    strata_optimizer_result theirs{};
    theirs.struct_size = sizeof theirs;
    ASSERT_EQ(strata_optimizer_step(raw, 1.0, &theirs), STRATA_OK) << strata_last_error(raw);
    EXPECT_EQ(mine.step, step);
    EXPECT_EQ(mine.step, theirs.step);
    EXPECT_EQ(mine.found_nonfinite, theirs.found_nonfinite);
    EXPECT_EQ(mine.grad_norm, theirs.grad_norm);
    expect_same_states("step " + std::to_string(step));
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(optimizer.get_step(), 3);

  // A checkpoint exported through the wrapper restores states overwritten since, and the step.
  const std::string checkpoint = (dir_ / "optimizer.ckpt").string();
  optimizer.export_checkpoint(checkpoint);
  optimizer.write_state(params[0].param.handle(), STRATA_OPTIMIZER_EXP_AVG,
                        std::vector<float>(params[0].n, 9.0f));
  optimizer.set_step(7);
  int64_t raw_view_of_step = 0;
  ASSERT_EQ(strata_optimizer_get_step(wrapped.get(), &raw_view_of_step), STRATA_OK);
  EXPECT_EQ(raw_view_of_step, 7);
  optimizer.import_checkpoint(checkpoint);
  EXPECT_EQ(optimizer.get_step(), 3);
  expect_same_states("after import");

  std::vector<float> one_float(1);
  const strata::Error refused = error_from(
      [&] { optimizer.read_state(params[0].param.handle(), STRATA_OPTIMIZER_MASTER, one_float); });
  EXPECT_EQ(refused.code(), STRATA_E_INVALID);
  EXPECT_NE(std::string(refused.what()).find("strata_optimizer_read_state"), std::string::npos)
      << refused.what();
}

TEST_F(StrataHpp, DestructorsNeverThrowEvenWhenReleaseFails) {
  strata::Runtime rt(small_config());
  strata::Tensor t = weight(rt, 0, 4096);
  t.write(std::vector<unsigned char>(4096, 5));

  // Released behind the guard's back: the guard's own release then fails with STRATA_E_STATE.
  {
    strata::Acquired guard = t.acquire(STRATA_TIER_PINNED);
    guard.mark_dirty();
    ASSERT_EQ(strata_release(rt.get(), t.handle(), 0, nullptr), STRATA_OK);
    EXPECT_NO_THROW({ strata::Acquired dies_here = std::move(guard); });
    EXPECT_NE(rt.last_error().find("strata_release"), std::string::npos) << rt.last_error();
  }
  {
    strata::Acquired guard = t.acquire(STRATA_TIER_PINNED);
    ASSERT_EQ(strata_release(rt.get(), t.handle(), 0, nullptr), STRATA_OK);
    EXPECT_EQ(error_from([&] { guard.release(); }).code(), STRATA_E_STATE);
    EXPECT_FALSE(guard) << "release() empties the guard even when it fails";
    EXPECT_EQ(guard.data(), nullptr);
  }

  // A Tensor dying while acquired cannot unregister: it stays registered, nothing is thrown.
  strata_tensor survivor = STRATA_TENSOR_NONE;
  {
    strata::Acquired outlives_its_tensor;
    EXPECT_NO_THROW({
      strata::Tensor dies_acquired = weight(rt, 1, 4096);
      dies_acquired.write(std::vector<unsigned char>(4096, 6));
      survivor = dies_acquired.handle();
      outlives_its_tensor = dies_acquired.acquire(STRATA_TIER_PINNED);
    });
    EXPECT_NE(rt.last_error().find("strata_tensor_unregister"), std::string::npos)
        << rt.last_error();
    EXPECT_EQ(static_cast<unsigned char*>(outlives_its_tensor.data())[0], 6);
    outlives_its_tensor.release();
  }
  EXPECT_EQ(strata_tensor_unregister(rt.get(), survivor), STRATA_OK);

  // A step ended behind the scope's back: the destructor's step_end fails quietly, end() throws.
  EXPECT_NO_THROW({
    strata::StepScope step(rt);
    EXPECT_EQ(strata_step_end(rt.get()), STRATA_OK);
  });
  EXPECT_NE(rt.last_error().find("strata_step_end"), std::string::npos) << rt.last_error();
  {
    strata::StepScope step(rt);
    ASSERT_EQ(strata_step_end(rt.get()), STRATA_OK);
    EXPECT_EQ(error_from([&] { step.end(); }).code(), STRATA_E_STATE);
  }
}

TEST_F(StrataHpp, ScopesEndTheLayerAndStepWhenAnExceptionUnwinds) {
  strata::Runtime rt(small_config());
  strata::Tensor t = weight(rt, 0, 4096);
  t.write(std::vector<unsigned char>(4096, 1));
  EXPECT_THROW(
      {
        auto step = rt.step();
        auto layer = rt.layer(STRATA_PHASE_FORWARD, 0);
        strata::Acquired resident = t.acquire(STRATA_TIER_DEVICE);
        throw std::runtime_error("the model's forward failed");
      },
      std::runtime_error);
  // The guard, the layer and the step all ended (a step cannot end inside a layer), so a new
  // step begins and the tensor is free to write.
  t.write(std::vector<unsigned char>(4096, 2));
  rt.step_begin();
  rt.layer_begin(STRATA_PHASE_FORWARD, 0);
  rt.layer_end(STRATA_PHASE_FORWARD, 0);
  rt.step_end();
}

TEST_F(StrataHpp, AllocationGivesAnAddressAndIsFreedOnScopeExit) {
  strata::Runtime rt(small_config());
  strata_tensor freed = STRATA_TENSOR_NONE;
  {
    strata::Allocation scratch = rt.allocate(256 * 1024, STRATA_TIER_PINNED);
    EXPECT_EQ(scratch.bytes(), 256u * 1024);
    freed = scratch.handle();
    strata::Acquired memory = scratch.acquire(STRATA_TIER_PINNED);
    ASSERT_NE(memory.data(), nullptr);
    ASSERT_EQ(memory.bytes(), 256u * 1024);
    std::memset(memory.data(), 0x5a, memory.bytes());
    EXPECT_GE(rt.stats().pinned.in_use_bytes, 256u * 1024);
  }
  EXPECT_EQ(strata_free(rt.get(), freed), STRATA_E_BAD_HANDLE);
  strata::Allocation explicit_free = rt.allocate(4096, STRATA_TIER_DEVICE);
  explicit_free.free();
  EXPECT_FALSE(explicit_free);
}

TEST_F(StrataHpp, DeclaredScheduleAndTraceExportGoThroughTheRuntime) {
  strata::Runtime rt(small_config().trace_events(4096));
  std::vector<strata::Tensor> weights;
  std::vector<strata_schedule_entry> schedule;
  for (int32_t layer = 0; layer < 3; ++layer) {
    weights.push_back(weight(rt, layer));
    weights.back().write(pattern(kWeightWords, layer));
    schedule.push_back({STRATA_PHASE_FORWARD, layer, weights.back().handle(), STRATA_TIER_DEVICE});
  }
  rt.declare_schedule(schedule);
  for (int repeat = 0; repeat < 2; ++repeat) {
    auto step = rt.step();
    weights[0].prefetch(STRATA_TIER_DEVICE);
    for (int32_t layer = 0; layer < 3; ++layer) {
      auto in_layer = rt.layer(STRATA_PHASE_FORWARD, layer);
      strata::Acquired resident = weights[layer].acquire(STRATA_TIER_DEVICE);
      EXPECT_EQ(resident.span<const uint32_t>()[1], pattern(2, layer)[1]);
    }
    step.end();
  }
  const fs::path trace = dir_ / "trace.json";
  rt.export_trace(trace.string());
  EXPECT_GT(fs::file_size(trace), 0u);
}

TEST_F(StrataHpp, ConfigCopiesKeepTheirOwnPaths) {
  strata::Config original = small_config();
  const strata::Config copy = original;
  original.nvme_path("/nonexistent/strata");
  EXPECT_EQ(std::string(copy.c.nvme_path), dir_.string());
  EXPECT_NE(copy.c.nvme_path, original.c.nvme_path);

  // A pointer placed in .c directly is the caller's, and a copy keeps it as it is.
  const std::string callers_path = dir_.string();
  strata::Config direct;
  direct.c.nvme_path = callers_path.c_str();
  const strata::Config direct_copy = direct;
  EXPECT_EQ(direct_copy.c.nvme_path, callers_path.c_str());

  strata::Runtime rt(copy);  // the copy's path is the live test directory
  EXPECT_TRUE(rt);
}

}  // namespace
