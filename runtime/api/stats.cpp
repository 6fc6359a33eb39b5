#include "api/stats.h"

#include <algorithm>

#include "api/runtime.h"
#include "memory/host_memory.h"

namespace strata::api {
namespace {

void fill_in_use(const sched::TierUsage& usage, strata_tier_stats* out) {
  out->in_use_bytes = usage.in_use_bytes;
  out->peak_in_use_bytes = usage.peak_in_use_bytes;
  static_assert(kTensorKindCount <= STRATA_STATS_KIND_SLOTS);
  for (int k = 0; k < kTensorKindCount; ++k) {
    out->kinds[k].in_use_bytes = usage.kind_in_use_bytes[k];
    out->kinds[k].peak_in_use_bytes = usage.kind_peak_in_use_bytes[k];
  }
}

}  // namespace

strata_stats collect_stats(Runtime& runtime) {
  strata_stats s{};
  s.struct_size = sizeof s;

  const sched::Scheduler::Usage usage = runtime.scheduler().usage();
  fill_in_use(usage.pinned, &s.pinned);
  fill_in_use(usage.device, &s.device);
  fill_in_use(usage.nvme, &s.nvme);

  const memory::PinnedArenaStats arena = runtime.pinned_arena().stats();
  s.pinned.reserved_bytes = arena.reserved_bytes;
  s.pinned.peak_reserved_bytes = arena.peak_reserved_bytes;
  const memory::Device& device = runtime.device();
  s.device.reserved_bytes = device.budget_bytes();  // the slab, held from open to close
  s.device.peak_reserved_bytes = device.budget_bytes();
  storage::SwapStore& store = runtime.store();
  s.nvme.reserved_bytes = store.capacity();
  s.nvme.peak_reserved_bytes = store.capacity();
  const storage::ExtentStoreStats io = store.stats();
  s.nvme_bytes_read = io.bytes_read;
  s.nvme_bytes_written = io.bytes_written;

  memory::HostMemorySampler& sampler = runtime.sampler();
  sampler.sample_now();
  if (Result<memory::ProcMemory> proc = memory::read_proc_memory(); proc.is_ok()) {
    s.os_rss_bytes = proc->vm_rss;
    s.os_peak_rss_bytes = proc->vm_hwm;
    s.os_host_bytes_excluding_emulated_device = memory::host_bytes_excluding(*proc, &device);
  }
  s.os_peak_host_bytes_excluding_emulated_device = std::max(
      sampler.peak_host_bytes_excluding_device(), s.os_host_bytes_excluding_emulated_device);
  s.emulated_device_resident_bytes = device.host_resident_bytes();
  s.pinned_budget_bytes = runtime.config().pinned_budget_bytes;
  const sched::SchedulerStats scheduled = runtime.scheduler().stats();
  for (int k = 0; k < kTensorKindCount; ++k) {
    s.nvme_bytes_read_by_kind[k] = scheduled.nvme_read_by_kind[k];
    s.nvme_bytes_written_by_kind[k] = scheduled.nvme_written_by_kind[k];
  }
  const StreamingShape streaming = streaming_shape(runtime.config());
  s.pinned_staging_bytes = streaming.staging_bytes();
  s.stream_chunk_bytes = streaming.chunk_bytes;
  s.stream_buffers = streaming.on() ? streaming.buffers : 0;
  s.optimizer_sub_group_bytes = runtime.optimizer_sub_group_bytes();
  const datapath::LinkMeter::BusyTimes busy = runtime.backend().busy_times();
  s.nvme_read_busy_us = busy.link_us[static_cast<int>(sched::Link::kNvmeRead)];
  s.nvme_write_busy_us = busy.link_us[static_cast<int>(sched::Link::kNvmeWrite)];
  s.nvme_busy_us = busy.drive_us;
  const datapath::RealBackend& backend = runtime.backend();
  s.host_to_device_bytes = backend.link_counters(sched::Link::kHostToDevice).bytes;
  s.device_to_host_bytes = backend.link_counters(sched::Link::kDeviceToHost).bytes;
  s.host_to_device_busy_us = busy.link_us[static_cast<int>(sched::Link::kHostToDevice)];
  s.device_to_host_busy_us = busy.link_us[static_cast<int>(sched::Link::kDeviceToHost)];
  return s;
}

}  // namespace strata::api
