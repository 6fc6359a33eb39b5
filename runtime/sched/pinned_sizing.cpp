#include "sched/pinned_sizing.h"

#include <algorithm>
#include <cmath>

#include "common/assert.h"
#include "common/units.h"

namespace strata::sched {
namespace {

constexpr uint64_t kStates = 3;  // master, m, v

uint64_t ceil_div(uint64_t a, uint64_t b) {
  return (a + b - 1) / b;
}

std::string rate(double bytes_per_s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GB/s", bytes_per_s / 1e9);
  return text;
}

}  // namespace

PinnedSizing size_pinned_budget(const DriveFigures& drive, uint32_t optimizer_threads,
                                uint64_t chunk_bytes, uint32_t stream_buffers) {
  PinnedSizing out;
  const uint64_t queue = uint64_t{std::max<uint32_t>(drive.queue_depth, 1)} * drive.request_bytes;
  const double little =
      std::max(drive.read_bytes_per_s, drive.write_bytes_per_s) * std::max(drive.latency_s, 0.0);
  out.in_flight_bytes = std::max<uint64_t>(queue, static_cast<uint64_t>(std::ceil(little)));
  out.in_flight_bytes = std::max(out.in_flight_bytes, kMinStreamChunkBytes * kMinStreamBuffers);

  out.chunk_bytes = chunk_bytes != 0 ? chunk_bytes : kDefaultStreamChunkBytes;
  if (chunk_bytes == 0) {
    while (out.chunk_bytes > kMinStreamChunkBytes &&
           out.chunk_bytes * kMinStreamBuffers > out.in_flight_bytes) {
      out.chunk_bytes /= 2;
    }
  }
  out.stream_buffers = stream_buffers != 0 ? stream_buffers
                                           : static_cast<uint32_t>(std::clamp<uint64_t>(
                                                 ceil_div(out.in_flight_bytes, out.chunk_bytes),
                                                 kMinStreamBuffers, kMaxStreamBuffers));
  out.staging_bytes = 2 * uint64_t{out.stream_buffers} * out.chunk_bytes;

  const uint32_t threads = std::max<uint32_t>(optimizer_threads, 1);
  out.sub_group_bytes = std::max(out.chunk_bytes, kSubGroupBytesPerThread * threads);
  const uint64_t unit = kStates * out.sub_group_bytes;
  out.window = static_cast<uint32_t>(ceil_div(out.in_flight_bytes, unit) + 1);
  out.optimizer_bytes = (uint64_t{out.window} + 3) * unit + 2 * out.sub_group_bytes;
  out.budget_bytes = out.staging_bytes + out.optimizer_bytes;
  // The count sized here is at least two per direction (one filling while one drains); a caller
  // may set one (strata_config.stream_buffers is 1..64), which is its choice, not a broken rule.
  STRATA_ASSERT(out.budget_bytes > 0 &&
                out.stream_buffers >= (stream_buffers != 0 ? 1 : kMinStreamBuffers));

  const std::string f = format_bytes(out.in_flight_bytes);
  out.derivation = {
      "drive: read " + rate(drive.read_bytes_per_s) + ", write " + rate(drive.write_bytes_per_s) +
          ", full speed at " + std::to_string(drive.queue_depth) + " requests of " +
          format_bytes(drive.request_bytes) + " in flight" +
          (drive.latency_s > 0
               ? " (" + std::to_string(drive.latency_s * 1e3).substr(0, 5) + " ms each)"
               : std::string()) +
          (drive.source.empty() ? std::string() : "; " + drive.source),
      "in flight per direction F = " + f + " (max of queue depth x request, rate x latency)",
      "staging = 2 directions x " + std::to_string(out.stream_buffers) + " buffers x " +
          format_bytes(out.chunk_bytes) + " = " + format_bytes(out.staging_bytes) +
          (stream_buffers != 0 ? " (buffers as set)" : " (ceil(F / chunk) buffers)"),
      "sub-group = " + format_bytes(out.sub_group_bytes) + " per state (max of the chunk and " +
          std::to_string(threads) + " optimizer threads x " +
          format_bytes(kSubGroupBytesPerThread) + ")",
      "optimizer = (" + std::to_string(out.window) + " read ahead + 3) x 3 states x " +
          format_bytes(out.sub_group_bytes) + " + 2 x " + format_bytes(out.sub_group_bytes) +
          " of pieces = " + format_bytes(out.optimizer_bytes) +
          " (read ahead = ceil(F / 3 sub-group states) + 1)",
      "pinned budget = " + format_bytes(out.staging_bytes) + " + " +
          format_bytes(out.optimizer_bytes) + " = " + format_bytes(out.budget_bytes),
  };
  return out;
}

StreamShape stream_shape_for_budget(uint64_t pinned_budget, uint32_t buffers) {
  StreamShape shape;
  shape.buffers = buffers != 0 ? buffers : kDefaultBudgetStreamBuffers;
  const uint64_t share = pinned_budget / 4 / (2 * uint64_t{shape.buffers});
  uint64_t chunk = kDefaultStreamChunkBytes;
  while (chunk > share && chunk > kMinStreamChunkBytes) chunk /= 2;
  shape.chunk_bytes = chunk <= share ? chunk : 0;
  return shape;
}

// A sixteenth of the pool per state tensor, so that the three states of the sub-group being
// updated, those of the next ones being read and those of the previous ones being written fit
// with room to spare. Capped because past tens of MiB a larger sub-group only delays the start of
// the overlap; floored so small budgets still move whole pages per request.
uint64_t sub_group_bytes_for_pool(uint64_t pinned_pool_bytes) {
  constexpr uint64_t kShare = 16, kPage = 4096;
  constexpr uint64_t kMin = uint64_t{64} << 10, kMax = uint64_t{64} << 20;
  return std::clamp(pinned_pool_bytes / kShare / kPage * kPage, kMin, kMax);
}

PinnedSplit split_pinned_budget(const PinnedSizing& automatic, uint64_t exact,
                                const PinnedSplitGiven& given, std::string_view origin) {
  if (exact == 0) {
    return {automatic.budget_bytes, automatic.staging_bytes, automatic.chunk_bytes,
            automatic.sub_group_bytes, automatic.derivation};
  }
  // As the runtime's streaming_shape() and TieredOptimizer spend a budget set exactly.
  StreamShape shape = stream_shape_for_budget(exact, given.buffers);
  if (given.chunk_bytes != 0) {
    shape.chunk_bytes = given.chunk_bytes;
    shape.buffers = given.buffers != 0 ? given.buffers : kDefaultBudgetStreamBuffers;
  }
  const uint64_t pool = exact > shape.staging_bytes() ? exact - shape.staging_bytes() : 0;
  PinnedSplit split{
      exact,
      shape.staging_bytes(),
      shape.chunk_bytes,
      given.sub_group_bytes != 0 ? given.sub_group_bytes : sub_group_bytes_for_pool(pool),
      {}};
  split.derivation = {"pinned budget = " + format_bytes(exact) + " " + std::string(origin) +
                      "; staging " + format_bytes(split.staging_bytes) +
                      (given.chunk_bytes != 0 || given.buffers != 0 ? " (as given)" : "") +
                      ", sub-groups of " + format_bytes(split.sub_group_bytes) + " per state" +
                      (given.sub_group_bytes != 0 ? " (as given)" : "")};
  return split;
}

}  // namespace strata::sched
