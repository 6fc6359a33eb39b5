// `strata doctor`: checks what a long run will need, before it starts, and says what to change.
// Each check is OK, WARN (works, but slower or riskier than it could be) or FAIL (the requested
// configuration cannot work); any FAIL makes the exit status non-zero.
#include <hwloc.h>
#include <linux/magic.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/status.h"
#include "common/units.h"
#include "io/engine_factory.h"
#include "io/uring_probe.h"
#include "optim/simd_level.h"
#include "optim/thread_pool.h"
#include "sched/pinned_sizing.h"
#include "storage/backing_device.h"
#include "storage/drive_probe.h"
#include "storage/owned_names.h"

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
  std::string advice;                // what to change; empty when nothing needs changing
  std::vector<std::string> details;  // more lines under the finding (a derivation)
};

const char* to_string(Verdict v) {
  switch (v) {
    case Verdict::kOk:
      return "ok";
    case Verdict::kWarn:
      return "warn";
    case Verdict::kFail:
      return "FAIL";
  }
  return "?";
}

struct DoctorOptions {
  std::string path = ".";
  std::string engine = "auto";
  std::string device = "auto";
  std::string nvme_capacity = "0";
  std::string pinned_budget = "auto";
  bool json = false;
  bool remove_orphans = false;
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
                      : s.coop_taskrun              ? "COOP_TASKRUN"
                                                    : "no setup flags";
  std::string finding = "available, ring flags: " + flags +
                        (s.sparse_buffers ? ", registered buffers" : ", no sparse buffer table");
  return {"io_uring", Verdict::kOk, finding, ""};
}

// Where the swap file would go, named for what it is: missing, not a directory, not enterable,
// not writable, read-only, full, in RAM, or refusing O_DIRECT - each with its own fix.
Check check_directory(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      return {"nvme path", Verdict::kFail, path + " does not exist",
              "create it (mkdir -p " + path + ") or point --path at a directory on the NVMe drive"};
    }
    if (err == EACCES) {
      return {"nvme path", Verdict::kFail,
              "permission denied: a directory on the way to " + path + " cannot be entered",
              "run as a user who can reach it, or choose a directory of your own"};
    }
    if (err == ENOTDIR) {
      return {"nvme path", Verdict::kFail, path + ": a component of the path is not a directory",
              "point --path at a directory on the NVMe drive"};
    }
    return {"nvme path", Verdict::kFail, path + ": " + errno_text(err),
            "point --path at a directory on the NVMe drive"};
  }
  if (!S_ISDIR(st.st_mode)) {
    const bool block = S_ISBLK(st.st_mode);
    return {"nvme path", Verdict::kFail,
            path + " is not a directory (" + (block ? "a block device" : "a file") + ")",
            block ? "--path names the directory for a swap file; a raw device is given to the "
                    "runtime as strata_config.raw_device"
                  : "--path names the directory that will hold the swap file, e.g. the one this "
                    "file is in"};
  }
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  const std::string who = "uid " + std::to_string(::geteuid());
  const std::string owner =
      " (mode " + std::string(mode) + ", owner uid " + std::to_string(st.st_uid) + ")";
  if (::access(path.c_str(), X_OK) != 0 && errno == EACCES) {
    return {"nvme path", Verdict::kFail,
            "permission denied: " + who + " cannot enter " + path + owner,
            "chmod u+x / chown it for the user who runs Strata, or choose a directory of your own"};
  }
  if (::access(path.c_str(), W_OK) != 0) {
    const int err = errno;
    if (err == EROFS) {
      return {"nvme path", Verdict::kFail, path + " is on a read-only file system",
              "remount it read-write, or choose a directory on a writable file system"};
    }
    if (err == EACCES) {
      return {"nvme path", Verdict::kFail,
              path + " is read-only for " + who + owner + ": the swap file cannot be created",
              "chmod u+w / chown it for the user who runs Strata, or choose a directory of your "
              "own"};
    }
    return {"nvme path", Verdict::kFail, path + ": " + errno_text(err),
            "choose a writable directory on the NVMe drive"};
  }
  return {"nvme path", Verdict::kOk, path + " is a writable directory", ""};
}

