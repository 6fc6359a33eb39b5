// --compute gpu: the layer's GEMMs with cuBLAS on the device buffers Strata hands out. Built only
// with CUDA (bench/CMakeLists.txt). Y = X W^T forward; dX = dY W and dW = dY^T X backward, with
// dW written straight into the bf16 gradient Strata acquired with DISCARD. Work is queued on one
// stream, which is passed to strata_release so that Strata copies a gradient out only after the
// GEMM that writes it. A frozen weight (LoRA's base) gets no dW; an NF4 weight (QLoRA) is
// dequantized to bf16 on the same stream first (strata_nf4_dequantize_cuda), into a buffer of the
// benchmark's own.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <strata/strata.h>

#include <algorithm>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "finetune/layer_compute.h"
#include "optim/half_convert.h"

namespace strata::bench::finetune {
namespace {

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::ok();
  return Status::error(STRATA_E_DEVICE, std::string(what) + ": " + cudaGetErrorString(e));
}

// cuBLAS, loaded when a GPU run asks for it rather than linked: linked, it was loaded and
// initialised by every start of `strata` (libcublasLt's initialisation: about 0.5 s and 200 MB of
// resident pages on the development machine), including `strata plan` and every worker process
// of `strata bench finetune`, whose host memory is what the benchmark measures. The library the
// build found is tried first, then the soname on the loader's search path.
class Cublas {
 public:
  Cublas() = default;
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;
  ~Cublas() {
    if (library_ != nullptr) dlclose(library_);
  }

  Status load() {
    const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    std::string tried;
    for (const char* path : {STRATA_CUBLAS_LIBRARY, soname.c_str()}) {
      library_ = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (library_ != nullptr) break;
      const char* why = dlerror();
      tried += std::string(tried.empty() ? "" : "; ") + (why != nullptr ? why : path);
    }
    if (library_ == nullptr) return unsupported("--compute gpu needs cuBLAS: " + tried);
    STRATA_TRY(symbol(create, "cublasCreate_v2"));
    STRATA_TRY(symbol(destroy, "cublasDestroy_v2"));
    STRATA_TRY(symbol(set_stream, "cublasSetStream_v2"));
    return symbol(gemm_ex, "cublasGemmEx");
  }

  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  // The C entry point's type, spelled out: cublas_api.h also declares an inline C++ overload
  // of the same name, so the name alone has no single address.
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                    int, const void*, const void*, cudaDataType, int, const void*,
                                    cudaDataType, int, const void*, void*, cudaDataType, int,
                                    cublasComputeType_t, cublasGemmAlgo_t);
  GemmEx gemm_ex = nullptr;

 private:
  template <typename F>
  Status symbol(F& out, const char* name) {
    out = reinterpret_cast<F>(dlsym(library_, name));
    if (out == nullptr) return unsupported(std::string("cuBLAS has no ") + name);
    return Status::ok();
  }
  void* library_ = nullptr;
};

Status cublas_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::ok();
  return Status::error(STRATA_E_DEVICE, std::string(what) + ": cuBLAS status " +
                                            std::to_string(static_cast<int>(s)));
}

