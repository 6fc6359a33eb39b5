// libFuzzer target for everything Strata parses or validates from a user: strata_runtime_create
// with random strata_config fields (struct sizes, budgets, engines, threads, enums, planned
// tensors, ZeRO sizes), and the C++ text parsers - STRATA_FAULTS (FaultPlan::parse), byte sizes
// (parse_bytes), HF config.json (parse_model_config) and the CLI's small grammars. The first
// input byte picks which. Checked: no crash, no sanitizer report, only known STRATA_E_* codes
// with a message, and the round trips the parsers promise (a plan's to_string parses back to the
// same plan; a parsed byte count printed in decimal parses back to itself).
//
// Paths come from a fixed list inside a scratch directory (never a random string): a fuzzer
// must not be able to name a real block device or a directory outside its sandbox, and sizes
// are either small or far beyond any disk, so that nothing large is ever preallocated.
#include <fuzzer/FuzzedDataProvider.h>
#include <strata/strata.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/units.h"
#include "io/engine_factory.h"
#include "io/fault_injection.h"
#include "model/model_config.h"
#include "model/plan.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "config_fuzz: invariant broken: %s: %s\n", what, detail.c_str());
  std::abort();
}

void check_status(const strata::Status& status, const char* what) {
  if (status.is_ok()) return;
  if (status.code() >= 0 || status.code() < STRATA_E_INTERNAL ||
      status.code() == STRATA_E_INTERNAL) {
    fail(what, "code " + std::to_string(status.code()) + ": " + status.message());
  }
  if (status.message().empty()) fail(what, "an error without a message");
}

struct Sandbox {
  std::string dir, missing, file, link;
  Sandbox() {
    const char* base = std::getenv("STRATA_TEST_DIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/config-fuzz-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) fail("mkdtemp", pattern);
    dir = pattern;
    missing = dir + "/missing";
    file = dir + "/regular-file";
    link = dir + "/link-to-dir";
    std::ofstream(file) << "not a directory";
    std::filesystem::create_directory_symlink(dir, link);
  }
  ~Sandbox() { std::filesystem::remove_all(dir); }
};

const Sandbox& sandbox() {
  static const Sandbox box;
  return box;
}

void fuzz_fault_plan(const std::string& text) {
  auto plan = strata::io::FaultPlan::parse(text);
  if (!plan) return check_status(plan.status(), "FaultPlan::parse");
  const std::string printed = plan->to_string();
  auto again = strata::io::FaultPlan::parse(printed);
  if (!again)
    fail("FaultPlan round trip", "'" + printed + "' does not parse: " + again.status().message());
  if (again->to_string() != printed) {
    fail("FaultPlan round trip", "'" + printed + "' prints back as '" + again->to_string() + "'");
  }
  if (again->rules.size() != plan->rules.size()) fail("FaultPlan round trip", "rule count");
}

void fuzz_bytes(const std::string& text) {
  const auto bytes = strata::parse_bytes(text);
  if (!bytes) return;
  (void)strata::format_bytes(*bytes);
  const std::string decimal = std::to_string(*bytes);
  const auto again = strata::parse_bytes(decimal);
  if (!again || *again != *bytes) {
    fail("parse_bytes round trip", "'" + text + "' -> " + decimal + " -> " +
                                       (again ? std::to_string(*again) : std::string("nullopt")));
  }
}

void fuzz_small_parsers(FuzzedDataProvider& in) {
  const std::string text = in.ConsumeRemainingBytesAsString();
  if (auto v = strata::parse_nvme(text); !v) check_status(v.status(), "parse_nvme");
  if (auto v = strata::parse_gpu_choice(text); !v) check_status(v.status(), "parse_gpu_choice");
  if (auto v = strata::parse_lora_targets(text); !v) {
    check_status(v.status(), "parse_lora_targets");
  } else {
    auto again = strata::parse_lora_targets(strata::to_string(*v));
    if (!again) fail("parse_lora_targets round trip", strata::to_string(*v));
  }
  (void)strata::io::parse_io_engine_kind(text);
}

// A value that is valid most of the time, sometimes out of range.
template <typename T>
T pick(FuzzedDataProvider& in, T low, T high) {
  return in.ConsumeIntegralInRange(0, 7) != 0 ? in.ConsumeIntegralInRange<T>(low, high)
                                              : in.ConsumeIntegral<T>();
}

uint64_t pick_size(FuzzedDataProvider& in, uint64_t low, uint64_t high) {
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0:
      return 0;
    case 1:
      return in.ConsumeIntegralInRange<uint64_t>(uint64_t{1} << 50, UINT64_MAX);
    case 2:
      return in.ConsumeIntegralInRange<uint64_t>(1, 4095);
    default:
      return in.ConsumeIntegralInRange<uint64_t>(low, high);
  }
}

