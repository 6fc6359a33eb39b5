#include "pool/pool_policy.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "common/align.h"

namespace strata::bench {

using memory::PinnedTraceEvent;

const char* to_string(PoolPolicy policy) {
  switch (policy) {
    case PoolPolicy::kAdaptive:
      return "adaptive";
    case PoolPolicy::kZeroInfinity:
      return "zero-infinity";
    case PoolPolicy::kPow2:
      return "pow2";
  }
  return "?";
}

std::vector<SizeClass> derive_size_classes(std::span<const uint64_t> requests,
                                           double merge_tolerance, uint32_t max_classes) {
  std::map<uint64_t, uint64_t, std::greater<>> sizes;  // size -> requests, largest first
  for (uint64_t bytes : requests) ++sizes[bytes];

  std::vector<SizeClass> clusters;  // descending slot size while being built
  for (const auto& [bytes, count] : sizes) {
    const bool joins = !clusters.empty() && static_cast<double>(bytes) >=
                                                static_cast<double>(clusters.back().slot_bytes) *
                                                    (1.0 - merge_tolerance);
    if (!joins) clusters.push_back({bytes, 0, bytes, 0, 0});
    SizeClass& c = clusters.back();
    c.smallest_bytes = bytes;
    ++c.distinct_sizes;
    c.requests += count;
  }
  // Too many classes: merge the neighbours whose merge adds the fewest bytes (the smaller class's
  // requests then sit in the larger class's slots).
  max_classes = std::max<uint32_t>(max_classes, 1);
  while (clusters.size() > max_classes) {
    size_t best = 0;
    uint64_t best_cost = UINT64_MAX;
    for (size_t i = 0; i + 1 < clusters.size(); ++i) {
      const uint64_t cost =
          clusters[i + 1].requests * (clusters[i].slot_bytes - clusters[i + 1].slot_bytes);
      if (cost < best_cost) {
        best_cost = cost;
        best = i;
      }
    }
    SizeClass& big = clusters[best];
    const SizeClass& small = clusters[best + 1];
    big.smallest_bytes = small.smallest_bytes;
    big.distinct_sizes += small.distinct_sizes;
    big.requests += small.requests;
    clusters.erase(clusters.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  std::reverse(clusters.begin(), clusters.end());
  return clusters;
}

namespace {

// Index of the smallest class whose slot holds `bytes` (classes ascending).
size_t class_of(std::span<const SizeClass> classes, uint64_t bytes) {
  const auto it = std::lower_bound(classes.begin(), classes.end(), bytes,
                                   [](const SizeClass& c, uint64_t b) { return c.slot_bytes < b; });
  return static_cast<size_t>(it - classes.begin());
}

// The adaptive counts: the trace replayed on counts alone, placing exactly as BufferPool does
// (smallest class with a free buffer that holds the request). Whenever none is free, the
// request's own class gets one more buffer. The pool maps all its buffers up front, so a request
// may then be placed otherwise than while the counts grew: replays repeat until one needs no
// more buffers. Each adds at least one, and per-class live peaks (with which nothing ever has to
// borrow) bound them.
void count_buffers(const memory::PinnedTrace& trace, std::vector<SizeClass>& classes) {
  std::unordered_map<uint64_t, size_t> held;  // trace id -> class whose buffer it holds
  for (bool grew = true; grew;) {
    grew = false;
    std::vector<uint32_t> free_buffers(classes.size());
    for (size_t k = 0; k < classes.size(); ++k) free_buffers[k] = classes[k].count;
    held.clear();
    for (const PinnedTraceEvent& e : trace.events) {
      if (e.op == PinnedTraceEvent::Op::kGive) {
        const auto it = held.find(e.id);
        ++free_buffers[it->second];
        held.erase(it);
        continue;
      }
      const size_t own = class_of(classes, e.bytes);
      size_t k = own;
      while (k < classes.size() && free_buffers[k] == 0) ++k;
      if (k == classes.size()) {
        k = own;
        ++classes[k].count;
        ++free_buffers[k];
        grew = true;
      }
      --free_buffers[k];
      held.emplace(e.id, k);
    }
  }
}

uint32_t peak_live_requests(const memory::PinnedTrace& trace) {
  uint32_t live = 0;
  uint32_t peak = 0;
  for (const PinnedTraceEvent& e : trace.events) {
    if (e.op == PinnedTraceEvent::Op::kTake) {
      peak = std::max(peak, ++live);
    } else {
      --live;
    }
  }
  return peak;
}

}  // namespace

Result<PoolPlan> plan_for_trace(const memory::PinnedTrace& trace, PoolPolicy policy,
                                const PoolOptions& options) {
  std::vector<uint64_t> requests;
  for (const PinnedTraceEvent& e : trace.events) {
    if (e.op == PinnedTraceEvent::Op::kTake) requests.push_back(e.bytes);
  }
  if (requests.empty()) return invalid_argument("the pinned trace has no takes to size a pool for");
  if (!(options.merge_tolerance >= 0.0 && options.merge_tolerance < 1.0)) {
    return invalid_argument("merge_tolerance must be in [0, 1)");
  }
  if (options.zero_buffer_count == 0) return invalid_argument("buffer_count must be >= 1");

  PoolPlan plan;
  plan.policy = policy;
  switch (policy) {
    case PoolPolicy::kAdaptive:
      plan.classes = derive_size_classes(requests, options.merge_tolerance, options.max_classes);
      count_buffers(trace, plan.classes);
      // A class whose requests always found a larger buffer free needs none of its own.
      std::erase_if(plan.classes, [](const SizeClass& c) { return c.count == 0; });
      for (const SizeClass& c : plan.classes)
        plan.reserved_bytes += c.count * align_up(c.slot_bytes, kPageSize);
      return plan;
    case PoolPolicy::kZeroInfinity: {
      SizeClass slots;
      slots.slot_bytes = std::max(*std::max_element(requests.begin(), requests.end()),
                                  options.zero_buffer_size_bytes);
      slots.count = std::max(options.zero_buffer_count, peak_live_requests(trace));
      slots.smallest_bytes = *std::min_element(requests.begin(), requests.end());
      slots.requests = requests.size();
      plan.classes = {slots};
      plan.zero_block_bytes = slots.slot_bytes * slots.count;
      plan.reserved_bytes = align_up(plan.zero_block_bytes, kPageSize);
      return plan;
    }
    case PoolPolicy::kPow2:
      return plan;
  }
  return invalid_argument("unknown pool policy");
}

}  // namespace strata::bench
