// The GPU work of one layer's forward or backward in `strata bench finetune`, three ways:
//  - modeled: a timed wait for the layer's FLOPs (2 per parameter and token forward, 4 backward)
//    at the GPU preset's dense bf16 rate x MFU. The default: on a CPU-only machine it is the only
//    way to give the prefetcher the compute time a real GPU would give it to hide I/O behind.
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
  const void* weight = nullptr;  // bf16, spec->shape
  void* grad = nullptr;          // bf16, same shape; backward only (acquired with DISCARD)
  void* ready_event = nullptr;   // CUDA: wait on it before reading weight; else nullptr
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

// Parameters that count toward the modelled FLOPs of these tensors (the embedding does not).
uint64_t compute_parameters(std::span<const ComputeTensor> tensors);

}  // namespace strata::bench::finetune