Check check_free_space(const DoctorOptions& o, const struct statvfs& vfs) {
  const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  const uint64_t wanted = parse_bytes(o.nvme_capacity).value_or(0);
  if (free_bytes == 0) {
    return {"free space", Verdict::kFail, "0 B free on " + o.path,
            "free space there, or point --path at a file system with room for the model states"};
  }
  if (wanted > free_bytes) {
    return {
        "free space", Verdict::kFail,
        format_bytes(free_bytes) + " free on " + o.path + ", " + format_bytes(wanted) + " asked",
        "free space, or lower the NVMe capacity"};
  }
  return {"free space", Verdict::kOk,
          format_bytes(free_bytes) + " free on " + o.path +
              (wanted == 0 ? " (a swap file of half of it by default)" : ""),
          ""};
}

// A swap file in RAM works but defeats the NVMe tier: its pages count against host memory.
Check check_file_system(const std::string& path) {
  struct statfs fs {};
  if (::statfs(path.c_str(), &fs) != 0) {
    return {"file system", Verdict::kWarn, std::string("statfs: ") + errno_text(errno), ""};
  }
  const auto type = static_cast<unsigned long>(fs.f_type);
  if (type == TMPFS_MAGIC || type == RAMFS_MAGIC) {
    return {"file system", Verdict::kWarn,
            path + " is on " + (type == TMPFS_MAGIC ? "tmpfs" : "ramfs") +
                ": the swap file would live in RAM and count against host memory",
            "point --path at a directory on the NVMe drive (ext4, xfs)"};
  }
  char type_hex[24];
  std::snprintf(type_hex, sizeof type_hex, "0x%lx", type);
  return {"file system", Verdict::kOk, std::string("not in RAM (f_type ") + type_hex + ")", ""};
}

Check check_o_direct(const std::string& path) {
  // The real thing, small: create a swap file as the runtime would and read its alignment. The
  // name is given explicitly, so the probe leaves orphans to the check below.
  storage::BackingDeviceOptions bo;
  bo.swap_dir = path;
  bo.swap_file_name = storage::generated_name(".swap");
  bo.capacity_bytes = 8u << 20;
  auto dev = storage::BackingDevice::open(bo);
  if (dev) {
    return {"O_DIRECT", Verdict::kOk,
            "works; offset alignment " + std::to_string(dev->alignment()) +
                " B, memory alignment " + std::to_string(dev->memory_alignment()) + " B",
            ""};
  }
  if (dev.status().code() == STRATA_E_UNSUPPORTED) {
    return {"O_DIRECT", Verdict::kFail, dev.status().message(),
            "use a directory on a file system that supports O_DIRECT (ext4, xfs, btrfs), or a "
            "raw device"};
  }
  return {"swap file", Verdict::kFail, dev.status().message(),
          dev.status().code() == STRATA_E_NOSPACE ? "free space there" : ""};
}

