// DeepSpeed ZeRO-3's host memory for NVMe offload, buffer by buffer, derived from one
// configuration and its layout (deepspeed_config.h). Each record names the DeepSpeed line that
// allocates it; the baseline worker allocates exactly these records (so the measured peak is
// the OS's count of them), and `--json` / docs/results.md print them.
//
// Pinned buffers go through PyTorch's CachingHostAllocator, which rounds each block up to a power
// of two; pageable ones are exact. `pin_memory(torch.zeros(n))` keeps the zeroed pageable source
// resident until the copy returns (the start-up double copy); `pin_memory(torch.empty(n))` never
// touches its source, so that costs nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/deepspeed_config.h"

namespace strata::deepspeed {

enum class BufferLife : uint8_t {
  kRun = 0,      // allocated at start-up, held until the end
  kStartup = 1,  // a start-up temporary
  kStep = 2,     // a temporary inside every step
};
const char* to_string(BufferLife life);

// What the worker uses a buffer for (names are for people; this is for the code).
enum class BufferRole : uint8_t {
  kUnswappedParameters,  // parameter partitions under the minimum I/O size
  kParameterSwap,        // buffer_count slots of buffer_size
  kCpuFlatParameters,    // the max_in_cpu flat buffer
  kWriteBack,            // bf16 weights of one sub-group on their way to NVMe
  kOptimizerSwap,        // fp32 master, m, v and gradient of sub-groups in flight
  kMasterSource,         // start-up only
  kHostStates,           // unswapped sub-groups' master | m | v | gradient
  kFlatGradients,        // every bf16 gradient
  kOverflowTemporary,    // fp16 only, inside the step
};

struct BufferSpec {
  std::string name;
  BufferRole role = BufferRole::kFlatGradients;
  uint32_t count = 1;       // separate allocations of `each_bytes`
  uint64_t each_bytes = 0;  // requested
  uint64_t each_held = 0;   // held: rounded when pinned
  bool pinned = false;
  bool zero_source = false;  // pinned from torch.zeros: the source is resident during the copy
  BufferLife life = BufferLife::kRun;
  std::string when;    // allocated / freed, in words
  std::string source;  // the DeepSpeed file:line
  uint64_t held_bytes() const { return count * each_held; }
};

std::vector<BufferSpec> deepspeed_buffers(const DeepSpeedConfig& config,
                                          const DeepSpeedLayout& layout,
                                          const std::vector<TensorSpec>& inventory,
                                          Precision precision);

// The host peak these buffers alone make, by DeepSpeed's allocation order: over the whole run
// (start-up copies and temporaries included) and over the steps alone; and the pinned total.
struct BufferPeaks {
  uint64_t run = 0;
  std::string run_moment;
  uint64_t steps = 0;
  std::string steps_moment;
  uint64_t pinned = 0;
};
BufferPeaks buffer_peaks(const std::vector<BufferSpec>& buffers);

// PyTorch's CachingHostAllocator block size for `bytes` (the next power of two).
uint64_t caching_host_allocator_size(uint64_t bytes);

}  // namespace strata::deepspeed
