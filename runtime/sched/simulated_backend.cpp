#include "sched/simulated_backend.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/align.h"
#include "common/assert.h"
#include "sched/tensor_registry.h"
#include "sched/training_step.h"
#include "sched/transfer_label.h"

namespace strata::sched {

// ---------------------------------------------------------------------------------------------
// DeviceModel

Status DeviceModel::validate() const {
  const double rates[] = {nvme_read_bytes_per_s,
                          nvme_write_bytes_per_s,
                          host_to_device_bytes_per_s,
                          device_to_host_bytes_per_s,
                          cpu_optimizer_params_per_s,
                          host_overflow_check_elements_per_s,
                          host_gradient_scan_elements_per_s};
  for (double rate : rates) {
    if (!(rate > 0) || !std::isfinite(rate)) {
      return invalid_argument("device model: every rate must be a finite number above 0");
    }
  }
  const double times[] = {nvme_latency_s, pcie_latency_s, forward_seconds_per_layer,
                          backward_seconds_per_layer, phase_overhead_seconds};
  for (double t : times) {
    if (!(t >= 0) || !std::isfinite(t)) {
      return invalid_argument("device model: latencies and compute times must be finite, >= 0");
    }
  }
  return Status::ok();
}

Result<DeviceModel> calibrate(const Measurements& measured, const DeviceModel& base) {
  DeviceModel model = base;
  double* rate_of[kLinkCount] = {&model.nvme_read_bytes_per_s, &model.nvme_write_bytes_per_s,
                                 &model.host_to_device_bytes_per_s,
                                 &model.device_to_host_bytes_per_s};
  for (int i = 0; i < kLinkCount; ++i) {
    const LinkCounters& c = measured.links[i];
    if (c.bytes > 0 && c.busy_seconds > 0)
      *rate_of[i] = static_cast<double>(c.bytes) / c.busy_seconds;
  }
  if (measured.forward_seconds_per_layer > 0) {
    model.forward_seconds_per_layer = measured.forward_seconds_per_layer;
  }
  if (measured.backward_seconds_per_layer > 0) {
    model.backward_seconds_per_layer = measured.backward_seconds_per_layer;
  }
  if (measured.optimizer_params > 0 && measured.optimizer_seconds > 0) {
    model.cpu_optimizer_params_per_s = measured.optimizer_params / measured.optimizer_seconds;
  }
  if (measured.phase_overhead_seconds >= 0) {
    model.phase_overhead_seconds = measured.phase_overhead_seconds;
  }
  STRATA_TRY(model.validate());
  return model;
}

Result<HalfDuplexRates> half_duplex_rates(double read, double write, double mixed_read,
                                          double mixed_write) {
  for (const double rate : {read, write, mixed_read, mixed_write}) {
    if (!(rate > 0) || !std::isfinite(rate)) {
      return invalid_argument("half_duplex_rates: every rate must be positive and finite (read " +
                              std::to_string(read) + ", write " + std::to_string(write) +
                              ", read at once " + std::to_string(mixed_read) + ", write at once " +
                              std::to_string(mixed_write) + ")");
    }
  }
  const double factor = std::min(1.0, mixed_read / read + mixed_write / write);
  return HalfDuplexRates{read * factor, write * factor, factor};
}

// ---------------------------------------------------------------------------------------------
// SimulatedBackend

SimulatedBackend::SimulatedBackend(const DeviceModel& model) : model_(model) {}

Result<Buffer> SimulatedBackend::allocate(Tier tier, uint64_t bytes, TensorKind /*kind*/) {
  if (tier == Tier::kNvme || bytes == 0) return invalid_argument("simulated allocate: bad request");
  const int t = static_cast<int>(tier);
  const uint64_t rounded = align_up(bytes, kPageSize);
  allocated_[t] += rounded;
  peak_[t] = std::max(peak_[t], allocated_[t]);
  // A fake, never dereferenced address: distinct per buffer, tagged with the tier.
  const uint64_t token = next_token_++;
  const uint64_t address = (static_cast<uint64_t>(t + 1) << 60) | (token << 12);
  void* data = reinterpret_cast<void*>(address);  // NOLINT(performance-no-int-to-ptr)
  return Buffer{data, rounded, token};
}

void SimulatedBackend::free(Tier tier, const Buffer& buffer) {
  const int t = static_cast<int>(tier);
  STRATA_ASSERT(allocated_[t] >= buffer.bytes);
  allocated_[t] -= buffer.bytes;
}

Result<Extent> SimulatedBackend::allocate_extent(uint64_t bytes) {
  if (bytes == 0) return invalid_argument("simulated allocate_extent: 0 bytes");
  const int t = static_cast<int>(Tier::kNvme);
  const uint64_t rounded = align_up(bytes, kPageSize);
  allocated_[t] += rounded;
  peak_[t] = std::max(peak_[t], allocated_[t]);
  return Extent{next_token_++, 0, rounded};
}

void SimulatedBackend::free_extent(const Extent& extent) {
  const int t = static_cast<int>(Tier::kNvme);
  STRATA_ASSERT(allocated_[t] >= extent.bytes);
  allocated_[t] -= extent.bytes;
}

uint64_t SimulatedBackend::allocated_bytes(Tier tier) const {
  return allocated_[static_cast<int>(tier)];
}

uint64_t SimulatedBackend::peak_allocated_bytes(Tier tier) const {
  return peak_[static_cast<int>(tier)];
}

Status SimulatedBackend::read(const Extent& from, const Buffer& to_pinned, uint64_t bytes,
                              Completion done) {
  if (!from.valid() || !to_pinned.valid() || bytes > from.bytes || bytes > to_pinned.bytes) {
    return invalid_argument("simulated read: bad request");
  }
  return schedule(Link::kNvmeRead, bytes, done);
}

Status SimulatedBackend::write(const Buffer& from_pinned, const Extent& to, uint64_t bytes,
                               Completion done) {
  if (!to.valid() || !from_pinned.valid() || bytes > to.bytes || bytes > from_pinned.bytes) {
    return invalid_argument("simulated write: bad request");
  }
  return schedule(Link::kNvmeWrite, bytes, done);
}

Status SimulatedBackend::copy_to_device(const Buffer& from_pinned, const Buffer& to_device,
                                        uint64_t bytes, Completion done) {
  if (!from_pinned.valid() || !to_device.valid() || bytes > from_pinned.bytes ||
      bytes > to_device.bytes) {
    return invalid_argument("simulated copy_to_device: bad request");
  }
  return schedule(Link::kHostToDevice, bytes, done);
}

Status SimulatedBackend::copy_to_host(const Buffer& from_device, const Buffer& to_pinned,
                                      uint64_t bytes, Completion done) {
  if (!from_device.valid() || !to_pinned.valid() || bytes > from_device.bytes ||
      bytes > to_pinned.bytes) {
    return invalid_argument("simulated copy_to_host: bad request");
  }
  return schedule(Link::kDeviceToHost, bytes, done);
}

Status SimulatedBackend::copy_range(Link link, const Buffer& from, uint64_t from_offset,
                                    const Buffer& to, uint64_t to_offset, uint64_t bytes,
                                    Completion done) {
  if ((link != Link::kHostToDevice && link != Link::kDeviceToHost) || !from.valid() ||
      !to.valid() || from_offset + bytes > from.bytes || to_offset + bytes > to.bytes) {
    return invalid_argument("simulated copy_range: bad request");
  }
  return schedule(link, bytes, done);
}

Status SimulatedBackend::stream_to_device(const Extent& from, const Buffer& to_device,
                                          uint64_t bytes, Completion done) {
  if (!from.valid() || !to_device.valid() || bytes > from.bytes || bytes > to_device.bytes) {
    return invalid_argument("simulated stream_to_device: bad request");
  }
  return schedule_stream(Link::kNvmeRead, Link::kHostToDevice, bytes, done);
}

Status SimulatedBackend::stream_to_nvme(const Buffer& from_device, const Extent& to, uint64_t bytes,
                                        Completion done) {
  if (!to.valid() || !from_device.valid() || bytes > to.bytes || bytes > from_device.bytes) {
    return invalid_argument("simulated stream_to_nvme: bad request");
  }
  return schedule_stream(Link::kDeviceToHost, Link::kNvmeWrite, bytes, done);
}

SimulatedBackend::Server SimulatedBackend::server_of(Link link) const {
  const int l = static_cast<int>(link);
  switch (link) {
    case Link::kNvmeRead:
    case Link::kNvmeWrite:
      // A half-duplex drive: both directions queue on one server.
      return {
          link == Link::kNvmeRead ? model_.nvme_read_bytes_per_s : model_.nvme_write_bytes_per_s,
          model_.nvme_latency_s, model_.nvme_full_duplex ? l : static_cast<int>(Link::kNvmeRead)};
    case Link::kHostToDevice:
      return {model_.host_to_device_bytes_per_s, model_.pcie_latency_s, l};
    case Link::kDeviceToHost:
      return {model_.device_to_host_bytes_per_s, model_.pcie_latency_s, l};
  }
  return {};
}

double SimulatedBackend::occupy(Link link, uint64_t bytes, double ready, double* start) {
  const Server server = server_of(link);
  *start = std::max(ready, server_free_at_[server.index]);
  server_free_at_[server.index] = *start + static_cast<double>(bytes) / server.rate;
  return server_free_at_[server.index];
}

void SimulatedBackend::count(Link link, uint64_t bytes, double start, double completion) {
  // Busy time as a real backend measures it: time with at least one transfer in flight.
  const int l = static_cast<int>(link);
  LinkCounters& c = counters_[l];
  c.busy_seconds += std::max(0.0, completion - std::max(start, busy_until_[l]));
  busy_until_[l] = std::max(busy_until_[l], completion);
  c.bytes += bytes;
  ++c.transfers;
}

void SimulatedBackend::trace_span(Link link, uint64_t bytes, double completion) const {
  if (trace_ == nullptr) return;
  // As the runtime's link meter names them: the tensor's name, else the link's word. The
  // optimizer's state sub-groups go by the runtime's names ("w.exp_avg[3]" for the inventory's
  // "w#adam_m@3"), so that a plan's trace and a run's compare name by name.
  const TransferLabel label = TransferLabel::current();
  const std::string name =
      label.labelled() ? runtime_state_name(label.name, static_cast<TensorKind>(label.tensor.kind))
                       : std::string(link_word(link));
  trace_->record_span(link_track(link), name, trace_us(now_), trace_us(completion),
                      static_cast<int64_t>(bytes),
                      label.labelled() ? label.tensor : telemetry::SpanTensor{});
}

Status SimulatedBackend::schedule(Link link, uint64_t bytes, Completion done) {
  double start = 0;
  const double completion = occupy(link, bytes, now_, &start) + server_of(link).latency;
  count(link, bytes, start, completion);
  trace_span(link, bytes, completion);
  events_.push(Event{completion, sequence_++, done});
  return Status::ok();
}

Status SimulatedBackend::schedule_stream(Link first, Link second, uint64_t bytes, Completion done) {
  const Server in = server_of(first), out = server_of(second);
  const double chunk = std::min(static_cast<double>(bytes), model_.stream_chunk_bytes);
  double first_start = 0, second_start = 0;
  const double first_done = occupy(first, bytes, now_, &first_start);
  // The second leg starts once the first chunk is through the first, and cannot finish before
  // the last chunk is through the first and then through the second.
  const double second_ready = first_start + chunk / in.rate + in.latency;
  double second_done = occupy(second, bytes, second_ready, &second_start);
  second_done = std::max(second_done, first_done + in.latency + chunk / out.rate);
  server_free_at_[out.index] = std::max(server_free_at_[out.index], second_done);
  const double completion = second_done + out.latency;
  count(first, bytes, first_start, first_done + in.latency);
  count(second, bytes, second_start, completion);
  trace_span(first, bytes, first_done + in.latency);
  trace_span(second, bytes, completion);
  events_.push(Event{completion, sequence_++, done});
  return Status::ok();
}

void SimulatedBackend::deliver(const Event& event) {
  STRATA_ASSERT(event.time >= now_);
  now_ = event.time;
  post_completion(event.done, Status::ok());
  io_.restart();
  io_.poll();
}

bool SimulatedBackend::deliver_next() {
  if (events_.empty()) return false;
  const Event event = events_.top();
  events_.pop();
  deliver(event);
  return true;
}

bool SimulatedBackend::deliver_next_before(double time) {
  if (events_.empty() || events_.top().time > time) return false;
  return deliver_next();
}

void SimulatedBackend::run_until(double time) {
  while (deliver_next_before(time)) {
  }
  now_ = std::max(now_, time);
}

}  // namespace strata::sched
