#include "finetune/layer_compute.h"

#include <strata/strata.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string_view>
#include <thread>
#include <vector>

#include "common/assert.h"
#include "optim/half_convert.h"

namespace strata::bench::finetune {
namespace {

bool is_embedding(const TensorSpec& spec) {
  return std::string_view(spec.name).starts_with("embed_tokens");
}

// A timed wait for the layer's FLOPs at the modelled GPU's rate, and for dequantizing its NF4
// weights (before forward, and again before backward, as QLoRA does) at its memory bandwidth.
class ModeledCompute final : public LayerCompute {
 public:
  explicit ModeledCompute(const FinetunePlan& plan) : plan_(plan) {}
  Status forward(std::span<const ComputeTensor> tensors) override {
    wait(seconds(tensors, false));
    return Status::ok();
  }
  Status backward(std::span<const ComputeTensor> tensors) override {
    // The GPU would write every gradient within the modelled time; writing them from the CPU
    // into the emulated device would add time a GPU run does not spend, so the buffers keep what
    // they hold (finite bf16 values of earlier tensors, or zeros). Modeled mode measures data
    // movement; --compute cpu produces real gradients.
    wait(seconds(tensors, true));
    return Status::ok();
  }

 private:
  double seconds(std::span<const ComputeTensor> tensors, bool backward) const {
    return modeled_seconds(plan_, compute_flops(tensors, plan_.tokens, backward)) +
           static_cast<double>(dequantize_bytes(tensors)) / (plan_.gpu.mem_bw_gbps * 1e9);
  }
  static void wait(double seconds) {
    if (seconds <= 0) return;
    // sleep_until on the steady clock: the wait is what the GPU would take, not more, even when
    // the thread is woken late (the next layer then simply starts late, as it would).
    std::this_thread::sleep_until(std::chrono::steady_clock::now() +
                                  std::chrono::nanoseconds(static_cast<int64_t>(seconds * 1e9)));
  }
  const FinetunePlan& plan_;
};

// Real fp32 GEMMs over the layer's weights: Y = X W^T forward; dX = dY W and dW = dY^T X backward
// (dW rounded into the bf16 gradient; none for a frozen weight). Weight rows are converted from
// bf16 a block at a time; an NF4 weight is first dequantized to bf16 with the CPU's SIMD path
// (strata_nf4_dequantize), into a buffer of the benchmark's own.
class CpuCompute final : public LayerCompute {
 public:
  explicit CpuCompute(const FinetunePlan& plan) : tokens_(plan.tokens) {
    for (size_t i = 0; i < plan.inventory.size(); ++i) {
      const TensorSpec& t = plan.inventory[i];
      if (t.kind != TensorKind::kParameter) continue;
      const uint64_t in = t.shape.empty() ? 1 : t.shape.back();
      const uint64_t out = t.shape.size() >= 2 ? t.shape.front() : 1;
      max_in_ = std::max(max_in_, in);
      max_out_ = std::max(max_out_, out);
      if (plan.roles[i] == TensorRole::kFrozenNf4) {
        max_nf4_ = std::max<uint64_t>(max_nf4_, t.elements());
      }
    }
    dequantized_.resize(max_nf4_);
    x_.resize(tokens_ * max_in_);
    y_.resize(tokens_ * max_out_);
    dx_.resize(tokens_ * max_in_);
    block_.resize(kBlockRows * max_in_);
    row_.resize(max_in_);
    // Fixed activations and upstream gradients: deterministic, small, varied.
    for (size_t i = 0; i < x_.size(); ++i)
      x_[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  }

  Status forward(std::span<const ComputeTensor> tensors) override {
    for (const ComputeTensor& t : tensors) {
      if (t.spec->shape.size() != 2) continue;  // norms and biases: no GEMM
      const uint64_t out = t.spec->shape[0], in = t.spec->shape[1];
      STRATA_ASSIGN_OR_RETURN(const uint16_t* w, weights(t));
      if (is_embedding(*t.spec)) {
        // A row gather: each token reads its embedding row.
        float sum = 0;
        for (uint64_t tok = 0; tok < tokens_; ++tok) {
          const uint64_t id = (tok * 7919) % out;
          for (uint64_t i = 0; i < in; ++i) sum += optim::bf16_to_float(w[id * in + i]);
        }
        sink_ = sink_ + sum;
        continue;
      }
      for (uint64_t o0 = 0; o0 < out; o0 += kBlockRows) {
        const uint64_t rows = std::min<uint64_t>(kBlockRows, out - o0);
        convert_rows(w + o0 * in, rows, in);
        for (uint64_t tok = 0; tok < tokens_; ++tok) {
          const float* x = x_.data() + tok * in;
          for (uint64_t r = 0; r < rows; ++r) {
            y_[tok * out + o0 + r] = dot(x, block_.data() + r * in, in);
          }
        }
      }
    }
    return Status::ok();
  }

  Status backward(std::span<const ComputeTensor> tensors) override {
    for (const ComputeTensor& t : tensors) {
      auto* g = static_cast<uint16_t*>(t.grad);
      // Frozen and not a GEMM (a norm, a bias, the embedding): nothing flows through it that
      // this benchmark models.
      if (g == nullptr && (t.spec->shape.size() != 2 || is_embedding(*t.spec))) continue;
      STRATA_ASSIGN_OR_RETURN(const uint16_t* w, weights(t));
      if (t.spec->shape.size() != 2) {
        // A norm weight or bias: its gradient is a sum over tokens.
        const uint64_t n = t.spec->elements();
        for (uint64_t i = 0; i < n; ++i) {
          float sum = 0;
          for (uint64_t tok = 0; tok < tokens_; ++tok) sum += x_[tok * max_in_ + i % max_in_];
          g[i] = optim::float_to_bf16(sum * 1e-3f);
        }
        continue;
      }
      const uint64_t out = t.spec->shape[0], in = t.spec->shape[1];
      const float* dy = y_.data();  // the forward output stands in for dL/dY
      if (is_embedding(*t.spec)) {
        std::memset(g, 0, t.spec->bytes());
        for (uint64_t tok = 0; tok < tokens_; ++tok) {
          const uint64_t id = (tok * 7919) % out;
          for (uint64_t i = 0; i < in; ++i) {
            g[id * in + i] = optim::float_to_bf16(optim::bf16_to_float(g[id * in + i]) +
                                                  1e-3f * x_[(tok * in + i) % x_.size()]);
          }
        }
        continue;
      }
      // dX = dY W, block of weight rows at a time.
      std::fill(dx_.begin(), dx_.begin() + static_cast<ptrdiff_t>(tokens_ * in), 0.0f);
      for (uint64_t o0 = 0; o0 < out; o0 += kBlockRows) {
        const uint64_t rows = std::min<uint64_t>(kBlockRows, out - o0);
        convert_rows(w + o0 * in, rows, in);
        for (uint64_t tok = 0; tok < tokens_; ++tok) {
          float* dx = dx_.data() + tok * in;
          for (uint64_t r = 0; r < rows; ++r) {
            axpy(dx, dy[tok * out + o0 + r] * 1e-3f, block_.data() + r * in, in);
          }
        }
      }
      if (g == nullptr) continue;  // frozen: the input gradient only
      // dW = dY^T X, one output row at a time, rounded into the bf16 gradient.
      for (uint64_t o = 0; o < out; ++o) {
        std::fill(row_.begin(), row_.begin() + static_cast<ptrdiff_t>(in), 0.0f);
        for (uint64_t tok = 0; tok < tokens_; ++tok) {
          axpy(row_.data(), dy[tok * out + o] * 1e-3f, x_.data() + tok * in, in);
        }
        for (uint64_t i = 0; i < in; ++i) g[o * in + i] = optim::float_to_bf16(row_[i]);
      }
    }
    return Status::ok();
  }

 private:
  static constexpr uint64_t kBlockRows = 32;

  // The bf16 weights of t: its own, or its NF4 packing dequantized into dequantized_.
  Result<const uint16_t*> weights(const ComputeTensor& t) {
    if (!t.nf4) return static_cast<const uint16_t*>(t.weight);
    const uint64_t n = t.spec->elements();
    STRATA_ASSERT(n <= dequantized_.size());
    const int rc = strata_nf4_dequantize(t.weight, strata_nf4_packed_bytes(n), n,
                                         dequantized_.data(), STRATA_DTYPE_BF16);
    if (rc != STRATA_OK) {
      return Status::error(rc, "dequantizing '" + t.spec->name + "' (NF4)");
    }
    return static_cast<const uint16_t*>(dequantized_.data());
  }

  void convert_rows(const uint16_t* w, uint64_t rows, uint64_t in) {
    for (uint64_t i = 0; i < rows * in; ++i) block_[i] = optim::bf16_to_float(w[i]);
  }
  // Eight partial sums: lets the compiler vectorize a float reduction without -ffast-math.
  static float dot(const float* a, const float* b, uint64_t n) {
    float s[8] = {};
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      for (int k = 0; k < 8; ++k) s[k] += a[i + k] * b[i + k];
    }
    float sum = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
  }
  static void axpy(float* y, float a, const float* x, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) y[i] += a * x[i];
  }

