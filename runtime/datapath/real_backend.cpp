#include "datapath/real_backend.h"

#include <algorithm>
#include <chrono>

#include "common/align.h"
#include "common/assert.h"

namespace strata::datapath {
namespace {

constexpr telemetry::TrackId kLinkTracks[sched::kLinkCount] = {
    telemetry::kTrackNvmeRead, telemetry::kTrackNvmeWrite, telemetry::kTrackH2DCopy,
    telemetry::kTrackD2HCopy};

constexpr const char* kLinkSpanNames[sched::kLinkCount] = {"read", "write", "h2d", "d2h"};

}  // namespace

RealBackend::RealBackend(storage::SwapStore& store, memory::PinnedArena& arena,
                         memory::Device& device, const RealBackendOptions& options)
    : store_(store), arena_(arena), device_(device), options_(options) {
  STRATA_ASSERT(options_.max_nvme_ops > 0 && options_.max_copy_ops > 0);
  // Preallocated: an NVMe transfer never allocates.
  nvme_ops_.reserve(options_.max_nvme_ops);
  free_nvme_ops_.reserve(options_.max_nvme_ops);
  for (uint32_t i = 0; i < options_.max_nvme_ops; ++i) {
    auto op = std::make_unique<NvmeOp>();
    op->slot = i;
    op->backend = this;
    nvme_ops_.push_back(std::move(op));
    free_nvme_ops_.push_back(options_.max_nvme_ops - 1 - i);
  }
  h2d_.link = sched::Link::kHostToDevice;
  h2d_.stream = memory::CopyStream::kHostToDevice;
  d2h_.link = sched::Link::kDeviceToHost;
  d2h_.stream = memory::CopyStream::kDeviceToHost;
  h2d_.thread = std::thread([this] { run_lane(h2d_); });
  d2h_.thread = std::thread([this] { run_lane(d2h_); });
}

RealBackend::~RealBackend() {
  {
    std::unique_lock lock(nvme_mutex_);
    nvme_idle_.wait(lock, [&] { return free_nvme_ops_.size() == nvme_ops_.size(); });
  }
  for (CopyLane* lane : {&h2d_, &d2h_}) {
    {
      std::lock_guard lock(lane->mutex);
      stopping_.store(true);
    }
    lane->changed.notify_all();
  }
  h2d_.thread.join();
  d2h_.thread.join();
  std::lock_guard lock(buffers_mutex_);
  for (auto& [token, data] : device_buffers_) (void)device_.free(data);
  device_buffers_.clear();
  for (auto& [token, entry] : pinned_)
    pinned_recycler_.give_back(std::move(entry.buffer), entry.kind);
  pinned_.clear();
  pinned_recycler_.trim();
}

uint64_t RealBackend::now_us() const {
  // On the trace's clock when there is one, so spans line up with the rest of the trace.
  if (options_.trace != nullptr) return options_.trace->now_us();
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::steady_clock::now() - epoch_)
                                   .count());
}

// ---- Memory ----

Result<sched::Buffer> RealBackend::allocate(Tier tier, uint64_t bytes, TensorKind kind) {
  if (bytes == 0) return invalid_argument("allocate: zero bytes");
  if (tier == Tier::kPinned) {
    // The extent store moves whole aligned blocks, so the buffer covers the padded length too.
    const uint64_t padded = align_up(bytes, store_.alignment());
    STRATA_ASSIGN_OR_RETURN(auto buffer, pinned_recycler_.take(padded, kind));
    std::lock_guard lock(buffers_mutex_);
    const uint64_t token = next_token_++;
    sched::Buffer out{buffer.data(), padded, token};
    pinned_.emplace(token, PinnedEntry{std::move(buffer), kind});
    return out;
  }
  if (tier == Tier::kDevice) {
    STRATA_ASSIGN_OR_RETURN(auto data, device_.allocate(bytes));
    std::lock_guard lock(buffers_mutex_);
    const uint64_t token = next_token_++;
    device_buffers_.emplace(token, data);
    return sched::Buffer{data, bytes, token};
  }
  return invalid_argument("allocate: the NVMe tier has extents, not buffers");
}

void RealBackend::free(Tier tier, const sched::Buffer& buffer) {
  std::lock_guard lock(buffers_mutex_);
  if (tier == Tier::kPinned) {
    auto it = pinned_.find(buffer.token);
    STRATA_ASSERT(it != pinned_.end());
    pinned_recycler_.give_back(std::move(it->second.buffer), it->second.kind);
    pinned_.erase(it);
    return;
  }
  auto it = device_buffers_.find(buffer.token);
  STRATA_ASSERT(it != device_buffers_.end());
  (void)device_.free(it->second);
  device_buffers_.erase(it);
}

