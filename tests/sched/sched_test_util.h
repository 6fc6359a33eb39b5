// Shared helpers for the sched tests: a watchdog that turns a hang into a failure, byte patterns
// that identify (tensor, version), a harness owning executor + fake backend + scheduler in the
// right destruction order, and synthetic Llama-shaped inventories.
#pragma once

#include <gtest/gtest.h>

#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sched/fake_backend.h"
#include "sched/scheduler.h"

namespace strata::sched::testing {

// Aborts the test binary with a message when the scope is not left within `seconds`: a deadlock
// fails loudly instead of hanging the suite.
class Watchdog {
 public:
  explicit Watchdog(double seconds, std::string what = "test") : what_(std::move(what)) {
    thread_ = std::thread([this, seconds] {
      std::unique_lock lock(mu_);
      if (!cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; })) {
        std::fprintf(stderr, "watchdog: %s did not finish in %.1f s (deadlock?)\n", what_.c_str(),
                     seconds);
        std::fflush(stderr);
        std::_Exit(3);
      }
    });
  }
  ~Watchdog() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::string what_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

inline uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Bytes that name (tensor, version): any stale, torn or misplaced byte shows.
inline void fill_pattern(void* data, uint64_t bytes, uint64_t tensor, uint64_t version) {
  auto* p = static_cast<uint8_t*>(data);
  const uint64_t seed = mix(tensor * 1000003 + version);
  for (uint64_t i = 0; i < bytes; i += 8) {
    const uint64_t word = mix(seed + i);
    std::memcpy(p + i, &word, std::min<uint64_t>(8, bytes - i));
  }
}

// Index of the first wrong byte, or -1.
inline int64_t check_pattern(const void* data, uint64_t bytes, uint64_t tensor, uint64_t version) {
  const auto* p = static_cast<const uint8_t*>(data);
  const uint64_t seed = mix(tensor * 1000003 + version);
  for (uint64_t i = 0; i < bytes; i += 8) {
    const uint64_t word = mix(seed + i);
    const uint64_t n = std::min<uint64_t>(8, bytes - i);
    if (std::memcmp(p + i, &word, n) != 0) {
      for (uint64_t k = 0; k < n; ++k) {
        if (p[i + k] != reinterpret_cast<const uint8_t*>(&word)[k])
          return static_cast<int64_t>(i + k);
      }
    }
  }
  return -1;
}

// Writes version `v` of `h` (its first `bytes`) through an overwrite acquire on `tier`.
inline void write_version(Scheduler& s, TensorHandle h, Tier tier, uint64_t v, uint64_t bytes) {
  Result<Acquired> a = s.acquire(h, tier, AccessMode::kOverwrite, std::chrono::seconds(10));
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  fill_pattern(a->data, bytes, h.index, v);
  ASSERT_TRUE(s.release(h, true).is_ok());
}

// Reads `h` on `tier` and expects version `v` in its first `bytes`.
inline void expect_version(Scheduler& s, TensorHandle h, Tier tier, uint64_t v, uint64_t bytes) {
  Result<Acquired> a = s.acquire(h, tier, AccessMode::kRead, std::chrono::seconds(10));
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  EXPECT_EQ(check_pattern(a->data, bytes, h.index, v), -1) << "tensor " << h.index;
  ASSERT_TRUE(s.release(h, false).is_ok());
}

// Leaves `h` on NVMe alone: version `v` written on `tier`, flushed, and its buffer there given
// to `other` (which the caller sized so that the tier holds one of the two).
inline void push_to_nvme(Scheduler& s, TensorHandle h, TensorHandle other, Tier tier, uint64_t v,
                         uint64_t bytes) {
  write_version(s, h, tier, v, bytes);
  ASSERT_TRUE(s.flush(std::chrono::seconds(10)).is_ok());
  write_version(s, other, tier, 1, bytes);
  ASSERT_EQ(s.describe(h)->residency, Residency::kOnNvme);
}

inline TensorSpec flat_spec(const std::string& name, uint64_t bytes,
                            TensorKind kind = TensorKind::kParameter, int32_t layer = -1) {
  TensorSpec spec;
  spec.name = name;
  spec.shape = {bytes};
  spec.dtype = DType::kUInt8;
  spec.kind = kind;
  spec.layer = layer;
  return spec;
}