void fuzz_runtime_create(FuzzedDataProvider& in) {
  const Sandbox& box = sandbox();
  // Room for a "newer" struct: its extra bytes come from the input (zero most of the time).
  alignas(strata_config) unsigned char storage[sizeof(strata_config) + 64] = {};
  auto* c = reinterpret_cast<strata_config*>(storage);
  strata_config_init(c);
  switch (in.ConsumeIntegralInRange(0, 15)) {
    case 0:
      c->struct_size = in.ConsumeIntegralInRange<size_t>(0, sizeof storage);
      break;
    case 1:
      c->struct_size = sizeof storage;
      for (size_t i = sizeof(strata_config); i < sizeof storage; ++i) {
        storage[i] = in.ConsumeIntegralInRange(0, 3) == 0 ? in.ConsumeIntegral<uint8_t>() : 0;
      }
      break;
    default:
      break;
  }
  const std::string* paths[] = {&box.dir, &box.missing, &box.file, &box.link};
  const int where = in.ConsumeIntegralInRange(0, 7);
  c->nvme_path = where < 4    ? paths[where]->c_str()
                 : where == 4 ? ""
                 : where == 5 ? nullptr
                              : box.dir.c_str();
  // Never a real block device: the character device /dev/null and names that do not exist.
  const int raw = in.ConsumeIntegralInRange(0, 9);
  c->raw_device = raw == 0   ? "/dev/null"
                  : raw == 1 ? box.missing.c_str()
                  : raw == 2 ? box.file.c_str()
                             : nullptr;
  c->nvme_capacity_bytes = pick_size(in, 4096, 32ull << 20);
  if (c->nvme_capacity_bytes == 0) c->nvme_capacity_bytes = 1 << 20;  // 0 = half the free space
  c->keep_swap_file = 0;
  c->verify_checksums = in.ConsumeIntegral<int>();
  c->pinned_budget_bytes = pick_size(in, 4096, 8ull << 20);
  c->device_budget_bytes = pick_size(in, 4096, 8ull << 20);
  // Non-zero is refused (STRATA_E_UNSUPPORTED): mostly 0, so that the rest gets explored.
  c->host_budget_bytes = in.ConsumeIntegralInRange(0, 7) == 0 ? in.ConsumeIntegral<uint64_t>() : 0;
  c->io_engine = static_cast<strata_io_engine>(pick(in, 0, 2));
  c->queue_depth = pick(in, 1u, 64u);
  c->block_size =
      in.ConsumeBool() ? 4096u << in.ConsumeIntegralInRange(0, 8) : in.ConsumeIntegral<uint32_t>();
  if (c->block_size > (1u << 20) && in.ConsumeBool()) c->block_size = 1u << 20;
  c->worker_threads = pick(in, 0u, 4u);
  c->optimizer_threads = pick(in, 0u, 4u);
  c->policy = static_cast<strata_policy>(pick(in, 0, 1));
  c->device_backend = in.ConsumeIntegralInRange(0, 7)
                          ? STRATA_DEVICE_EMULATED
                          : static_cast<strata_device_backend>(pick(in, 0, 2));
  c->device_ordinal = pick(in, 0, 1);
  c->numa_node = pick(in, -1, 1);
  // Tracing allocates 96 bytes per event up front: the fuzzer keeps to small counts and to
  // counts over the documented limit (refused), not the 6 GiB a valid maximum would take.
  c->trace_events = in.ConsumeBool() ? in.ConsumeIntegralInRange(0u, 4096u)
                                     : in.ConsumeIntegralInRange((1u << 26) + 1, UINT32_MAX);
  std::vector<strata_tensor_desc> planned(in.ConsumeIntegralInRange(0, 6));
  for (auto& d : planned) {
    d.struct_size = sizeof d;
    d.name = "planned";
    d.bytes = pick_size(in, 1, 1ull << 20);
    d.dtype = static_cast<strata_dtype>(pick(in, 0, 4));
    d.kind = static_cast<strata_tensor_kind>(pick(in, 0, 6));
    d.layer = pick(in, -1, 4);
    d.home_tier = STRATA_TIER_NVME;
  }
  c->planned_tensors = planned.empty() && in.ConsumeBool() ? nullptr : planned.data();
  c->planned_tensor_count =
      in.ConsumeIntegralInRange(0, 15) == 0 ? in.ConsumeIntegral<size_t>() & 0xff : planned.size();
  if (c->planned_tensors != nullptr && c->planned_tensor_count > planned.size()) {
    c->planned_tensor_count = planned.size();  // the caller's array is as long as it says
  }
  c->zero_sub_group_elements = in.ConsumeBool() ? 0 : pick_size(in, 1, 1 << 20);
  c->zero_param_buffer_elements = in.ConsumeBool() ? 0 : pick_size(in, 1, 1 << 20);
  c->nvme_layout = static_cast<strata_nvme_layout>(pick(in, 0, 1));
  // Streaming: automatic, off, a valid power of two, or anything.
  switch (in.ConsumeIntegralInRange(0, 3)) {
    case 0:
      c->stream_chunk_bytes = 0;
      break;
    case 1:
      c->stream_chunk_bytes = STRATA_STREAMING_OFF;
      break;
    case 2:
      c->stream_chunk_bytes = uint64_t{65536} << in.ConsumeIntegralInRange(0, 10);
      break;
    default:
      c->stream_chunk_bytes = in.ConsumeIntegral<uint64_t>();
      break;
  }
  c->stream_buffers = pick(in, 0u, 70u);
  // Staging buffers are pinned, written and resident from creation: 2 x buffers x chunk, up to
  // 8 GiB for valid values. With a budget set the runtime refuses staging over half of it (4 MiB
  // at most here); an automatic budget is sized around the staging asked for, so the fuzzer keeps
  // that to 256 MiB, within its memory limit (64 buffers of 64 MiB per direction ran it out).
  const uint64_t chunk = c->stream_chunk_bytes;
  if (c->pinned_budget_bytes == 0 && chunk >= (64u << 10) && chunk <= (64u << 20) &&
      c->stream_buffers > (128u << 20) / chunk) {
    c->stream_buffers = static_cast<uint32_t>(std::max<uint64_t>(1, (128u << 20) / chunk));
  }
  // A declared drive (both, one, or neither); measured when neither.
  if (in.ConsumeBool()) {
    c->drive_read_bytes_per_s = pick_size(in, 1, 20'000'000'000ull);
    c->drive_write_bytes_per_s = in.ConsumeBool() ? pick_size(in, 1, 20'000'000'000ull) : 0;
  }

  strata_runtime* rt = nullptr;
  const int rc = strata_runtime_create(c, &rt);
  if (rc > 0 || rc < STRATA_E_INTERNAL || rc == STRATA_E_INTERNAL) {
    fail("strata_runtime_create", std::to_string(rc) + ": " + strata_last_error(nullptr));
  }
  if (rc != STRATA_OK) {
    if (rt != nullptr) fail("strata_runtime_create", "failed but set *out");
    if (strata_last_error(nullptr)[0] == '\0') fail("strata_runtime_create", "no message");
    return;
  }
  // Whatever was accepted must work: one tensor through NVMe and back.
  strata_tensor_desc d{};
  d.struct_size = sizeof d;
  d.name = "probe";
  d.bytes = 4096 + 13;
  d.kind = STRATA_KIND_PARAMETER;
  d.dtype = STRATA_DTYPE_BF16;
  d.home_tier = STRATA_TIER_NVME;
  strata_tensor t = STRATA_TENSOR_NONE;
  std::vector<uint8_t> in_bytes(d.bytes, 0x5a), out_bytes(d.bytes);
  int trc = strata_tensor_register(rt, &d, &t);
  if (trc == STRATA_OK) trc = strata_tensor_write(rt, t, in_bytes.data(), 0, d.bytes);
  if (trc == STRATA_OK) trc = strata_sync(rt);
  if (trc == STRATA_OK) trc = strata_tensor_read(rt, t, out_bytes.data(), 0, d.bytes);
  if (trc == STRATA_OK && out_bytes != in_bytes) fail("probe tensor", "read back different bytes");
  if (trc == STRATA_E_INTERNAL || trc == STRATA_E_IO || trc == STRATA_E_CORRUPT) {
    fail("probe tensor", strata_last_error(rt));
  }
  if (strata_runtime_destroy(rt) != STRATA_OK) fail("strata_runtime_destroy", "failed");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0:
      fuzz_fault_plan(in.ConsumeRemainingBytesAsString());
      break;
    case 1:
      fuzz_bytes(in.ConsumeRemainingBytesAsString());
      break;
    case 2: {
      const std::string name = in.ConsumeRandomLengthString(16);
      auto model = strata::parse_model_config(in.ConsumeRemainingBytesAsString(), name);
      if (!model) check_status(model.status(), "parse_model_config");
      break;
    }
    case 3:
      fuzz_small_parsers(in);
      break;
    default:
      fuzz_runtime_create(in);
      break;
  }
  return 0;
}