namespace {

// The scheduler's opaque handle and the store's are the same three numbers.
sched::Extent to_scheduler(const storage::Extent& extent) {
  return sched::Extent{extent.id, extent.offset, extent.capacity};
}
storage::Extent to_store(const sched::Extent& extent) {
  return storage::Extent{extent.token, extent.place, extent.bytes};
}

}  // namespace

Result<sched::Extent> RealBackend::allocate_extent(uint64_t bytes) {
  STRATA_ASSIGN_OR_RETURN(auto extent, store_.allocate(bytes));
  return to_scheduler(extent);
}

void RealBackend::free_extent(const sched::Extent& extent) {
  // The store refuses a handle it did not hand out or one with I/O in flight; the scheduler frees
  // only extents it holds with nothing in flight, so a refusal is a bookkeeping bug.
  const Status status = store_.free(to_store(extent));
  STRATA_ASSERT(status.is_ok());
}

int32_t RealBackend::io_index(const sched::Buffer& pinned, uint64_t bytes) const {
  std::lock_guard lock(buffers_mutex_);
  auto it = pinned_.find(pinned.token);
  return it == pinned_.end() ? -1 : it->second.buffer.io_buffer_index(0, bytes);
}

// ---- NVMe transfers ----

Result<RealBackend::NvmeOp*> RealBackend::take_nvme_op() {
  std::lock_guard lock(nvme_mutex_);
  if (free_nvme_ops_.empty()) {
    // The scheduler bounds transfers per link well below max_nvme_ops; reaching it is a bug.
    return Status::error(STRATA_E_LIMIT, "more NVMe transfers in flight than the backend holds (" +
                                             std::to_string(nvme_ops_.size()) + ")");
  }
  NvmeOp* op = nvme_ops_[free_nvme_ops_.back()].get();
  free_nvme_ops_.pop_back();
  return op;
}

void RealBackend::return_nvme_op(NvmeOp* op) {
  std::lock_guard lock(nvme_mutex_);
  free_nvme_ops_.push_back(op->slot);
  if (free_nvme_ops_.size() == nvme_ops_.size()) nvme_idle_.notify_all();
}

void RealBackend::on_nvme_done(storage::ExtentIo* io, void* context) {
  auto* op = static_cast<NvmeOp*>(context);
  RealBackend* self = op->backend;
  Status status = std::move(io->status);
  const sched::Completion done = op->done;
  const sched::Link link = op->link;
  const uint64_t bytes = status.is_ok() ? op->bytes : 0;
  const uint64_t begin_us = op->begin_us;
  const sched::TransferLabel label = op->label;
  self->return_nvme_op(op);
  self->link_finished(link, bytes, begin_us, kLinkSpanNames[static_cast<int>(link)], &label);
  sched::post_completion(done, std::move(status));
}

Result<RealBackend::NvmeOp*> RealBackend::start_nvme_op(sched::Link link, uint64_t bytes,
                                                        sched::Completion done) {
  STRATA_ASSIGN_OR_RETURN(NvmeOp * o, take_nvme_op());
  o->done = done;
  o->link = link;
  o->label = sched::TransferLabel::current();
  o->bytes = bytes;
  o->begin_us = now_us();
  o->io.on_complete = &RealBackend::on_nvme_done;
  o->io.context = o;
  link_started(link);
  return o;
}

Status RealBackend::finish_submission(NvmeOp* o, Status submitted) {
  // Refused at once: no completion will come, so the op and the link's count end here.
  if (!submitted) {
    link_finished(o->link, 0, o->begin_us, nullptr);
    return_nvme_op(o);
  }
  return submitted;
}

Status RealBackend::read(const sched::Extent& from, const sched::Buffer& to_pinned, uint64_t bytes,
                         sched::Completion done) {
  STRATA_ASSIGN_OR_RETURN(NvmeOp * o, start_nvme_op(sched::Link::kNvmeRead, bytes, done));
  return finish_submission(o, store_.read_async(to_store(from), to_pinned.data, to_pinned.bytes,
                                                &o->io, io_index(to_pinned, to_pinned.bytes)));
}

Status RealBackend::write(const sched::Buffer& from_pinned, const sched::Extent& to, uint64_t bytes,
                          sched::Completion done) {
  STRATA_ASSIGN_OR_RETURN(NvmeOp * o, start_nvme_op(sched::Link::kNvmeWrite, bytes, done));
  return finish_submission(
      o, store_.write_async(to_store(to), from_pinned.data, bytes, &o->io,
                            io_index(from_pinned, align_up(bytes, store_.alignment()))));
}

// ---- Device copies ----

