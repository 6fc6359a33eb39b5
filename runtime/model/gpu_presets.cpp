#include "model/gpu_presets.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "common/assert.h"
#include "model/embedded_presets.h"

namespace strata {
namespace {

using nlohmann::json;

struct Presets {
  std::vector<GpuPreset> gpus;
  std::vector<NvmePreset> nvme;
};

double number(const json& j, const char* key) {
  // The embedded file was validated at build time and by the tests; a missing field here is a
  // packaging bug, not user input.
  auto it = j.find(key);
  STRATA_ASSERT(it != j.end() && it->is_number());
  return it->get<double>();
}

Presets parse_presets() {
  Presets p;
  const json root = json::parse(presets::kGpuPresetsJson, nullptr, /*allow_exceptions=*/false);
  STRATA_ASSERT(root.is_object() && root.contains("gpus") && root.contains("nvme"));
  for (const auto& [name, g] : root["gpus"].items()) {
    GpuPreset gpu;
    gpu.name = name;
    gpu.memory_mib = number(g, "memory_mib");
    gpu.mem_bw_gbps = number(g, "mem_bw_gbps");
    gpu.bf16_dense_tflops = number(g, "bf16_dense_tflops");
    gpu.tf32_dense_tflops = number(g, "tf32_dense_tflops");
    gpu.pcie_gen = static_cast<int>(number(g, "pcie_gen"));
    gpu.host_link_gbps = number(g, "host_link_gbps");
    gpu.pinned_copy_gbps = number(g, "pinned_copy_gbps");
    gpu.nvlink_gbps = number(g, "nvlink_gbps");
    auto price_it = g.find("price_usd_per_hour");
    STRATA_ASSERT(price_it != g.end() && price_it->is_object());
    const json& price = *price_it;
    gpu.price_usd_per_hour = {number(price, "low"), number(price, "typical"),
                              number(price, "high")};
    p.gpus.push_back(std::move(gpu));
  }
  for (const auto& [name, n] : root["nvme"].items()) {
    NvmePreset drive{name, number(n, "read_gbps"), number(n, "write_gbps"), {}};
    if (auto arrays = n.find("measured_arrays"); arrays != n.end()) {
      STRATA_ASSERT(arrays->is_array());
      for (const json& a : *arrays) {
        const auto drives = static_cast<uint32_t>(number(a, "drives"));
        STRATA_ASSERT(drives > 1 && (drive.measured_arrays.empty() ||
                                     drives > drive.measured_arrays.back().drives));
        drive.measured_arrays.push_back({drives, number(a, "read_gbps"), number(a, "write_gbps")});
      }
    }
    p.nvme.push_back(std::move(drive));
  }
  std::sort(p.gpus.begin(), p.gpus.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::sort(p.nvme.begin(), p.nvme.end(), [](auto& a, auto& b) { return a.name < b.name; });
  return p;
}

const Presets& presets_table() {
  // Parsed once, immutable afterwards (a function-local static is thread-safe to initialize).
  static const Presets table = parse_presets();
  return table;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

}  // namespace

NvmeArrayPoint NvmePreset::array(uint32_t drives) const {
  STRATA_ASSERT(drives > 0);
  NvmeArrayPoint below{1, read_gbps, write_gbps};
  for (const NvmeArrayPoint& above : measured_arrays) {
    if (drives == above.drives) return above;
    if (drives < above.drives) {
      const double f = static_cast<double>(drives - below.drives) / (above.drives - below.drives);
      return {drives, below.read_gbps + f * (above.read_gbps - below.read_gbps),
              below.write_gbps + f * (above.write_gbps - below.write_gbps)};
    }
    below = above;
  }
  // Past the largest measured array: the last measured stretch's gain per added drive, which
  // arrays show falling as they grow, not the per-drive rate times the count.
  const NvmeArrayPoint before = measured_arrays.size() > 1
                                    ? measured_arrays[measured_arrays.size() - 2]
                                    : NvmeArrayPoint{1, read_gbps, write_gbps};
  if (below.drives == before.drives) return below;  // no array measured: one drive's rates
  const double added = drives - below.drives;
  const double span = below.drives - before.drives;
  return {drives, below.read_gbps + added * (below.read_gbps - before.read_gbps) / span,
          below.write_gbps + added * (below.write_gbps - before.write_gbps) / span};
}

const std::vector<GpuPreset>& gpu_presets() {
  return presets_table().gpus;
}
const std::vector<NvmePreset>& nvme_presets() {
  return presets_table().nvme;
}

Result<GpuPreset> find_gpu(std::string_view name) {
  const std::string key = lower(name);
  std::string list;
  for (const GpuPreset& gpu : gpu_presets()) {
    if (gpu.name == key) return gpu;
    list += (list.empty() ? "" : ", ") + gpu.name;
  }
  return invalid_argument("unknown GPU \"" + std::string(name) + "\"; presets: " + list);
}

Result<NvmePreset> find_nvme(std::string_view name) {
  const std::string key = lower(name);
  std::string list;
  for (const NvmePreset& nvme : nvme_presets()) {
    if (nvme.name == key || nvme.name == key + "-x4") return nvme;
    list += (list.empty() ? "" : ", ") + nvme.name;
  }
  return invalid_argument("unknown NVMe generation \"" + std::string(name) +
                          "\"; presets: " + list);
}

}  // namespace strata
