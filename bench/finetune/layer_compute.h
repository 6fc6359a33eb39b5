// The GPU work of one layer's forward or backward in `strata bench finetune`, three ways:
//  - modeled: a timed wait for the layer's FLOPs (compute_flops) at the GPU preset's dense bf16
//    rate x MFU, and for dequantizing its NF4 weights at the preset's memory bandwidth. The
//    default: on a CPU-only machine it is the only way to give the prefetcher the compute time a
//    real GPU would give it to hide I/O behind.
//  - cpu: real fp32 GEMMs of the layer's shapes over the weights Strata handed out (the
//    emulated device is host memory), writing real gradients. Every FLOP runs, so keep the
//    token count small.
//  - gpu: cuBLAS on the device pointers (builds with CUDA only; a clear error otherwise).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "common/status.h"
#include "finetune/finetune_options.h"
#include "vocabulary/tensor_spec.h"

namespace strata::bench::finetune {

// One weight of the layer being computed, as acquired from Strata on the device tier.
struct ComputeTensor {
  const TensorSpec* spec = nullptr;
  // bf16, spec->shape; with nf4, its NF4 packing (strata_nf4_packed_bytes of spec->elements()),
  // which the compute dequantizes to bf16 before using it.
  const void* weight = nullptr;
  // bf16, same shape; backward only (acquired with DISCARD). nullptr for a frozen weight (LoRA's
  // base): backward then computes only what flows through it (the input gradient), no dW.
  void* grad = nullptr;
  void* ready_event = nullptr;  // CUDA: wait on it before reading weight; else nullptr
  bool nf4 = false;
};

class LayerCompute {
 public:
  virtual ~LayerCompute() = default;
  // Runs the layer's forward (grads unused) or backward (fills every grad). The embedding's
  // forward is a row gather and its backward a scatter: no GEMM, no modelled FLOPs.
  virtual Status forward(std::span<const ComputeTensor> tensors) = 0;
  virtual Status backward(std::span<const ComputeTensor> tensors) = 0;
  // The stream the work was queued on (release's device_stream); nullptr when it has finished.
  virtual void* stream() const { return nullptr; }
};

Result<std::unique_ptr<LayerCompute>> make_layer_compute(const FinetunePlan& plan);

// Defined in layer_compute_cuda.cpp when built with CUDA; otherwise an STRATA_E_UNSUPPORTED
// stub. Fails when no GPU is usable.
Result<std::unique_ptr<LayerCompute>> make_gpu_compute(const FinetunePlan& plan);

// The FLOPs of these tensors over `tokens`: 2 per parameter and token forward; backward 4 per
// trained parameter (input gradient and dW) and 2 per frozen one (input gradient only). The
// embedding (a lookup) has none.
double compute_flops(std::span<const ComputeTensor> tensors, uint64_t tokens, bool backward);

// Device-memory bytes dequantizing the NF4 weights among these tensors moves (read the packing,
// write bf16): what a GPU's dequantization kernel is bound by.
uint64_t dequantize_bytes(std::span<const ComputeTensor> tensors);

}  // namespace strata::bench::finetune