// The drive behind --path, measured as an automatic pinned budget measures it (a swap file of
// its own, written and read back at rising queue depths), and the budget it gives.
std::vector<Check> check_drive(const DoctorOptions& o, uint64_t* auto_budget) {
  storage::BackingDeviceOptions bo;
  bo.swap_dir = o.path;
  bo.swap_file_name = storage::generated_name(".swap");
  bo.capacity_bytes = 160u << 20;
  auto dev = storage::BackingDevice::open(bo);
  if (!dev) return {{"drive", Verdict::kWarn, "not measured: " + dev.status().message(), ""}};
  io::IoEngineOptions io_options;  // the runtime's defaults: queue depth 32, 1 MiB requests
  const io::IoEngineKind kind = o.engine == "psync"   ? io::IoEngineKind::kPsync
                                : o.engine == "uring" ? io::IoEngineKind::kUring
                                                      : io::IoEngineKind::kAuto;
  auto engine = io::make_io_engine(kind, io_options);
  if (!engine) return {{"drive", Verdict::kWarn, "not measured: " + engine.status().message(), ""}};
  auto probe = storage::probe_drive(*dev, **engine);
  if (!probe) return {{"drive", Verdict::kWarn, "not measured: " + probe.status().message(), ""}};
  Check drive{"drive", Verdict::kOk, "", "", {}};
  char line[160];
  std::snprintf(line, sizeof line,
                "read %.2f GB/s (at %u requests of %s in flight), write %.2f GB/s",
                probe->read_bytes_per_s / 1e9, probe->knee_queue_depth,
                format_bytes(probe->request_bytes).c_str(), probe->write_bytes_per_s / 1e9);
  drive.finding = line;
  for (const storage::DriveProbe::Level& level : probe->levels) {
    std::snprintf(line, sizeof line, "queue depth %2u: read %.2f GB/s, %.2f ms per request",
                  level.queue_depth, level.read_bytes_per_s / 1e9, level.latency_s * 1e3);
    drive.details.push_back(line);
  }
  if (!probe->direct_io) {
    drive.verdict = Verdict::kWarn;
    drive.advice = "measured through the page cache (no O_DIRECT here)";
  }
  sched::DriveFigures figures;
  figures.read_bytes_per_s = probe->read_bytes_per_s;
  figures.write_bytes_per_s = probe->write_bytes_per_s;
  figures.queue_depth = probe->knee_queue_depth;
  figures.request_bytes = probe->request_bytes;
  figures.latency_s = probe->knee_latency_s;
  figures.source = "measured on " + o.path;
  const sched::PinnedSizing sizing =
      sched::size_pinned_budget(figures, static_cast<uint32_t>(optim::affinity_cpu_count()));
  *auto_budget = sizing.budget_bytes;
  Check pinned{"pinned auto", Verdict::kOk,
               format_bytes(sizing.budget_bytes) + " (pinned_budget_bytes 0, --pinned-budget auto)",
               "", sizing.derivation};
  return {std::move(drive), std::move(pinned)};
}

Check check_orphans(const DoctorOptions& o) {
  Result<std::vector<storage::Orphan>> found = storage::find_orphans(o.path);
  if (!found) return {"orphans", Verdict::kWarn, found.status().message(), ""};
  if (found->empty()) {
    return {"orphans", Verdict::kOk, "no swap files left by processes that have exited", ""};
  }
  uint64_t bytes = 0;
  std::string names;
  int removed = 0;
  std::string failures;
  for (const storage::Orphan& orphan : *found) {
    bytes += orphan.bytes;
    names += (names.empty() ? "" : ", ") + orphan.name + " (pid " +
             std::to_string(orphan.owner.pid) + ", " + format_bytes(orphan.bytes) + ")";
    if (o.remove_orphans) {
      const Status gone = storage::remove_orphan(o.path, orphan.name);
      if (gone) {
        ++removed;
      } else {
        failures += (failures.empty() ? "" : "; ") + gone.message();
      }
    }
  }
  const std::string count = std::to_string(found->size());
  if (o.remove_orphans) {
    return {"orphans", failures.empty() ? Verdict::kOk : Verdict::kWarn,
            "removed " + std::to_string(removed) + " of " + count + " left by exited processes (" +
                format_bytes(bytes) + "): " + names,
            failures};
  }
  return {"orphans", Verdict::kWarn,
          count + " left by processes that no longer exist, " + format_bytes(bytes) + ": " + names,
          "remove them: strata doctor --path " + o.path + " --remove-orphans"};
}

