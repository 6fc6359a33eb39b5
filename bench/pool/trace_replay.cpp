#include "pool/trace_replay.h"

#include <algorithm>
#include <chrono>
#include <unordered_map>
#include <vector>

#include "common/align.h"
#include "memory/pinned_arena.h"
#include "memory/pinned_recycler.h"
#include "pool/buffer_pool.h"

namespace strata::bench {
namespace {

using memory::PinnedTraceEvent;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kUnlimited = uint64_t{1} << 50;

// For each event, the dense index of the buffer it takes or gives: replays keep handles in a
// vector, so that no lookup is timed with the allocator.
std::vector<uint32_t> buffer_indices(const memory::PinnedTrace& trace, uint32_t* count) {
  std::vector<uint32_t> out(trace.events.size());
  std::unordered_map<uint64_t, uint32_t> live;
  uint32_t next = 0;
  for (size_t i = 0; i < trace.events.size(); ++i) {
    const PinnedTraceEvent& e = trace.events[i];
    if (e.op == PinnedTraceEvent::Op::kTake) {
      out[i] = next;
      live[e.id] = next++;
    } else {
      out[i] = live.at(e.id);  // read_pinned_trace checked that every give names a live take
      live.erase(e.id);
    }
  }
  *count = next;
  return out;
}

double elapsed_ns(Clock::time_point start, Clock::time_point end) {
  return static_cast<double>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count());
}

// The cost of reading the clock twice, taken off every timed call.
double clock_overhead_ns() {
  std::vector<int64_t> samples(2001);
  for (int64_t& s : samples) {
    const auto a = Clock::now();
    const auto b = Clock::now();
    s = std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
  }
  std::nth_element(samples.begin(), samples.begin() + 1000, samples.end());
  return static_cast<double>(samples[1000]);
}

Result<std::unique_ptr<memory::PinnedArena>> dry_arena(uint64_t budget_bytes) {
  memory::PinnedArenaOptions options;
  options.budget_bytes = budget_bytes == 0 ? kUnlimited : budget_bytes;
  options.lock_pages = false;
  options.bind_numa = false;
  return memory::PinnedArena::create(options);
}

// Replays the trace options.passes times through `allocator`, which has
//   Result<Handle> take(const PinnedTraceEvent&)  (an invalid Handle: no free buffer)
//   void give(Handle&, const PinnedTraceEvent&)
//   uint64_t mapped() const, mapped_bytes() const  (arena allocations so far, their bytes)
template <typename Handle, typename Allocator>
Result<ReplayResult> replay(const memory::PinnedTrace& trace, const ReplayOptions& options,
                            Allocator& allocator) {
  if (options.passes < 2) return invalid_argument("a replay needs at least 2 passes");
  uint32_t buffers = 0;
  const std::vector<uint32_t> index = buffer_indices(trace, &buffers);
  std::vector<Handle> held(buffers);
  const double overhead = clock_overhead_ns();
  ReplayResult r;
  double take_ns = 0;
  double give_ns = 0;
  uint64_t takes = 0;
  uint64_t gives = 0;
  for (uint32_t pass = 0; pass < options.passes; ++pass) {
    double pass_take_ns = 0;
    uint64_t pass_takes = 0;
    for (size_t i = 0; i < trace.events.size(); ++i) {
      const PinnedTraceEvent& e = trace.events[i];
      Handle& handle = held[index[i]];
      if (e.op == PinnedTraceEvent::Op::kTake) {
        const auto start = Clock::now();
        Result<Handle> taken = allocator.take(e);
        const auto end = Clock::now();
        if (!taken.is_ok()) return std::move(taken).take_status();
        if (!taken->valid()) {
          ++r.waits;  // served nothing: the matching give finds an empty handle
          continue;
        }
        handle = std::move(taken).value();
        pass_take_ns += elapsed_ns(start, end) - overhead;
        ++pass_takes;
      } else if (handle.valid()) {
        const auto start = Clock::now();
        allocator.give(handle, e);
        const auto end = Clock::now();
        if (pass > 0) {
          give_ns += elapsed_ns(start, end) - overhead;
          ++gives;
        }
      }
    }
    // A trace cut short (a killed run) leaves buffers live: give them back untimed.
    for (size_t i = 0; i < trace.events.size(); ++i) {
      const PinnedTraceEvent& e = trace.events[i];
      if (e.op == PinnedTraceEvent::Op::kTake && held[index[i]].valid()) {
        allocator.give(held[index[i]], e);
      }
    }
    if (pass == 0) {
      r.mapped_first_pass = allocator.mapped();
      r.mapped_bytes_first_pass = allocator.mapped_bytes();
      r.first_pass_take_ns = pass_takes > 0 ? pass_take_ns / static_cast<double>(pass_takes) : 0;
    } else {
      take_ns += pass_take_ns;
      takes += pass_takes;
    }
  }
  const auto later = static_cast<double>(options.passes - 1);
  r.mapped_per_later_pass = static_cast<double>(allocator.mapped() - r.mapped_first_pass) / later;
  r.mapped_bytes_per_later_pass =
      static_cast<double>(allocator.mapped_bytes() - r.mapped_bytes_first_pass) / later;
  r.take_ns = takes > 0 ? take_ns / static_cast<double>(takes) : 0;
  r.give_ns = gives > 0 ? give_ns / static_cast<double>(gives) : 0;
  return r;
}

struct RecyclerAllocator {
  memory::PinnedRecycler& recycler;
  Result<memory::PinnedBuffer> take(const PinnedTraceEvent& e) {
    return recycler.take(e.bytes, e.kind);
  }
  void give(memory::PinnedBuffer& buffer, const PinnedTraceEvent& e) {
    recycler.give_back(std::move(buffer), e.kind);
    buffer = memory::PinnedBuffer();
  }
  uint64_t mapped() const {
    const memory::PinnedRecyclerStats stats = recycler.stats();
    return stats.taken - stats.reused;
  }
  uint64_t mapped_bytes() const { return recycler.stats().mapped_bytes; }
};

struct PoolAllocator {
  BufferPool& pool;
  Result<PoolBuffer> take(const PinnedTraceEvent& e) { return pool.try_acquire(e.bytes); }
  static void give(PoolBuffer& buffer, const PinnedTraceEvent&) { buffer.reset(); }
  // One arena allocation per buffer (zero-infinity: its one block).
  uint64_t mapped() const {
    return pool.plan().policy == PoolPolicy::kZeroInfinity ? 1 : pool.stats().buffers;
  }
  uint64_t mapped_bytes() const { return pool.stats().reserved_bytes; }
};

}  // namespace

