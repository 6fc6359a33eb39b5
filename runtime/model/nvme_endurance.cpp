#include "model/nvme_endurance.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/assert.h"
#include "model/embedded_presets.h"

namespace strata {
namespace {

using nlohmann::json;

const json& presets_json() {
  static const json root =
      json::parse(presets::kGpuPresetsJson, nullptr, /*allow_exceptions=*/false);
  STRATA_ASSERT(root.is_object() && root.contains("nvme_drives") && root.contains("nvme"));
  return root;
}

std::vector<NvmeDrive> parse_drives() {
  std::vector<NvmeDrive> drives;
  for (const auto& [name, d] : presets_json()["nvme_drives"].items()) {
    // Validated at build time and by the tests; a missing field is a packaging bug.
    STRATA_ASSERT(d.contains("generation") && d.contains("capacity_tb") && d.contains("tbw_tb"));
    drives.push_back({name, d["generation"].get<int>(), d["capacity_tb"].get<double>(),
                      d["tbw_tb"].get<double>()});
  }
  std::sort(drives.begin(), drives.end(), [](auto& a, auto& b) { return a.name < b.name; });
  return drives;
}

}  // namespace

const std::vector<NvmeDrive>& nvme_drive_presets() {
  static const std::vector<NvmeDrive> drives = parse_drives();
  return drives;
}

Result<NvmeDrive> find_nvme_drive(std::string_view name) {
  std::string key(name);
  for (char& ch : key) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  std::string list;
  for (const NvmeDrive& drive : nvme_drive_presets()) {
    if (drive.name == key) return drive;
    list += (list.empty() ? "" : ", ") + drive.name;
  }
  return invalid_argument("unknown NVMe drive \"" + std::string(name) + "\"; presets: " + list);
}

NvmeDrive default_nvme_drive(std::string_view generation_preset) {
  const json& nvme = presets_json()["nvme"];
  auto it = nvme.find(std::string(generation_preset));
  if (it == nvme.end()) it = nvme.find("gen4-x4");
  STRATA_ASSERT(it != nvme.end() && it->contains("default_drive"));
  Result<NvmeDrive> drive = find_nvme_drive((*it)["default_drive"].get<std::string>());
  STRATA_ASSERT(drive.is_ok());
  return *drive;
}

NvmeWear nvme_wear(uint64_t write_bytes_per_step, uint32_t drives, const NvmeDrive& drive,
                   std::optional<uint64_t> job_steps, double warn_fraction) {
  NvmeWear wear;
  wear.write_bytes_per_step = write_bytes_per_step;
  wear.endurance_bytes = std::max<uint32_t>(drives, 1) * drive.tbw_tb * 1e12;
  wear.steps_to_endurance = write_bytes_per_step == 0
                                ? std::numeric_limits<double>::infinity()
                                : wear.endurance_bytes / static_cast<double>(write_bytes_per_step);
  if (job_steps) {
    wear.job_write_bytes = static_cast<double>(*job_steps) * write_bytes_per_step;
    wear.job_share = *wear.job_write_bytes / wear.endurance_bytes;
    wear.warn = *wear.job_share > warn_fraction;
  }
  return wear;
}

}  // namespace strata
