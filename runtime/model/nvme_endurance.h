// SSD wear of NVMe offload: the bytes a job writes against the drives' rated endurance (TBW).
// Drive presets ship in runtime/model/presets/gpus.json ("nvme_drives"); docs/planner.md,
// "SSD wear".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace strata {

struct NvmeDrive {
  std::string name;  // "samsung-990-pro-2tb"
  int generation = 4;
  double capacity_tb = 0;
  double tbw_tb = 0;  // rated terabytes written (decimal TB) per drive
};

// Shipped drives, sorted by name.
const std::vector<NvmeDrive>& nvme_drive_presets();
// A shipped drive by name (case-insensitive); unknown names are STRATA_E_INVALID listing them.
Result<NvmeDrive> find_nvme_drive(std::string_view name);
// The drive an NVMe generation preset ("gen4-x4") assumes; for measured rates, the Gen4 one.
NvmeDrive default_nvme_drive(std::string_view generation_preset);

struct NvmeWear {
  uint64_t write_bytes_per_step = 0;  // the whole array
  double endurance_bytes = 0;         // drives x TBW
  double steps_to_endurance = 0;      // optimizer steps until the rated TBW is written
  std::optional<double> job_write_bytes;
  std::optional<double> job_share;  // of the rated endurance
  bool warn = false;                // job_share above the warning threshold
  // Set where the plan uses NVMe (its states' offload, or activations sent there), whether or
  // not anything reaches the drive: the wear is then reported, "nothing written" included.
  bool reported = false;
};

// RAID-0 spreads the writes evenly, so the array's endurance is drives x TBW. `job_steps` is
// unset without --tokens.
NvmeWear nvme_wear(uint64_t write_bytes_per_step, uint32_t drives, const NvmeDrive& drive,
                   std::optional<uint64_t> job_steps, double warn_fraction);

}  // namespace strata
