// A training framework stand-in written only against strata.h: a multi-layer model whose
// forward, backward and optimizer phases acquire and release tensors exactly as a framework
// would, with contents that are a pure function of (tensor, step), so every byte read back is
// checked. Used by the API tests, the soak test and the fault tests.
//
// Each tensor remembers the step its contents belong to (StandinTensor::version), so that a step
// that fails half way (faults injected under the runtime) leaves a model that still says exactly
// what every tensor must hold, and the next step can go on from there.
#pragma once

#include <strata/strata.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace strata::testing {

struct StandinOptions {
  int layers = 6;
  // Tensor sizes of one layer (odd on purpose: nothing is a multiple of the block size).
  std::vector<uint64_t> param_bytes = {3 * 4096 + 17, 64 * 1024 + 5, 200 * 1024 + 3};
  // Simulated compute per layer and phase: the time I/O of later layers can overlap.
  std::chrono::microseconds compute{200};
  bool optimizer_states = true;  // master / m / v per parameter, updated in the optimizer phase
};

// The byte a tensor holds at position i after `step` optimizer steps.
inline uint8_t expected_byte(uint64_t tensor_seed, uint64_t step, uint64_t i) {
  uint64_t x = tensor_seed * 0x9E3779B97F4A7C15ull + step * 0xBF58476D1CE4E5B9ull + i;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return static_cast<uint8_t>(x);
}

inline void fill_expected(void* data, uint64_t bytes, uint64_t seed, uint64_t step) {
  auto* p = static_cast<uint8_t*>(data);
  for (uint64_t i = 0; i < bytes; ++i) p[i] = expected_byte(seed, step, i);
}

// Returns the first index that differs, or bytes when all match.
inline uint64_t first_mismatch(const void* data, uint64_t bytes, uint64_t seed, uint64_t step) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (uint64_t i = 0; i < bytes; ++i) {
    if (p[i] != expected_byte(seed, step, i)) return i;
  }
  return bytes;
}

struct StandinTensor {
  strata_tensor handle = STRATA_TENSOR_NONE;
  uint64_t bytes = 0;
  uint64_t seed = 0;
  int layer = 0;
  uint64_t version = 0;  // the step whose contents the tensor holds
};

struct StandinLayer {
  std::vector<StandinTensor> params, grads, master, adam_m, adam_v;
};

class FrameworkStandin {
 public:
  FrameworkStandin(strata_runtime* rt, StandinOptions options)
      : rt_(rt), options_(std::move(options)) {}

  // Registers every tensor and writes its initial contents (step 0). Returns a status code.
  int setup() {
    uint64_t seed = 1;
    layers_.resize(options_.layers);
    for (int l = 0; l < options_.layers; ++l) {
      for (size_t i = 0; i < options_.param_bytes.size(); ++i) {
        const uint64_t b = options_.param_bytes[i];
        const std::string base = "layers." + std::to_string(l) + ".w" + std::to_string(i);
        int rc = add(layers_[l].params, base, b, STRATA_KIND_PARAMETER, l, seed++, true);
        if (rc == STRATA_OK)
          rc = add(layers_[l].grads, base + "#grad", b, STRATA_KIND_GRADIENT, l, seed++, false);
        if (rc != STRATA_OK) return rc;
        if (!options_.optimizer_states) continue;
        rc = add(layers_[l].master, base + "#master", 2 * b, STRATA_KIND_MASTER_WEIGHT, l, seed++,
                 true);
        if (rc == STRATA_OK)
          rc = add(layers_[l].adam_m, base + "#m", 2 * b, STRATA_KIND_ADAM_M, l, seed++, true);
        if (rc == STRATA_OK)
          rc = add(layers_[l].adam_v, base + "#v", 2 * b, STRATA_KIND_ADAM_V, l, seed++, true);
        if (rc != STRATA_OK) return rc;
      }
    }
    return STRATA_OK;
  }

  // One training step: forward 0..L-1, backward L-1..0, optimizer 0..L-1. Returns a status
  // code; a content mismatch is reported as STRATA_E_CORRUPT with mismatch() describing it.
  int step() {
    int rc = strata_step_begin(rt_);
    for (int l = 0; rc == STRATA_OK && l < options_.layers; ++l) rc = forward(l);
    for (int l = options_.layers - 1; rc == STRATA_OK && l >= 0; --l) rc = backward(l);
    for (int l = 0; rc == STRATA_OK && l < options_.layers; ++l) rc = optimizer(l);
    const int end = strata_step_end(rt_);
    if (rc == STRATA_OK) rc = end;
    if (rc == STRATA_OK) ++step_;
    return rc;
  }