TraceDemand trace_demand(const memory::PinnedTrace& trace) {
  TraceDemand d;
  uint32_t buffers = 0;
  const std::vector<uint32_t> index = buffer_indices(trace, &buffers);
  std::vector<uint64_t> asked(buffers, 0);
  uint32_t live = 0;
  uint64_t requested = 0;
  uint64_t pages = 0;
  double reused_ns = 0;
  double mapped_ns = 0;
  for (size_t i = 0; i < trace.events.size(); ++i) {
    const PinnedTraceEvent& e = trace.events[i];
    if (e.op == PinnedTraceEvent::Op::kTake) {
      asked[index[i]] = e.bytes;
      ++d.takes;
      ++live;
      requested += e.bytes;
      pages += align_up(e.bytes, kPageSize);
      if (e.reused) {
        ++d.reused_in_run;
        reused_ns += static_cast<double>(e.ns);
      } else {
        mapped_ns += static_cast<double>(e.ns);
        d.mapped_bytes_in_run += e.reserved;
      }
    } else {
      --live;
      requested -= asked[index[i]];
      pages -= align_up(asked[index[i]], kPageSize);
    }
    d.peak_live = std::max(d.peak_live, live);
    d.peak_requested_bytes = std::max(d.peak_requested_bytes, requested);
    d.peak_page_bytes = std::max(d.peak_page_bytes, pages);
  }
  const uint64_t mapped = d.takes - d.reused_in_run;
  if (d.reused_in_run > 0)
    d.reused_take_ns_in_run = reused_ns / static_cast<double>(d.reused_in_run);
  if (mapped > 0) d.mapped_take_ns_in_run = mapped_ns / static_cast<double>(mapped);
  d.mapped_ns_in_run = mapped_ns;
  return d;
}

Result<ReplayResult> replay_through_recycler(const memory::PinnedTrace& trace,
                                             uint64_t budget_bytes, const ReplayOptions& options) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<memory::PinnedArena> arena, dry_arena(budget_bytes));
  memory::PinnedRecycler recycler(*arena, nullptr);
  RecyclerAllocator allocator{recycler};
  Result<ReplayResult> r = replay<memory::PinnedBuffer>(trace, options, allocator);
  if (!r.is_ok()) return r;
  recycler.trim();
  r->peak_reserved_bytes = (arena)->stats().peak_reserved_bytes;
  return r;
}

Result<ReplayResult> replay_through_pool(const memory::PinnedTrace& trace, const PoolPlan& plan,
                                         const ReplayOptions& options) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<memory::PinnedArena> arena, dry_arena(0));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<BufferPool> pool, BufferPool::create(*arena, plan));
  PoolAllocator allocator{*pool};
  Result<ReplayResult> r = replay<PoolBuffer>(trace, options, allocator);
  if (!r.is_ok()) return r;
  r->peak_reserved_bytes = (arena)->stats().peak_reserved_bytes;
  return r;
}

}  // namespace strata::bench
