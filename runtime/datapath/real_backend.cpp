#include "datapath/real_backend.h"

#include <algorithm>
#include <chrono>

#include "common/align.h"
#include "common/assert.h"

namespace strata::datapath {

RealBackend::RealBackend(storage::SwapStore& store, memory::PinnedArena& arena,
                         memory::Device& device, const RealBackendOptions& options)
    : store_(store), arena_(arena), device_(device), options_(options), meter_(options.trace) {
  STRATA_ASSERT(options_.max_nvme_ops > 0);
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
  h2d_ = std::make_unique<CopyLane>(device_, memory::CopyStream::kHostToDevice,
                                    sched::Link::kHostToDevice, meter_);
  d2h_ = std::make_unique<CopyLane>(device_, memory::CopyStream::kDeviceToHost,
                                    sched::Link::kDeviceToHost, meter_);
}

RealBackend::~RealBackend() {
  streamer_.reset();
  {
    std::unique_lock lock(nvme_mutex_);
    nvme_idle_.wait(lock, [&] { return free_nvme_ops_.size() == nvme_ops_.size(); });
  }
  h2d_.reset();
  d2h_.reset();
  std::lock_guard lock(buffers_mutex_);
  for (auto& [token, data] : device_buffers_) (void)device_.free(data);
  device_buffers_.clear();
  for (auto& [token, entry] : pinned_)
    pinned_recycler_.give_back(std::move(entry.buffer), entry.kind);
  pinned_.clear();
  pinned_recycler_.trim();
}

Status RealBackend::start_streaming(const StreamerOptions& options) {
  if (streamer_) return Status::error(STRATA_E_STATE, "streaming has started already");
  STRATA_ASSIGN_OR_RETURN(streamer_,
                          Streamer::create(store_, arena_, device_, *h2d_, *d2h_, meter_, options));
  return Status::ok();
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
  self->meter_.finished(link, bytes, begin_us, sched::link_word(link), &label);
  sched::post_completion(done, std::move(status));
  // Last: the destructor waits for every op to come back, and once this one has, the backend
  // (its meter) and the runtime's completion pool may be gone; found by ThreadSanitizer once
  // reads completed on the extent store's content thread rather than the engine's.
  self->return_nvme_op(op);
}

Result<RealBackend::NvmeOp*> RealBackend::start_nvme_op(sched::Link link, uint64_t bytes,
                                                        sched::Completion done) {
  STRATA_ASSIGN_OR_RETURN(NvmeOp * o, take_nvme_op());
  o->done = done;
  o->link = link;
  o->label = sched::TransferLabel::current();
  o->bytes = bytes;
  o->begin_us = meter_.now_us();
  o->io.on_complete = &RealBackend::on_nvme_done;
  o->io.context = o;
  meter_.started(link);
  return o;
}

Status RealBackend::finish_submission(NvmeOp* o, Status submitted) {
  // Refused at once: no completion will come, so the op and the link's count end here.
  if (!submitted) {
    meter_.finished(o->link, 0, o->begin_us, nullptr);
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

Status RealBackend::copy_to_device(const sched::Buffer& from_pinned, const sched::Buffer& to_device,
                                   uint64_t bytes, sched::Completion done) {
  return h2d_->copy(to_device.data, from_pinned.data, bytes, done);
}

Status RealBackend::copy_to_host(const sched::Buffer& from_device, const sched::Buffer& to_pinned,
                                 uint64_t bytes, sched::Completion done) {
  return d2h_->copy(to_pinned.data, from_device.data, bytes, done);
}

Status RealBackend::copy_range(sched::Link link, const sched::Buffer& from, uint64_t from_offset,
                               const sched::Buffer& to, uint64_t to_offset, uint64_t bytes,
                               sched::Completion done) {
  if (from_offset + bytes > from.bytes || to_offset + bytes > to.bytes) {
    return invalid_argument("copy_range: the range lies outside a buffer");
  }
  void* dst = static_cast<std::byte*>(to.data) + to_offset;
  const void* src = static_cast<const std::byte*>(from.data) + from_offset;
  if (link == sched::Link::kHostToDevice) return h2d_->copy(dst, src, bytes, done);
  if (link == sched::Link::kDeviceToHost) return d2h_->copy(dst, src, bytes, done);
  return invalid_argument("copy_range: a range copy goes between the device and pinned memory");
}

// ---- Streams ----

Status RealBackend::stream_to_device(const sched::Extent& from, const sched::Buffer& to_device,
                                     uint64_t bytes, sched::Completion done) {
  if (!streamer_) return unsupported("streamed transfers: this backend maps no staging buffers");
  return streamer_->stream_in(to_store(from), to_device.data, bytes, done);
}

Status RealBackend::stream_to_nvme(const sched::Buffer& from_device, const sched::Extent& to,
                                   uint64_t bytes, sched::Completion done) {
  if (!streamer_) return unsupported("streamed transfers: this backend maps no staging buffers");
  return streamer_->stream_out(from_device.data, to_store(to), bytes, done);
}

void RealBackend::on_release(Tier tier, const sched::Buffer& buffer, void* device_stream) {
  (void)buffer;
  if (tier != Tier::kDevice) return;
  // On CUDA a null stream is the default stream, where torch queues its work unless told
  // otherwise: it is ordered like any other (an H200 run without this copied buffers out, and
  // refilled them, before the kernels queued there had used them: docs/reliability.md, finding 38).
  if (device_stream == nullptr && device_.backend() != memory::DeviceBackend::kCuda) return;
  // Later copies out of (or into) this buffer must follow the framework's queued work on it.
  auto event = device_.create_event();
  if (!event) return;
  if (device_.record(event.value(), device_stream)) {
    (void)device_.wait(memory::CopyStream::kDeviceToHost, event.value());
    (void)device_.wait(memory::CopyStream::kHostToDevice, event.value());
  }
}

// ---- Link counters ----

sched::LinkCounters RealBackend::link_counters(sched::Link link) const {
  return meter_.counters(link);
}

}  // namespace strata::datapath