  // Reads every tensor back through strata_tensor_read and checks it.
  int verify_all() {
    for (auto& layer : layers_) {
      for (auto* group : {&layer.params, &layer.master, &layer.adam_m, &layer.adam_v}) {
        for (auto& t : *group) {
          std::vector<uint8_t> buffer(t.bytes);
          const int rc = strata_tensor_read(rt_, t.handle, buffer.data(), 0, t.bytes);
          if (rc != STRATA_OK) return rc;
          if (!check(buffer.data(), t)) return STRATA_E_CORRUPT;
        }
      }
    }
    return STRATA_OK;
  }

  uint64_t total_bytes() const {
    uint64_t total = 0;
    for (const auto& layer : layers_) {
      for (const auto* group :
           {&layer.params, &layer.grads, &layer.master, &layer.adam_m, &layer.adam_v}) {
        for (const auto& t : *group) total += t.bytes;
      }
    }
    return total;
  }
  size_t tensor_count() const {
    size_t count = 0;
    for (const auto& layer : layers_) {
      for (const auto* group :
           {&layer.params, &layer.grads, &layer.master, &layer.adam_m, &layer.adam_v}) {
        count += group->size();
      }
    }
    return count;
  }
  uint64_t steps_done() const { return step_; }
  // Set when bytes read back differed from the model: silently wrong data, never acceptable.
  const std::string& mismatch() const { return mismatch_; }
  const std::vector<StandinLayer>& layers() const { return layers_; }

 private:
  int add(std::vector<StandinTensor>& group, const std::string& name, uint64_t bytes,
          strata_tensor_kind kind, int layer, uint64_t seed, bool initialize) {
    strata_tensor_desc desc{};
    desc.struct_size = sizeof desc;
    desc.name = name.c_str();
    desc.bytes = bytes;
    desc.dtype = kind == STRATA_KIND_PARAMETER || kind == STRATA_KIND_GRADIENT ? STRATA_DTYPE_BF16
                                                                               : STRATA_DTYPE_F32;
    desc.kind = kind;
    desc.layer = layer;
    desc.home_tier = STRATA_TIER_NVME;
    StandinTensor t{STRATA_TENSOR_NONE, bytes, seed, layer};
    int rc = strata_tensor_register(rt_, &desc, &t.handle);
    if (rc != STRATA_OK) return rc;
    if (initialize) {
      std::vector<uint8_t> initial(bytes);
      fill_expected(initial.data(), bytes, seed, 0);
      rc = strata_tensor_write(rt_, t.handle, initial.data(), 0, bytes);
      if (rc != STRATA_OK) return rc;
    }
    group.push_back(t);
    return STRATA_OK;
  }

  bool check(const void* data, const StandinTensor& t) {
    const uint64_t at = first_mismatch(data, t.bytes, t.seed, t.version);
    if (at == t.bytes) return true;
    mismatch_ = "tensor seed " + std::to_string(t.seed) + " (layer " + std::to_string(t.layer) +
                ", " + std::to_string(t.bytes) + " bytes) differs at byte " + std::to_string(at) +
                " from its contents of step " + std::to_string(t.version);
    return false;
  }

  // Releases a tensor the caller wrote, which from then on holds `version`. A release that
  // reports an earlier write-back failure has still taken the new contents (strata.h: the
  // previous copy stays valid only until the new one is written).
  int release_dirty(StandinTensor& t, uint64_t version) {
    const int rc = strata_release(rt_, t.handle, STRATA_RELEASE_DIRTY, nullptr);
    if (rc == STRATA_OK || rc == STRATA_E_IO || rc == STRATA_E_NOSPACE) t.version = version;
    return rc;
  }

  int acquire(const StandinTensor& t, strata_tier tier, uint32_t flags, void** data) {
    strata_acquired a{};
    a.struct_size = sizeof a;
    const int rc = strata_acquire(rt_, t.handle, tier, flags, &a);
    if (rc == STRATA_OK) *data = a.data;
    return rc;
  }