class GpuCompute final : public LayerCompute {
 public:
  ~GpuCompute() override {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    for (void* p : {x_, y_, dx_, dequantized_}) {
      if (p != nullptr) cudaFree(p);
    }
    if (handle_ != nullptr) cublas_.destroy(handle_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  static Result<std::unique_ptr<LayerCompute>> create(const FinetunePlan& plan) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      return unsupported("--compute gpu: no usable CUDA GPU on this machine");
    }
    auto g = std::unique_ptr<GpuCompute>(new GpuCompute());
    g->tokens_ = plan.tokens;
    uint64_t max_in = 1, max_out = 1, max_nf4 = 0;
    for (size_t i = 0; i < plan.inventory.size(); ++i) {
      const TensorSpec& t = plan.inventory[i];
      if (t.kind != TensorKind::kParameter || t.shape.size() != 2) continue;
      max_out = std::max(max_out, t.shape[0]);
      max_in = std::max(max_in, t.shape[1]);
      if (plan.roles[i] == TensorRole::kFrozenNf4) max_nf4 = std::max(max_nf4, t.elements());
    }
    STRATA_TRY(cuda_status(cudaStreamCreateWithFlags(&g->stream_, cudaStreamNonBlocking),
                           "cudaStreamCreate"));
    STRATA_TRY(g->cublas_.load());
    STRATA_TRY(cublas_status(g->cublas_.create(&g->handle_), "cublasCreate"));
    STRATA_TRY(cublas_status(g->cublas_.set_stream(g->handle_, g->stream_), "cublasSetStream"));
    const uint64_t in_bytes = g->tokens_ * max_in * 2, out_bytes = g->tokens_ * max_out * 2;
    STRATA_TRY(cuda_status(cudaMalloc(&g->x_, in_bytes), "cudaMalloc (activations)"));
    STRATA_TRY(cuda_status(cudaMalloc(&g->y_, out_bytes), "cudaMalloc (activations)"));
    STRATA_TRY(cuda_status(cudaMalloc(&g->dx_, in_bytes), "cudaMalloc (activations)"));
    if (max_nf4 > 0) {
      STRATA_TRY(cuda_status(cudaMalloc(&g->dequantized_, max_nf4 * 2), "cudaMalloc (NF4)"));
    }
    // Small, varied activations (the forward output then stands in for dL/dY).
    std::vector<uint16_t> host(g->tokens_ * max_in);
    for (size_t i = 0; i < host.size(); ++i) {
      host[i] = optim::float_to_bf16(static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f);
    }
    STRATA_TRY(cuda_status(cudaMemcpy(g->x_, host.data(), in_bytes, cudaMemcpyHostToDevice),
                           "cudaMemcpy (activations)"));
    STRATA_TRY(g->warm_up(plan));
    return std::unique_ptr<LayerCompute>(std::move(g));
  }

