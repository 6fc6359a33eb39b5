#include "memory/pool_policy.h"

#include <algorithm>
#include <map>

#include "common/align.h"
#include "common/units.h"

namespace strata::memory {

const char* to_string(PoolPolicy policy) {
  switch (policy) {
    case PoolPolicy::kStrata:
      return "strata";
    case PoolPolicy::kZeroInfinity:
      return "zero-infinity";
    case PoolPolicy::kPow2:
      return "pow2";
  }
  return "?";
}

std::optional<PoolPolicy> parse_pool_policy(std::string_view name) {
  for (PoolPolicy p : {PoolPolicy::kStrata, PoolPolicy::kZeroInfinity, PoolPolicy::kPow2}) {
    if (name == to_string(p)) return p;
  }
  return std::nullopt;
}

std::vector<SizeClass> derive_size_classes(std::span<const StagedTensor> tensors,
                                           double merge_tolerance, uint32_t max_classes) {
  std::map<uint64_t, uint32_t, std::greater<>> sizes;  // size -> tensors, largest first
  for (const StagedTensor& t : tensors) ++sizes[t.bytes];

  std::vector<SizeClass> clusters;  // descending slot size while being built
  for (const auto& [bytes, count] : sizes) {
    const bool joins = !clusters.empty() && static_cast<double>(bytes) >=
                                                static_cast<double>(clusters.back().slot_bytes) *
                                                    (1.0 - merge_tolerance);
    if (!joins) clusters.push_back({bytes, 0, bytes, 0, 0});
    SizeClass& c = clusters.back();
    c.smallest_bytes = bytes;
    ++c.distinct_sizes;
    c.tensors += count;
  }
  // Too many classes: merge the neighbours whose merge adds the fewest bytes (the smaller class's
  // tensors then sit in the larger class's slots).
  max_classes = std::max<uint32_t>(max_classes, 1);
  while (clusters.size() > max_classes) {
    size_t best = 0;
    uint64_t best_cost = UINT64_MAX;
    for (size_t i = 0; i + 1 < clusters.size(); ++i) {
      const uint64_t cost =
          uint64_t{clusters[i + 1].tensors} * (clusters[i].slot_bytes - clusters[i + 1].slot_bytes);
      if (cost < best_cost) {
        best_cost = cost;
        best = i;
      }
    }
    SizeClass& big = clusters[best];
    const SizeClass& small = clusters[best + 1];
    big.smallest_bytes = small.smallest_bytes;
    big.distinct_sizes += small.distinct_sizes;
    big.tensors += small.tensors;
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

// Hall's rule (see pool_policy.h): the fewest buffers per class with which every window can be
// staged at once when tensors may use larger classes' buffers.
void count_buffers(std::span<const StagedTensor> tensors, std::span<const Window> windows,
                   std::vector<SizeClass>& classes) {
  const size_t n = classes.size();
  std::vector<uint32_t> demand(n, 0);  // demand[k]: most tensors of classes >= k in a window
  std::vector<uint32_t> per_class(n);
  for (const Window& w : windows) {
    std::fill(per_class.begin(), per_class.end(), 0);
    for (uint32_t i : w.tensors) ++per_class[class_of(classes, tensors[i].bytes)];
    uint32_t cumulative = 0;
    for (size_t k = n; k-- > 0;) {
      cumulative += per_class[k];
      demand[k] = std::max(demand[k], cumulative);
    }
  }
  for (size_t k = 0; k < n; ++k) {
    classes[k].count = demand[k] - (k + 1 < n ? demand[k + 1] : 0);
  }
}

// Replays the windows on buffer counts alone, exactly as replay_step drives a BufferPool: on
// each window, release what left it; retry the tensors still waiting for a buffer, then try the
// new ones, in window order, each from the smallest class with a free buffer that holds it.
// Reports the first tensor that is missing when its visit runs (or, with `no_waiting`, that has
// to wait at all): its own class, and how far the step got before it (for comparing remedies).
struct Blocked {
  int own_class = -1;     // -1: the step runs through
  uint64_t progress = 0;  // acquisitions that succeeded before the block
};

Blocked first_blocked(std::span<const StagedTensor> tensors, std::span<const Window> windows,
                      std::span<const SizeClass> classes, bool no_waiting) {
  uint64_t progress = 0;
  std::vector<int64_t> free_buffers(classes.size());
  for (size_t k = 0; k < classes.size(); ++k) free_buffers[k] = classes[k].count;
  std::vector<int> held(tensors.size(), -1);  // class whose buffer the tensor holds
  std::vector<uint8_t> wanted(tensors.size(), 0);
  std::vector<uint8_t> waiting_flag(tensors.size(), 0);
  std::vector<uint32_t> waiting;
  std::vector<uint32_t> still;
  auto own_class = [&](uint32_t i) {
    return static_cast<int>(class_of(classes, tensors[i].bytes));
  };
  for (const Window& w : windows) {
    std::fill(wanted.begin(), wanted.end(), 0);
    for (uint32_t i : w.tensors) wanted[i] = 1;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!wanted[i] && held[i] >= 0) {
        ++free_buffers[static_cast<size_t>(held[i])];
        held[i] = -1;
      }
    }
    std::erase_if(waiting, [&](uint32_t i) {
      if (wanted[i]) return false;
      waiting_flag[i] = 0;
      return true;
    });
    for (uint32_t i : w.tensors) {
      if (held[i] >= 0 || waiting_flag[i]) continue;
      waiting_flag[i] = 1;
      waiting.push_back(i);
    }
    still.clear();
    for (uint32_t i : waiting) {
      size_t k = static_cast<size_t>(own_class(i));
      while (k < classes.size() && free_buffers[k] == 0) ++k;
      if (k == classes.size()) {
        if (no_waiting) return {own_class(i), progress};
        still.push_back(i);
        continue;
      }
      ++progress;
      --free_buffers[k];
      held[i] = static_cast<int>(k);
      waiting_flag[i] = 0;
    }
    waiting.swap(still);
    for (uint32_t n = 0; n < w.first_visit_tensors; ++n) {
      if (held[w.tensors[n]] < 0) return {own_class(w.tensors[n]), progress};
    }
  }
  return {-1, progress};
}

// Adds buffers until the step runs through (see plan_pool). Each round adds one buffer to the
// cheapest class that gets the step further: not always the blocked tensor's own class - one
// more of the class whose tensors borrow the blocked tensor's buffer can be cheaper. The blocked
// tensor's own class always gets further, and per-class peaks end the loop.
void add_buffers_until_no_block(std::span<const StagedTensor> tensors,
                                std::span<const Window> windows, std::vector<SizeClass>& classes,
                                bool no_waiting) {
  for (Blocked blocked = first_blocked(tensors, windows, classes, no_waiting);
       blocked.own_class >= 0;) {
    size_t best = static_cast<size_t>(blocked.own_class);
    Blocked best_result{};
    bool found = false;
    for (size_t k = 0; k < classes.size(); ++k) {
      ++classes[k].count;
      const Blocked trial = first_blocked(tensors, windows, classes, no_waiting);
      --classes[k].count;
      const bool further = trial.own_class < 0 || trial.progress > blocked.progress;
      if (further && (!found || classes[k].slot_bytes < classes[best].slot_bytes)) {
        best = k;
        best_result = trial;
        found = true;
      }
    }
    ++classes[best].count;
    blocked = found ? best_result : first_blocked(tensors, windows, classes, no_waiting);
  }
}

uint64_t reserved_for(std::span<const SizeClass> classes) {
  uint64_t bytes = 0;
  for (const SizeClass& c : classes) bytes += c.count * align_up(c.slot_bytes, kPageSize);
  return bytes;
}

Status over_budget(const PoolPlan& plan, uint64_t budget, const std::string& what) {
  return Status::error(STRATA_E_PINNED_BUDGET,
                       std::string(to_string(plan.policy)) + " pool needs " +
                           format_bytes(plan.reserved_bytes) + " (" +
                           std::to_string(plan.reserved_bytes) + " B) of pinned memory " + what +
                           ", but only " + format_bytes(budget) + " (" + std::to_string(budget) +
                           " B) are available; raise pinned_budget_bytes");
}

}  // namespace

