#include "datapath/link_meter.h"

#include "common/assert.h"

namespace strata::datapath {
namespace {

// The queue track of each link: transfers in flight, sampled at every change.
constexpr const char* kLinkQueueNames[sched::kLinkCount] = {
    "nvme read in flight", "nvme write in flight", "h2d in flight", "d2h in flight"};

}  // namespace

uint64_t LinkMeter::now_us() const {
  if (trace_ != nullptr) return trace_->now_us();
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::steady_clock::now() - epoch_)
                                   .count());
}

void LinkMeter::started(sched::Link link) {
  LinkState& state = links_[static_cast<int>(link)];
  uint32_t inflight;
  {
    std::lock_guard lock(state.mutex);
    if (state.inflight++ == 0) state.busy_since_us = now_us();
    inflight = state.inflight;
  }
  if (trace_ != nullptr) trace_->record_counter(kLinkQueueNames[static_cast<int>(link)], inflight);
}

void LinkMeter::finished(sched::Link link, uint64_t bytes, uint64_t begin_us, const char* what,
                         const sched::TransferLabel* label) {
  const int index = static_cast<int>(link);
  LinkState& state = links_[index];
  const uint64_t end_us = now_us();
  uint32_t inflight;
  {
    std::lock_guard lock(state.mutex);
    STRATA_ASSERT(state.inflight > 0);
    if (--state.inflight == 0) state.busy_us += end_us - state.busy_since_us;
    inflight = state.inflight;
  }
  if (trace_ != nullptr) trace_->record_counter(kLinkQueueNames[index], inflight);
  if (bytes > 0) {
    state.bytes.fetch_add(bytes, std::memory_order_relaxed);
    state.transfers.fetch_add(1, std::memory_order_relaxed);
  }
  if (what != nullptr && trace_ != nullptr) {
    // Named by the tensor it moved (kind and layer in the span's args); the link's word only for
    // a transfer the scheduler did not label.
    const bool named = label != nullptr && label->labelled();
    trace_->record_span(sched::link_track(link), named ? label->name : what, begin_us, end_us,
                        static_cast<int64_t>(bytes),
                        named ? label->tensor : telemetry::SpanTensor{});
  }
}

sched::LinkCounters LinkMeter::counters(sched::Link link) const {
  const LinkState& state = links_[static_cast<int>(link)];
  sched::LinkCounters out;
  out.bytes = state.bytes.load(std::memory_order_relaxed);
  out.transfers = state.transfers.load(std::memory_order_relaxed);
  std::lock_guard lock(state.mutex);
  uint64_t busy = state.busy_us;
  if (state.inflight > 0) busy += now_us() - state.busy_since_us;
  out.busy_seconds = static_cast<double>(busy) / 1e6;
  return out;
}

}  // namespace strata::datapath