  uint64_t tokens_;
  uint64_t max_in_ = 1, max_out_ = 1, max_nf4_ = 0;
  std::vector<float> x_, y_, dx_, block_, row_;
  std::vector<uint16_t> dequantized_;  // the largest NF4 weight, in bf16
  volatile float sink_ = 0;            // keeps the embedding gather from being optimized away
};

}  // namespace

double compute_flops(std::span<const ComputeTensor> tensors, uint64_t tokens, bool backward) {
  double flops = 0;
  for (const ComputeTensor& t : tensors) {
    if (is_embedding(*t.spec)) continue;
    const double per_token = !backward ? 2.0 : (t.grad != nullptr ? 4.0 : 2.0);
    flops += per_token * static_cast<double>(t.spec->elements()) * static_cast<double>(tokens);
  }
  return flops;
}

uint64_t dequantize_bytes(std::span<const ComputeTensor> tensors) {
  uint64_t bytes = 0;
  for (const ComputeTensor& t : tensors) {
    if (!t.nf4) continue;
    const uint64_t n = t.spec->elements();
    bytes += strata_nf4_packed_bytes(n) + n * sizeof(uint16_t);
  }
  return bytes;
}

Result<std::unique_ptr<LayerCompute>> make_layer_compute(const FinetunePlan& plan) {
  switch (plan.compute) {
    case ComputeMode::kModeled:
      return std::unique_ptr<LayerCompute>(new ModeledCompute(plan));
    case ComputeMode::kCpu:
      return std::unique_ptr<LayerCompute>(new CpuCompute(plan));
    case ComputeMode::kGpu:
      return make_gpu_compute(plan);
  }
  return invalid_argument("unknown compute mode");
}

#if !defined(STRATA_HAVE_CUDA)
Result<std::unique_ptr<LayerCompute>> make_gpu_compute(const FinetunePlan&) {
  return unsupported("--compute gpu needs a strata built with CUDA (cuBLAS) and a GPU");
}
#endif

}  // namespace strata::bench::finetune