  Status forward(std::span<const ComputeTensor> tensors) override {
    const float alpha = 1.0f, beta = 0.0f;
    for (const ComputeTensor& t : tensors) {
      STRATA_TRY(wait(t));
      if (t.spec->shape.size() != 2 || is_embedding(*t.spec)) continue;
      const int out = static_cast<int>(t.spec->shape[0]), in = static_cast<int>(t.spec->shape[1]);
      const int n = static_cast<int>(tokens_);
      STRATA_ASSIGN_OR_RETURN(const void* w, weights(t));
      // Row-major Y[T x out] = X[T x in] W[out x in]^T, as column-major Y^T = W X^T.
      STRATA_TRY(
          cublas_status(cublas_.gemm_ex(handle_, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, w,
                                        CUDA_R_16BF, in, x_, CUDA_R_16BF, in, &beta, y_,
                                        CUDA_R_16BF, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                        "forward GEMM"));
    }
    return Status::ok();
  }

  Status backward(std::span<const ComputeTensor> tensors) override {
    const float alpha = 1.0f, beta = 0.0f;
    for (const ComputeTensor& t : tensors) {
      STRATA_TRY(wait(t));
      if (t.spec->shape.size() != 2 || is_embedding(*t.spec)) {
        if (t.grad == nullptr) continue;  // frozen
        STRATA_TRY(cuda_status(cudaMemsetAsync(t.grad, 0, t.spec->bytes(), stream_),
                               "cudaMemsetAsync (gradient)"));
        continue;
      }
      const int out = static_cast<int>(t.spec->shape[0]), in = static_cast<int>(t.spec->shape[1]);
      const int n = static_cast<int>(tokens_);
      STRATA_ASSIGN_OR_RETURN(const void* w, weights(t));
      // dX[T x in] = dY[T x out] W[out x in]: column-major dX^T = W^T(col) dY^T.
      STRATA_TRY(
          cublas_status(cublas_.gemm_ex(handle_, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, &alpha, w,
                                        CUDA_R_16BF, in, y_, CUDA_R_16BF, out, &beta, dx_,
                                        CUDA_R_16BF, in, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                        "backward dX GEMM"));
      if (t.grad == nullptr) continue;  // frozen: the input gradient only
      // dW[out x in] = dY^T X: column-major dW^T = X^T(col) dY.
      STRATA_TRY(
          cublas_status(cublas_.gemm_ex(handle_, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, &alpha, x_,
                                        CUDA_R_16BF, in, y_, CUDA_R_16BF, out, &beta, t.grad,
                                        CUDA_R_16BF, in, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                        "backward dW GEMM"));
    }
    return Status::ok();
  }

  void* stream() const override { return stream_; }

 private:
  GpuCompute() = default;
  static bool is_embedding(const TensorSpec& spec) {
    return std::string_view(spec.name).starts_with("embed_tokens");
  }
  // The bf16 weights of t on the device: its own, or its NF4 packing dequantized on the stream.
  Result<const void*> weights(const ComputeTensor& t) {
    if (!t.nf4) return t.weight;
    const uint64_t n = t.spec->elements();
    const int rc = strata_nf4_dequantize_cuda(t.weight, strata_nf4_packed_bytes(n), n, dequantized_,
                                              STRATA_DTYPE_BF16, stream_);
    if (rc != STRATA_OK) {
      return Status::error(rc, "dequantizing '" + t.spec->name + "' (NF4) on the GPU");
    }
    return static_cast<const void*>(dequantized_);
  }
  // Runs every GEMM the steps will run once, on scratch weights, before the worker reads its
  // process base: CUDA loads a kernel's code on its first launch (lazy module loading, the
  // default since CUDA 12.2), and cuBLAS's kernels then added 0.12 GB of resident host memory
  // (an H200 run) that is the library's, like the rest of its code, not the offload engine's.
  // Counted in the base, as torch's would be in a framework's process.
  Status warm_up(const FinetunePlan& plan) {
    std::set<std::tuple<uint64_t, uint64_t, bool>> shapes;  // out, in, whether dW is computed
    uint64_t largest = 0;
    for (size_t i = 0; i < plan.inventory.size(); ++i) {
      const TensorSpec& t = plan.inventory[i];
      if (t.kind != TensorKind::kParameter || t.shape.size() != 2 || is_embedding(t)) continue;
      shapes.emplace(t.shape[0], t.shape[1], plan.roles[i] == TensorRole::kTrained);
      largest = std::max(largest, t.elements() * 2);
    }
    if (shapes.empty()) return Status::ok();
    void *w = nullptr, *dw = nullptr;
    Status status = cuda_status(cudaMalloc(&w, largest), "cudaMalloc (warm-up)");
    if (status.is_ok()) status = cuda_status(cudaMalloc(&dw, largest), "cudaMalloc (warm-up)");
    if (status.is_ok()) status = cuda_status(cudaMemset(w, 0, largest), "cudaMemset (warm-up)");
    for (const auto& [out, in, trained] : shapes) {
      if (!status.is_ok()) break;
      TensorSpec spec;
      spec.name = "warm-up";
      spec.kind = TensorKind::kParameter;
      spec.shape = {out, in};
      const ComputeTensor tensor{.spec = &spec, .weight = w, .grad = trained ? dw : nullptr};
      status = forward({&tensor, 1});
      if (status.is_ok()) status = backward({&tensor, 1});
    }
    if (status.is_ok()) status = cuda_status(cudaStreamSynchronize(stream_), "warm-up");
    for (void* p : {w, dw}) {
      if (p != nullptr) cudaFree(p);
    }
    return status;
  }
  Status wait(const ComputeTensor& t) {
    if (t.ready_event == nullptr) return Status::ok();
    return cuda_status(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(t.ready_event), 0),
                       "cudaStreamWaitEvent");
  }

  uint64_t tokens_ = 0;
  cudaStream_t stream_ = nullptr;
  Cublas cublas_;  // declared before the handle: destroyed after it
  cublasHandle_t handle_ = nullptr;
  void *x_ = nullptr, *y_ = nullptr, *dx_ = nullptr;
  void* dequantized_ = nullptr;  // the largest NF4 weight, in bf16
};

}  // namespace

Result<std::unique_ptr<LayerCompute>> make_gpu_compute(const FinetunePlan& plan) {
  return GpuCompute::create(plan);
}

}  // namespace strata::bench::finetune
