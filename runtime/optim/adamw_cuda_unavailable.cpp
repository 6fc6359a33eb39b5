// adamw_cuda.h in a build without nvcc: every entry point says so.
#include "optim/adamw_cuda.h"

namespace strata::optim::cuda {
namespace {
Status not_built() {
  return unsupported(
      "CUDA optimizer kernels: this build of Strata has no CUDA (nvcc was not found)");
}
}  // namespace

bool kernels_built() {
  return false;
}
int device_count() {
  return 0;
}
Status adamw_step(const AdamWParams&, const AdamWSlice&, void*) {
  return not_built();
}
Status grad_stats_begin(void*, void*) {
  return not_built();
}
Status grad_stats_add(const GradSlice&, void*, void*) {
  return not_built();
}
Status grad_stats_finish(void*, void*) {
  return not_built();
}
const double* grad_stats_result(const void* workspace) {
  return static_cast<const double*>(workspace) + kGradStatsBlocks;
}
Status grad_stats_read(const void*, GradStats*, void*) {
  return not_built();
}

}  // namespace strata::optim::cuda
