// The optimizer's CUDA kernels, callable from plain C++ (no CUDA headers needed): a fused
// Adam/AdamW step on device-resident fp32 states and the overflow check / gradient norm.
// They implement adamw_element.h with the same single-rounding operations as the CPU kernels, so
// a GPU step gives the same bits as a CPU step on the same inputs.
//
// In a build without nvcc the functions exist and return STRATA_E_UNSUPPORTED; kernels_built()
// says which. Streams are cudaStream_t passed as void* (nullptr: the legacy default stream).
// Every call only enqueues work, except grad_stats_read, which waits for its stream.
#pragma once

#include <cstddef>

#include "common/status.h"
#include "optim/adamw.h"

namespace strata::optim::cuda {

// Whether this build contains the kernels.
bool kernels_built();
// CUDA devices usable now: 0 without kernels, driver or GPU. Never fails.
int device_count();

// One Adam/AdamW step on a slice whose pointers are all device memory of the current device.
// Pointers need only natural alignment; 16-byte aligned slices take a vectorized path with the
// same results. Validates like CpuAdam::step.
Status adamw_step(const AdamWParams& params, const AdamWSlice& slice, void* stream);

// Overflow check and sum of squares over any number of gradient slices, accumulated in a device
// workspace the caller owns (kGradStatsWorkspaceBytes, 8-byte aligned): begin, add each slice,
// finish; the result stays on the device (grad_stats_result) until grad_stats_read fetches it,
// so the check does not stall the stream. A fixed grid makes the sum deterministic.
inline constexpr size_t kGradStatsBlocks = 1024;
inline constexpr size_t kGradStatsWorkspaceBytes = (kGradStatsBlocks + 1) * sizeof(double);

Status grad_stats_begin(void* workspace, void* stream);
Status grad_stats_add(const GradSlice& slice, void* workspace, void* stream);
// Reduces the partial sums into the result slot: a double on the device, the sum of squares,
// not finite iff some element was NaN or infinite.
Status grad_stats_finish(void* workspace, void* stream);
const double* grad_stats_result(const void* workspace);
// Copies the result to the host and waits for the stream.
Status grad_stats_read(const void* workspace, GradStats* out, void* stream);

}  // namespace strata::optim::cuda