  void compute() {
    if (options_.compute.count() > 0) std::this_thread::sleep_for(options_.compute);
  }

  int forward(int l) {
    int rc = strata_layer_begin(rt_, STRATA_PHASE_FORWARD, l);
    for (const auto& p : layers_[l].params) {
      void* data = nullptr;
      if (rc == STRATA_OK) rc = acquire(p, STRATA_TIER_DEVICE, 0, &data);
      if (rc != STRATA_OK) break;
      if (!check(data, p)) rc = STRATA_E_CORRUPT;
      const int rel = strata_release(rt_, p.handle, 0, nullptr);
      if (rc == STRATA_OK) rc = rel;
    }
    if (rc == STRATA_OK) compute();
    const int end = strata_layer_end(rt_, STRATA_PHASE_FORWARD, l);
    return rc == STRATA_OK ? end : rc;
  }

  int backward(int l) {
    int rc = strata_layer_begin(rt_, STRATA_PHASE_BACKWARD, l);
    for (size_t i = 0; rc == STRATA_OK && i < layers_[l].params.size(); ++i) {
      const auto& p = layers_[l].params[i];
      auto& g = layers_[l].grads[i];
      void* data = nullptr;
      rc = acquire(p, STRATA_TIER_DEVICE, 0, &data);
      if (rc != STRATA_OK) break;
      if (!check(data, p)) rc = STRATA_E_CORRUPT;
      int rel = strata_release(rt_, p.handle, 0, nullptr);
      if (rc == STRATA_OK) rc = rel;
      if (rc != STRATA_OK) break;
      // Gradients are produced, not read: DISCARD skips loading stale contents.
      rc = acquire(g, STRATA_TIER_DEVICE, STRATA_ACQUIRE_DISCARD, &data);
      if (rc != STRATA_OK) break;
      fill_expected(data, g.bytes, g.seed, step_);
      rel = release_dirty(g, step_);
      if (rc == STRATA_OK) rc = rel;
    }
    if (rc == STRATA_OK) compute();
    const int end = strata_layer_end(rt_, STRATA_PHASE_BACKWARD, l);
    return rc == STRATA_OK ? end : rc;
  }

  int optimizer(int l) {
    int rc = strata_layer_begin(rt_, STRATA_PHASE_OPTIMIZER, l);
    auto& layer = layers_[l];
    for (size_t i = 0; rc == STRATA_OK && i < layer.params.size(); ++i) {
      void* grad = nullptr;
      rc = acquire(layer.grads[i], STRATA_TIER_PINNED, 0, &grad);
      if (rc != STRATA_OK) break;
      if (!check(grad, layer.grads[i])) rc = STRATA_E_CORRUPT;
      if (rc == STRATA_OK && options_.optimizer_states) {
        for (auto* group : {&layer.master, &layer.adam_m, &layer.adam_v}) {
          auto& s = (*group)[i];
          void* state = nullptr;
          rc = acquire(s, STRATA_TIER_PINNED, 0, &state);
          if (rc != STRATA_OK) break;
          if (!check(state, s)) rc = STRATA_E_CORRUPT;
          if (rc == STRATA_OK) {
            fill_expected(state, s.bytes, s.seed, s.version + 1);
            rc = release_dirty(s, s.version + 1);
          } else {
            (void)strata_release(rt_, s.handle, 0, nullptr);
          }
          if (rc != STRATA_OK) break;
        }
      }
      const int rel = strata_release(rt_, layer.grads[i].handle, 0, nullptr);
      if (rc == STRATA_OK) rc = rel;
      if (rc != STRATA_OK) break;
      // The new low-precision weights for the next forward.
      void* param = nullptr;
      rc = acquire(layer.params[i], STRATA_TIER_PINNED, STRATA_ACQUIRE_DISCARD, &param);
      if (rc != STRATA_OK) break;
      auto& p = layer.params[i];
      fill_expected(param, p.bytes, p.seed, p.version + 1);
      rc = release_dirty(p, p.version + 1);
    }
    const int end = strata_layer_end(rt_, STRATA_PHASE_OPTIMIZER, l);
    return rc == STRATA_OK ? end : rc;
  }

  strata_runtime* rt_;
  StandinOptions options_;
  std::vector<StandinLayer> layers_;
  uint64_t step_ = 0;
  std::string mismatch_;
};

}  // namespace strata::testing
