// `strata doctor`: checks what a long run will need, before it starts, and says what to change.
// Each check is OK, WARN (works, but slower or riskier than it could be) or FAIL (the requested
// configuration cannot work); any FAIL makes the exit status non-zero.
#include <hwloc.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/units.h"
#include "io/uring_probe.h"
#include "optim/simd_level.h"
#include "storage/backing_device.h"

#ifdef STRATA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace strata::cli {
namespace {

enum class Verdict { kOk, kWarn, kFail };

struct Check {
  std::string name;
  Verdict verdict;
  std::string finding;
  std::string advice;  // what to change; empty when nothing needs changing
};

const char* to_string(Verdict v) {
  switch (v) {
    case Verdict::kOk: return "ok";
    case Verdict::kWarn: return "warn";
    case Verdict::kFail: return "FAIL";
  }
  return "?";
}

struct DoctorOptions {
  std::string path = ".";
  std::string engine = "auto";
  std::string device = "auto";
  std::string nvme_capacity = "0";
  std::string pinned_budget = "4G";
  bool json = false;
};

Check check_kernel() {
  utsname u{};
  uname(&u);
  return {"kernel", Verdict::kOk, std::string(u.sysname) + " " + u.release + " " + u.machine, ""};
}

Check check_io_uring(const std::string& engine) {
  const io::UringSupport s = io::probe_uring();
  if (!s.available) {
    const Verdict v = engine == "uring" ? Verdict::kFail : Verdict::kWarn;
    return {"io_uring", v, "unavailable: " + s.reason,
            engine == "uring" ? "use --engine psync, or allow io_uring (sysctl "
                                "kernel.io_uring_disabled=0, seccomp profile)"
                              : "Strata falls back to pread/pwrite; io_uring is faster"};
  }
  std::string flags = s.single_issuer_defer_taskrun ? "SINGLE_ISSUER|DEFER_TASKRUN"
                      : s.coop_taskrun                ? "COOP_TASKRUN"
                                                      : "no setup flags";
  std::string finding = "available, ring flags: " + flags +
                        (s.sparse_buffers ? ", registered buffers" : ", no sparse buffer table");
  return {"io_uring", Verdict::kOk, finding, ""};
}

std::vector<Check> check_path(const DoctorOptions& o) {
  std::vector<Check> checks;
  struct statvfs vfs {};
  if (statvfs(o.path.c_str(), &vfs) != 0) {
    checks.push_back({"nvme path", Verdict::kFail, o.path + ": " + std::strerror(errno),
                      "point --path at an existing directory on the NVMe drive"});
    return checks;
  }
  const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  const uint64_t wanted = parse_bytes(o.nvme_capacity).value_or(0);
  if (wanted > free_bytes) {
    checks.push_back({"free space", Verdict::kFail,
                      format_bytes(free_bytes) + " free on " + o.path + ", " +
                          format_bytes(wanted) + " asked",
                      "free space, or lower the NVMe capacity"});
  } else {
    checks.push_back({"free space", Verdict::kOk, format_bytes(free_bytes) + " free on " + o.path,
                      ""});
  }

  // The real thing, small: create a swap file as the runtime would and read its alignment.
  storage::BackingDeviceOptions bo;
  bo.swap_dir = o.path;
  bo.capacity_bytes = 8u << 20;
  auto dev = storage::BackingDevice::open(bo);
  if (!dev) {
    checks.push_back({"O_DIRECT", Verdict::kFail, dev.status().message(),
                      "use a directory on a file system that supports O_DIRECT (ext4, xfs, "
                      "btrfs), or a raw device"});
  } else {
    checks.push_back({"O_DIRECT", Verdict::kOk,
                      "works; offset alignment " + std::to_string(dev->alignment()) +
                          " B, memory alignment " + std::to_string(dev->memory_alignment()) + " B",
                      ""});
  }
  return checks;
}

bool has_cap_ipc_lock() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      const uint64_t caps = std::stoull(line.substr(7), nullptr, 16);
      return (caps >> 14) & 1u;  // CAP_IPC_LOCK
    }
  }
  return false;
}

Check check_memlock(const DoctorOptions& o) {
  rlimit lim{};
  getrlimit(RLIMIT_MEMLOCK, &lim);
  const uint64_t budget = parse_bytes(o.pinned_budget).value_or(0);
  const bool unlimited = lim.rlim_cur == RLIM_INFINITY;
  const std::string limit = unlimited ? "unlimited" : format_bytes(lim.rlim_cur);
  if (unlimited || has_cap_ipc_lock()) {
    return {"memlock", Verdict::kOk,
            "RLIMIT_MEMLOCK " + limit + (unlimited ? "" : " (CAP_IPC_LOCK lifts it)"), ""};
  }
  if (lim.rlim_cur < budget) {
    return {"memlock", Verdict::kFail,
            "RLIMIT_MEMLOCK " + limit + " < pinned budget " + format_bytes(budget),
            "raise it (ulimit -l unlimited, or memlock in /etc/security/limits.conf), or lower "
            "the pinned budget"};
  }
  return {"memlock", Verdict::kOk, "RLIMIT_MEMLOCK " + limit, ""};
}