std::vector<Check> check_path(const DoctorOptions& o) {
  std::vector<Check> checks;
  checks.push_back(check_directory(o.path));
  if (checks.back().verdict == Verdict::kFail) return checks;
  struct statvfs vfs {};
  if (statvfs(o.path.c_str(), &vfs) != 0) {
    checks.push_back({"free space", Verdict::kFail, o.path + ": " + errno_text(errno), ""});
    return checks;
  }
  checks.push_back(check_free_space(o, vfs));
  checks.push_back(check_file_system(o.path));
  checks.push_back(check_orphans(o));
  if (checks[1].verdict == Verdict::kFail) return checks;  // nothing to probe with
  checks.push_back(check_o_direct(o.path));
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

Check check_memlock(const DoctorOptions& o, uint64_t auto_budget) {
  rlimit lim{};
  getrlimit(RLIMIT_MEMLOCK, &lim);
  const uint64_t budget =
      o.pinned_budget == "auto" ? auto_budget : parse_bytes(o.pinned_budget).value_or(0);
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
    finding += " #" + std::to_string(node->os_index) + " " +
               format_bytes(node->attr->numanode.local_memory);
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
  uint64_t auto_budget = 0;
  if (checks.back().name == "O_DIRECT" && checks.back().verdict == Verdict::kOk) {
    for (auto& c : check_drive(o, &auto_budget)) checks.push_back(std::move(c));
  }
  checks.push_back(check_memlock(o, auto_budget));
  checks.push_back(check_numa());
  checks.push_back(check_gpu(o.device));
  checks.push_back(check_simd());

  bool failed = false;
  for (const auto& c : checks) failed |= c.verdict == Verdict::kFail;

  if (o.json) {
    nlohmann::json out;
    out["ok"] = !failed;
    for (const auto& c : checks) {
      out["checks"].push_back({{"name", c.name},
                               {"verdict", to_string(c.verdict)},
                               {"finding", c.finding},
                               {"advice", c.advice},
                               {"details", c.details}});
    }
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    for (const auto& c : checks) {
      std::printf("%-11s %-4s  %s\n", c.name.c_str(), to_string(c.verdict), c.finding.c_str());
      for (const std::string& detail : c.details) std::printf("%-17s   %s\n", "", detail.c_str());
      if (!c.advice.empty()) std::printf("%-17s -> %s\n", "", c.advice.c_str());
    }
    int warnings = 0;
    for (const auto& c : checks) warnings += c.verdict == Verdict::kWarn ? 1 : 0;
    if (failed) {
      std::printf("\nThis configuration cannot work: change what is marked FAIL.\n");
    } else if (warnings > 0) {
      std::printf("\nReady, with %d warning%s: see what is marked warn.\n", warnings,
                  warnings == 1 ? "" : "s");
    } else {
      std::printf("\nReady.\n");
    }
  }
  return failed ? 1 : 0;
}

}  // namespace

void add_doctor_command(CLI::App& app) {
  auto options = std::make_shared<DoctorOptions>();
  CLI::App* cmd = app.add_subcommand("doctor", "Check this machine before a long run");
  cmd->add_option("--path", options->path, "Directory for the NVMe swap file")
      ->capture_default_str();
  cmd->add_option("--engine", options->engine, "I/O engine that will be asked for")
      ->check(CLI::IsMember({"auto", "uring", "psync"}))
      ->capture_default_str();
  cmd->add_option("--device", options->device, "Device backend that will be asked for")
      ->check(CLI::IsMember({"auto", "cuda", "emulated"}))
      ->capture_default_str();
  cmd->add_option("--nvme-capacity", options->nvme_capacity,
                  "Swap file size that will be asked for")
      ->capture_default_str();
  cmd->add_option("--pinned-budget", options->pinned_budget,
                  "Pinned host budget that will be asked for (auto: sized from the drive)")
      ->capture_default_str();
  cmd->add_flag("--json", options->json, "Print one JSON object");
  cmd->add_flag("--remove-orphans", options->remove_orphans,
                "Remove swap files under --path left by processes that no longer exist (never "
                "one whose owner is alive)");
  cmd->callback([options] {
    for (const std::string* size : {&options->nvme_capacity, &options->pinned_budget}) {
      if (*size == "auto" && size == &options->pinned_budget) continue;
      if (!parse_bytes(*size)) throw CLI::ValidationError("not a byte size: " + *size);
    }
    const int rc = run_doctor(*options);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace strata::cli