Result<PoolPlan> plan_pool(std::span<const StagedTensor> tensors, const PoolOptions& options,
                           uint64_t budget_bytes) {
  if (tensors.empty()) return invalid_argument("a buffer pool needs at least one tensor to stage");
  if (options.lookahead == 0) return invalid_argument("the pool's lookahead must be >= 1");
  if (!(options.merge_tolerance >= 0.0 && options.merge_tolerance < 1.0)) {
    return invalid_argument("merge_tolerance must be in [0, 1)");
  }

  PoolPlan plan;
  plan.policy = options.policy;
  switch (options.policy) {
    case PoolPolicy::kStrata: {
      const std::vector<SizeClass> classes =
          derive_size_classes(tensors, options.merge_tolerance, options.max_classes);
      // The longest lookahead (up to the asked one) whose buffers fit the budget.
      for (uint32_t lookahead = options.lookahead; lookahead >= 1; --lookahead) {
        const std::vector<Window> windows = staging_windows(tensors, lookahead);
        plan.lookahead = lookahead;
        plan.classes = classes;
        count_buffers(tensors, windows, plan.classes);
        // Hall's counts suffice when tensors are placed knowing the whole window; acquired one by
        // one, a small tensor may sit in a larger buffer that a larger tensor needs later. Add a
        // buffer to the class of a tensor that would be missing when its visit runs (or that
        // would wait at all, with no_waiting) until none is. Per-class peaks, with which nothing
        // ever borrows or waits, bound the loop.
        add_buffers_until_no_block(tensors, windows, plan.classes, options.no_waiting);
        // A class that never needs its own buffer (its tensors always find a larger one free)
        // is dropped.
        std::erase_if(plan.classes, [](const SizeClass& c) { return c.count == 0; });
        plan.requested_bytes = peak_window_bytes(tensors, windows);
        plan.peak_tensors = peak_window_tensors(windows);
        plan.reserved_bytes = reserved_for(plan.classes);
        if (budget_bytes == 0 || plan.reserved_bytes <= budget_bytes) return plan;
      }
      return over_budget(plan, budget_bytes, "to stage even one visit at a time");
    }
    case PoolPolicy::kZeroInfinity: {
      const std::vector<Window> windows = staging_windows(tensors, options.lookahead);
      plan.lookahead = options.lookahead;
      plan.requested_bytes = peak_window_bytes(tensors, windows);
      plan.peak_tensors = peak_window_tensors(windows);
      uint64_t largest = 0;
      uint32_t element_size = 1;
      for (const StagedTensor& t : tensors) {
        largest = std::max(largest, t.bytes);
        element_size = std::max(element_size, t.element_size);
      }
      SizeClass slots;
      slots.slot_bytes = std::max(largest, options.zero_buffer_size_elements * element_size);
      slots.count = std::max(options.zero_buffer_count, plan.peak_tensors);
      slots.smallest_bytes = largest;
      for (const StagedTensor& t : tensors)
        slots.smallest_bytes = std::min(slots.smallest_bytes, t.bytes);
      slots.tensors = static_cast<uint32_t>(tensors.size());
      plan.classes = {slots};
      const uint64_t block = slots.slot_bytes * slots.count;
      plan.zero_block_bytes = options.zero_pow2_block ? next_power_of_two(block) : block;
      plan.reserved_bytes = align_up(plan.zero_block_bytes, kPageSize);
      if (budget_bytes != 0 && plan.reserved_bytes > budget_bytes) {
        return over_budget(
            plan, budget_bytes,
            "for " + std::to_string(slots.count) + " slots of " + format_bytes(slots.slot_bytes));
      }
      return plan;
    }
    case PoolPolicy::kPow2: {
      const std::vector<Window> windows = staging_windows(tensors, options.lookahead);
      plan.lookahead = options.lookahead;
      plan.requested_bytes = peak_window_bytes(tensors, windows);
      plan.peak_tensors = peak_window_tensors(windows);
      return plan;
    }
  }
  return invalid_argument("unknown pool policy");
}

}  // namespace strata::memory