// A thread pool executor, a FakeBackend and a Scheduler, destroyed scheduler first (it waits for
// transfers), then the backend (its worker), then the pool.
struct Harness {
  explicit Harness(SchedulerConfig config, uint32_t max_delay_us = 0)
      : pool(2), backend(max_delay_us) {
    config.check_invariants = true;  // every scheduler test recounts its books after each pump
    Result<std::unique_ptr<Scheduler>> created =
        Scheduler::create(config, backend, pool.get_executor());
    EXPECT_TRUE(created.is_ok()) << created.status().message();
    if (created) scheduler = std::move(*created);
  }
  ~Harness() {
    scheduler.reset();
    pool.join();
  }
  Scheduler& s() { return *scheduler; }

  boost::asio::thread_pool pool;
  FakeBackend backend;
  std::unique_ptr<Scheduler> scheduler;
};

inline SchedulerConfig small_config(uint64_t pinned_budget, uint64_t device_budget,
                                    double headroom = 0.0) {
  SchedulerConfig config;
  config.memory = strata_memory_plan(pinned_budget, device_budget);
  config.clean_headroom = headroom;
  return config;
}

// The same with streamed device transfers: `staging` bytes of pinned memory held for them beside
// a pinned pool of `pinned_pool` bytes.
inline SchedulerConfig streaming_config(uint64_t pinned_pool, uint64_t device_budget,
                                        uint64_t staging) {
  SchedulerConfig config;
  config.memory = strata_memory_plan(pinned_pool + staging, device_budget, staging);
  return config;
}

inline constexpr auto kWait = std::chrono::seconds(10);

// A Llama-shaped inventory in forward order with Adam states, named like model/inventory.h
// ("NAME#grad", "#master", "#adam_m", "#adam_v"). kv_dim < hidden is grouped-query attention.
inline std::vector<TensorSpec> llama_like_inventory(int layers, uint64_t hidden,
                                                    uint64_t intermediate, uint64_t kv_dim,
                                                    uint64_t vocab) {
  std::vector<TensorSpec> out;
  auto add = [&](const std::string& name, std::vector<uint64_t> shape, int32_t layer) {
    TensorSpec p;
    p.name = name;
    p.shape = shape;
    p.dtype = DType::kBFloat16;
    p.kind = TensorKind::kParameter;
    p.layer = layer;
    out.push_back(p);
    TensorSpec g = p;
    g.name = name + "#grad";
    g.kind = TensorKind::kGradient;
    out.push_back(g);
    const TensorKind states[] = {TensorKind::kMasterWeight, TensorKind::kAdamM, TensorKind::kAdamV};
    const char* suffix[] = {"#master", "#adam_m", "#adam_v"};
    for (int i = 0; i < 3; ++i) {
      TensorSpec s = p;
      s.name = name + suffix[i];
      s.kind = states[i];
      s.dtype = DType::kFloat32;
      out.push_back(s);
    }
  };
  add("embed_tokens.weight", {vocab, hidden}, -1);
  for (int l = 0; l < layers; ++l) {
    const std::string prefix = "layers." + std::to_string(l) + ".";
    add(prefix + "input_layernorm.weight", {hidden}, l);
    add(prefix + "self_attn.q_proj.weight", {hidden, hidden}, l);
    add(prefix + "self_attn.k_proj.weight", {kv_dim, hidden}, l);
    add(prefix + "self_attn.v_proj.weight", {kv_dim, hidden}, l);
    add(prefix + "self_attn.o_proj.weight", {hidden, hidden}, l);
    add(prefix + "post_attention_layernorm.weight", {hidden}, l);
    add(prefix + "mlp.gate_proj.weight", {intermediate, hidden}, l);
    add(prefix + "mlp.up_proj.weight", {intermediate, hidden}, l);
    add(prefix + "mlp.down_proj.weight", {hidden, intermediate}, l);
  }
  add("norm.weight", {hidden}, -1);
  add("lm_head.weight", {vocab, hidden}, -1);
  return out;
}

// Llama-2-70B's shape: 80 layers, hidden 8192, MLP 28672, 8 KV heads of 128, vocab 32000.
inline std::vector<TensorSpec> llama70b_inventory() {
  return llama_like_inventory(80, 8192, 28672, 1024, 32000);
}

}  // namespace strata::sched::testing
