// GPU and NVMe presets Strata ships (runtime/model/presets/gpus.json, compiled in): datasheet
// rates and rental prices the planner costs a job with.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace strata {

struct PriceRange {
  double low = 0;      // USD per GPU-hour: marketplace / long-tail providers
  double typical = 0;  // USD per GPU-hour
  double high = 0;     // USD per GPU-hour: hyperscaler on-demand
};

struct GpuPreset {
  std::string name;  // "h100-sxm"
  // What the driver reports (nvidia-smi memory.total), not the datasheet's rounded GB: an L40S
  // sold as 48 GB has 46,068 MiB, an H100 80 GB 81,559 MiB.
  double memory_mib = 0;
  double mem_bw_gbps = 0;        // device memory, GB/s
  double bf16_dense_tflops = 0;  // also the fp16 rate on every shipped GPU
  double tf32_dense_tflops = 0;  // fp32 training with TF32 matmuls
  int pcie_gen = 0;
  double host_link_gbps = 0;    // theoretical PCIe x16 per direction, GB/s
  double pinned_copy_gbps = 0;  // measured pinned host<->device per direction, GB/s
  double nvlink_gbps = 0;
  PriceRange price_usd_per_hour;

  uint64_t memory_bytes() const { return static_cast<uint64_t>(memory_mib) << 20; }
};

// An array of a generation's drives in RAID-0 as someone measured it.
struct NvmeArrayPoint {
  uint32_t drives = 0;
  double read_gbps = 0;
  double write_gbps = 0;
};

struct NvmePreset {
  std::string name;                             // "gen4-x4"
  double read_gbps = 0;                         // one drive, sustained
  double write_gbps = 0;                        // one drive, sustained
  std::vector<NvmeArrayPoint> measured_arrays;  // by drives, ascending

  // The rates of `drives` of them in RAID-0: one drive's, or a measured array's, in between
  // linear in the count between the nearest two, past the largest the last measured stretch's
  // gain per drive continued. Arrays measured reach 29-52% of their drives' summed rates
  // (DeepNVMe), so N x one drive would overstate them.
  NvmeArrayPoint array(uint32_t drives) const;
};

// All shipped GPU presets, sorted by name.
const std::vector<GpuPreset>& gpu_presets();
// A shipped GPU by name (case-insensitive); unknown names are STRATA_E_INVALID listing them.
Result<GpuPreset> find_gpu(std::string_view name);

// Per-drive NVMe rates: "gen4" / "gen5" (or the full "gen4-x4" key).
const std::vector<NvmePreset>& nvme_presets();
Result<NvmePreset> find_nvme(std::string_view name);

}  // namespace strata