Status RealBackend::start_copy(CopyLane& lane, void* dst, const void* src, uint64_t bytes,
                               sched::Completion done) {
  STRATA_ASSIGN_OR_RETURN(auto event, device_.create_event());
  STRATA_TRY(device_.copy_async(lane.stream, dst, src, bytes));
  STRATA_TRY(device_.record(event, lane.stream));
  link_started(lane.link);
  {
    std::lock_guard lock(lane.mutex);
    lane.queue.push_back(
        CopyOp{std::move(event), done, sched::TransferLabel::current(), bytes, now_us()});
    ++lane.waiting;
  }
  lane.changed.notify_one();
  return Status::ok();
}

void RealBackend::run_lane(CopyLane& lane) {
  for (;;) {
    CopyOp op;
    {
      std::unique_lock lock(lane.mutex);
      lane.changed.wait(lock, [&] { return !lane.queue.empty() || stopping_.load(); });
      if (lane.queue.empty()) return;
      op = std::move(lane.queue.front());
      lane.queue.pop_front();
    }
    // Events on one stream complete in order, so waiting on each in turn loses nothing.
    Status status = device_.synchronize(op.event);
    op.event.reset();
    link_finished(lane.link, status.is_ok() ? op.bytes : 0, op.begin_us,
                  kLinkSpanNames[static_cast<int>(lane.link)], &op.label);
    {
      std::lock_guard lock(lane.mutex);
      --lane.waiting;
    }
    sched::post_completion(op.done, std::move(status));
  }
}

Status RealBackend::copy_to_device(const sched::Buffer& from_pinned, const sched::Buffer& to_device,
                                   uint64_t bytes, sched::Completion done) {
  return start_copy(h2d_, to_device.data, from_pinned.data, bytes, done);
}

Status RealBackend::copy_to_host(const sched::Buffer& from_device, const sched::Buffer& to_pinned,
                                 uint64_t bytes, sched::Completion done) {
  return start_copy(d2h_, to_pinned.data, from_device.data, bytes, done);
}

Status RealBackend::stream_to_device(const sched::Extent&, const sched::Buffer&, uint64_t,
                                     sched::Completion) {
  return Status::error(STRATA_E_UNSUPPORTED, "streamed transfers: not yet");
}

Status RealBackend::stream_to_nvme(const sched::Buffer&, const sched::Extent&, uint64_t,
                                   sched::Completion) {
  return Status::error(STRATA_E_UNSUPPORTED, "streamed transfers: not yet");
}

void RealBackend::on_release(Tier tier, const sched::Buffer& buffer, void* device_stream) {
  (void)buffer;
  if (tier != Tier::kDevice || device_stream == nullptr) return;
  // Later copies out of (or into) this buffer must follow the framework's queued work on it.
  auto event = device_.create_event();
  if (!event) return;
  if (device_.record(event.value(), device_stream)) {
    (void)device_.wait(memory::CopyStream::kDeviceToHost, event.value());
    (void)device_.wait(memory::CopyStream::kHostToDevice, event.value());
  }
}

// ---- Link counters ----

// The queue track of each link: transfers in flight, sampled at every change.
constexpr const char* kLinkQueueNames[sched::kLinkCount] = {
    "nvme read in flight", "nvme write in flight", "h2d in flight", "d2h in flight"};

void RealBackend::link_started(sched::Link link) {
  LinkState& state = links_[static_cast<int>(link)];
  uint32_t inflight;
  {
    std::lock_guard lock(state.mutex);
    if (state.inflight++ == 0) state.busy_since_us = now_us();
    inflight = state.inflight;
  }
  if (options_.trace != nullptr) {
    options_.trace->record_counter(kLinkQueueNames[static_cast<int>(link)], inflight);
  }
}

void RealBackend::link_finished(sched::Link link, uint64_t bytes, uint64_t begin_us,
                                const char* what, const sched::TransferLabel* label) {
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
  if (options_.trace != nullptr) options_.trace->record_counter(kLinkQueueNames[index], inflight);
  if (bytes > 0) {
    state.bytes.fetch_add(bytes, std::memory_order_relaxed);
    state.transfers.fetch_add(1, std::memory_order_relaxed);
  }
  if (what != nullptr && options_.trace != nullptr) {
    // Named by the tensor it moved (kind and layer in the span's args); the link's word only for
    // a transfer the scheduler did not label.
    const bool named = label != nullptr && label->labelled();
    options_.trace->record_span(kLinkTracks[index], named ? label->name : what, begin_us, end_us,
                                static_cast<int64_t>(bytes),
                                named ? label->tensor : telemetry::SpanTensor{});
  }
}

sched::LinkCounters RealBackend::link_counters(sched::Link link) const {
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
