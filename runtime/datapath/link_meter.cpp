#include "datapath/link_meter.h"

#include "common/assert.h"

namespace strata::datapath {
namespace {

// The queue track of each link: transfers in flight, sampled at every change.
constexpr const char* kLinkQueueNames[sched::kLinkCount] = {
    "nvme read in flight", "nvme write in flight", "h2d in flight", "d2h in flight"};

bool on_drive(sched::Link link) {
  return link == sched::Link::kNvmeRead || link == sched::Link::kNvmeWrite;
}

}  // namespace

uint32_t LinkMeter::BusyClock::start(uint64_t now_us) {
  if (inflight++ == 0) busy_since_us = now_us;
  return inflight;
}

uint32_t LinkMeter::BusyClock::finish(uint64_t now_us) {
  STRATA_ASSERT(inflight > 0);
  STRATA_ASSERT(now_us >= busy_since_us);  // the time is read under the lock: it never runs back
  if (--inflight == 0) busy_us += now_us - busy_since_us;
  return inflight;
}

uint64_t LinkMeter::BusyClock::read(uint64_t now_us) const {
  return inflight > 0 ? busy_us + (now_us - busy_since_us) : busy_us;
}

uint64_t LinkMeter::now_us() const {
  if (trace_ != nullptr) return trace_->now_us();
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::steady_clock::now() - epoch_)
                                   .count());
}

void LinkMeter::started(sched::Link link) {
  const int index = static_cast<int>(link);
  uint32_t inflight;
  {
    std::lock_guard lock(busy_mutex_);
    const uint64_t now = now_us();
    inflight = link_clocks_[index].start(now);
    if (on_drive(link)) drive_clock_.start(now);
  }
  if (trace_ != nullptr) trace_->record_counter(kLinkQueueNames[index], inflight);
}

void LinkMeter::finished(sched::Link link, uint64_t bytes, uint64_t begin_us, const char* what,
                         const sched::TransferLabel* label) {
  const int index = static_cast<int>(link);
  LinkState& state = links_[index];
  uint64_t end_us;
  uint32_t inflight;
  {
    std::lock_guard lock(busy_mutex_);
    end_us = now_us();
    inflight = link_clocks_[index].finish(end_us);
    if (on_drive(link)) drive_clock_.finish(end_us);
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
  out.busy_seconds = static_cast<double>(busy_times().link_us[static_cast<int>(link)]) / 1e6;
  return out;
}

LinkMeter::BusyTimes LinkMeter::busy_times() const {
  BusyTimes out;
  std::lock_guard lock(busy_mutex_);
  const uint64_t now = now_us();
  for (int i = 0; i < sched::kLinkCount; ++i) out.link_us[i] = link_clocks_[i].read(now);
  out.drive_us = drive_clock_.read(now);
  return out;
}

}  // namespace strata::datapath
