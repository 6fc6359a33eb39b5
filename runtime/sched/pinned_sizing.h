// The automatic pinned budget (strata_config.pinned_budget_bytes = 0, --pinned-budget auto): the
// least pinned memory that keeps the drive and the CPU optimizer at full speed, derived from the
// drive, not from the model. Streaming moves every tensor in chunks, so what pinned memory must
// hold is what is in flight, never a tensor:
//
//   in flight F   = max(queue depth the drive needs x request size, read rate x request latency)
//                   per direction (Little's law: bytes in flight = rate x time each spends there)
//   staging       = 2 directions x N buffers x chunk C, N = ceil(F / C) in [2, 64]
//   sub-group S   = max(C, T x 4 MiB) per optimizer state (master, m, v) for T optimizer
//                   threads: about a million fp32 elements per thread, a few milliseconds of
//                   each thread's work per sub-group, so that what every sub-group costs beside
//                   its arithmetic (acquires and releases of three states, the copies of its
//                   pieces, waking the threads) stays a few percent
//   window W      = ceil(F / 3S) + 1 sub-groups read ahead: their states keep F in flight
//   optimizer     = (W + 3) x 3S (read ahead, being updated, being written back, and one of
//                   room so that the drive reads the next while it writes one back)
//                 + 2S (the pinned pieces of a 16-bit parameter and gradient)
//   budget        = staging + optimizer
//
// The planner (strata plan), strata doctor and the runtime all size it here, so each prints the
// same figure with the same derivation (docs/tuning.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::sched {

struct DriveFigures {
  double read_bytes_per_s = 0;
  double write_bytes_per_s = 0;
  // What keeps the drive at full speed: requests of request_bytes, queue_depth of them in flight,
  // each taking latency_s (0: unknown; then F is queue_depth x request_bytes).
  uint32_t queue_depth = 32;
  uint64_t request_bytes = uint64_t{1} << 20;
  double latency_s = 0;
  std::string source;  // "measured on ...", "declared", "modelled: ..."
};

struct PinnedSizing {
  uint64_t in_flight_bytes = 0;  // F, per direction
  uint64_t chunk_bytes = 0;      // C
  uint32_t stream_buffers = 0;   // N, per direction
  uint64_t staging_bytes = 0;
  uint64_t sub_group_bytes = 0;  // S
  uint32_t window = 0;           // W
  uint64_t optimizer_bytes = 0;
  uint64_t budget_bytes = 0;
  // One line per figure above, each with its numbers, for doctor, plan and logs.
  std::vector<std::string> derivation;
};

// Stream chunks are powers of two in [kMinStreamChunkBytes, kMaxStreamChunkBytes].
inline constexpr uint64_t kMinStreamChunkBytes = uint64_t{64} << 10;
inline constexpr uint64_t kMaxStreamChunkBytes = uint64_t{64} << 20;
inline constexpr uint64_t kDefaultStreamChunkBytes = uint64_t{4} << 20;
inline constexpr uint32_t kMinStreamBuffers = 2;
inline constexpr uint32_t kMaxStreamBuffers = 64;

inline constexpr uint64_t kSubGroupBytesPerThread = uint64_t{4} << 20;
// A sub-group set by hand (strata_optimizer_options.sub_group_bytes) is a multiple of 4 bytes
// in [4096, kMaxConfiguredSubGroupBytes].
inline constexpr uint64_t kMaxConfiguredSubGroupBytes = uint64_t{1} << 40;

// The limits of the values a pinned split is made of, where they are set by hand: checked by the
// runtime (config.stream_chunk_bytes), the optimizer (sub_group_bytes) and `strata plan` (a run's
// split replayed), each with its own message.
constexpr bool valid_stream_chunk_bytes(uint64_t chunk) {
  return chunk >= kMinStreamChunkBytes && chunk <= kMaxStreamChunkBytes &&
         (chunk & (chunk - 1)) == 0;
}
constexpr bool valid_sub_group_bytes(uint64_t bytes) {
  return bytes >= 4096 && bytes % 4 == 0 && bytes <= kMaxConfiguredSubGroupBytes;
}

// A budget given exactly (not automatic) is split by these two rules, the runtime's:
// staging of `buffers` (0: 4) per direction of the default chunk, halved until the staging takes
// a quarter of the budget at most (none without room for a 64 KiB chunk: no streaming), and
// sub-groups of a sixteenth of the pool left, page-aligned, within [64 KiB, 64 MiB].
struct StreamShape {
  uint64_t chunk_bytes = 0;  // 0: no streaming
  uint32_t buffers = 0;      // per direction
  bool on() const { return chunk_bytes != 0; }
  uint64_t staging_bytes() const { return 2 * uint64_t{buffers} * chunk_bytes; }
};
inline constexpr uint32_t kDefaultBudgetStreamBuffers = 4;
StreamShape stream_shape_for_budget(uint64_t pinned_budget, uint32_t buffers = 0);
uint64_t sub_group_bytes_for_pool(uint64_t pinned_pool_bytes);

// How a pinned budget is spent, as the runtime spends it: the automatic one as `automatic` sized
// it, or one set exactly (`exact`) by the two rules above. The simulated runs (strata plan, the
// benchmark's full-scale projection) take their memory plan and sub-groups from it.
struct PinnedSplit {
  uint64_t budget_bytes = 0;
  uint64_t staging_bytes = 0;
  uint64_t chunk_bytes = 0;  // 0: no streaming
  uint64_t sub_group_bytes = 0;
  std::vector<std::string> derivation;  // the automatic sizing's lines, or one for a budget set
};
// What a run set (or was given by its automatic sizing) beside an exact budget, to replay it:
// the runtime's config.stream_chunk_bytes and stream_buffers and the optimizer's
// sub_group_bytes, each 0 for the rule above.
struct PinnedSplitGiven {
  uint64_t chunk_bytes = 0;
  uint32_t buffers = 0;
  uint64_t sub_group_bytes = 0;
};
// `origin` says where an exact budget came from, in its derivation line ("as given").
PinnedSplit split_pinned_budget(const PinnedSizing& automatic, uint64_t exact = 0,
                                const PinnedSplitGiven& given = {},
                                std::string_view origin = "as given");

// optimizer_threads: the CPU optimizer's threads (>= 1). chunk_bytes: the stream chunk (0:
// kDefaultStreamChunkBytes, halved while F holds fewer than two). stream_buffers: per direction
// (0: ceil(F / chunk)), for a caller that set them.
PinnedSizing size_pinned_budget(const DriveFigures& drive, uint32_t optimizer_threads,
                                uint64_t chunk_bytes = 0, uint32_t stream_buffers = 0);

}  // namespace strata::sched