Check check_numa() {
  hwloc_topology_t topology = nullptr;
  if (hwloc_topology_init(&topology) != 0 || hwloc_topology_load(topology) != 0) {
    if (topology) hwloc_topology_destroy(topology);
    return {"NUMA", Verdict::kWarn, "hwloc could not read the topology",
            "pinned memory will not be NUMA-bound"};
  }
  const int nodes = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_NUMANODE);
  std::string finding = std::to_string(nodes) + " node" + (nodes == 1 ? "" : "s") + ":";
  for (int i = 0; i < nodes; ++i) {
    hwloc_obj_t node = hwloc_get_obj_by_type(topology, HWLOC_OBJ_NUMANODE, i);
    finding += " #" + std::to_string(node->os_index) + " " + format_bytes(node->attr->numanode.local_memory);
  }
  const int cores = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_CORE);
  finding += ", " + std::to_string(cores) + " cores";
  hwloc_topology_destroy(topology);
  return {"NUMA", Verdict::kOk, finding, ""};
}

Check check_gpu(const std::string& device) {
#ifdef STRATA_HAVE_CUDA
  int driver = 0;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  cudaDriverGetVersion(&driver);
  if (err == cudaSuccess && count > 0) {
    std::string finding = "CUDA driver " + std::to_string(driver / 1000) + "." +
                          std::to_string(driver % 1000 / 10) + ", " + std::to_string(count) +
                          " device" + (count == 1 ? "" : "s") + ":";
    for (int i = 0; i < count; ++i) {
      cudaDeviceProp prop{};
      if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
      char bus[32];
      std::snprintf(bus, sizeof bus, "%04x:%02x:%02x", prop.pciDomainID, prop.pciBusID,
                    prop.pciDeviceID);
      finding += std::string(" [") + std::to_string(i) + "] " + prop.name + " " +
                 format_bytes(prop.totalGlobalMem) + " at " + bus;
    }
    return {"GPU", Verdict::kOk, finding, ""};
  }
  const std::string why = cudaGetErrorString(err);
  cudaGetLastError();  // clear the sticky error so nothing later trips over it
#else
  const std::string why = "built without CUDA";
#endif
  if (device == "cuda") {
    return {"GPU", Verdict::kFail, "no usable GPU (" + why + ")",
            "install the NVIDIA driver, or use the host-emulated device (--device emulated)"};
  }
  return {"GPU", Verdict::kOk, "no GPU: host-emulated device (" + why + ")", ""};
}

Check check_simd() {
  return {"CPU SIMD", Verdict::kOk,
          std::string("optimizer kernels use ") + optim::simd_level_name(), ""};
}

int run_doctor(const DoctorOptions& o) {
  std::vector<Check> checks;
  checks.push_back(check_kernel());
  checks.push_back(check_io_uring(o.engine));
  for (auto& c : check_path(o)) checks.push_back(std::move(c));
  checks.push_back(check_memlock(o));
  checks.push_back(check_numa());
  checks.push_back(check_gpu(o.device));
  checks.push_back(check_simd());

  bool failed = false;
  for (const auto& c : checks) failed |= c.verdict == Verdict::kFail;

  if (o.json) {
    nlohmann::json out;
    out["ok"] = !failed;
    for (const auto& c : checks) {
      out["checks"].push_back(
          {{"name", c.name}, {"verdict", to_string(c.verdict)}, {"finding", c.finding},
           {"advice", c.advice}});
    }
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    for (const auto& c : checks) {
      std::printf("%-11s %-4s  %s\n", c.name.c_str(), to_string(c.verdict), c.finding.c_str());
      if (!c.advice.empty()) std::printf("%-17s -> %s\n", "", c.advice.c_str());
    }
    std::printf("\n%s\n", failed ? "This configuration cannot work: change what is marked FAIL."
                                 : "Ready.");
  }
  return failed ? 1 : 0;
}

}  // namespace

void add_doctor_command(CLI::App& app) {
  auto options = std::make_shared<DoctorOptions>();
  CLI::App* cmd = app.add_subcommand("doctor", "Check this machine before a long run");
  cmd->add_option("--path", options->path, "Directory for the NVMe swap file")->capture_default_str();
  cmd->add_option("--engine", options->engine, "I/O engine that will be asked for")
      ->check(CLI::IsMember({"auto", "uring", "psync"}))
      ->capture_default_str();
  cmd->add_option("--device", options->device, "Device backend that will be asked for")
      ->check(CLI::IsMember({"auto", "cuda", "emulated"}))
      ->capture_default_str();
  cmd->add_option("--nvme-capacity", options->nvme_capacity, "Swap file size that will be asked for")
      ->capture_default_str();
  cmd->add_option("--pinned-budget", options->pinned_budget, "Pinned host budget that will be asked for")
      ->capture_default_str();
  cmd->add_flag("--json", options->json, "Print one JSON object");
  cmd->callback([options] {
    for (const std::string* size : {&options->nvme_capacity, &options->pinned_budget}) {
      if (!parse_bytes(*size)) throw CLI::ValidationError("not a byte size: " + *size);
    }
    const int rc = run_doctor(*options);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace strata::cli
