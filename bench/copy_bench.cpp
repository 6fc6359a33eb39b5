// `strata bench copy`: the device's copies between pinned host memory and device memory, through
// the runtime's own device interface (memory/device.h: on the emulated device a memcpy on each
// copy stream's thread, on CUDA the copy engines over PCIe), each direction alone and both at
// once, beside a plain memcpy of the same bytes between two host buffers on the calling thread.
//
// It is the independent figure for the link `strata plan` models (--pcie-efficiency: the rate
// over the GPU preset's host link): bench/planner_vs_measured.sh gives the plan the device the
// run had, and on a machine without a GPU that device is the emulated one, whose memcpy runs far
// below any PCIe preset.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench_commands.h"
#include "common/align.h"
#include "common/report.h"
#include "common/units.h"
#include "finetune/worker_common.h"
#include "memory/device.h"
#include "memory/pinned_arena.h"

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Explicit limits: the buffers are pinned (locked), two on the host and two on the device.
constexpr uint64_t kMaxCopyBytes = uint64_t{16} << 30;
constexpr uint64_t kDeviceAlignment = 256;

struct CopyArgs {
  std::string size = "256M";
  std::string chunk = "4M";
  uint32_t rounds = 5;
  std::string backend = "auto";
  bool json = false;
};

[[noreturn]] void fail(const Status& status) {
  std::fprintf(stderr, "strata bench copy: %s\n", status.message().c_str());
  throw CLI::RuntimeError(1);
}

template <typename T>
T take(Result<T> r) {
  if (!r) fail(r.status());
  return std::move(r).value();
}

void check(const Status& s) {
  if (!s.is_ok()) fail(s);
}

double gbps(uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
}

// The buffers one run uses: a pinned source and destination on the host, a destination and a
// source on the device, each `bytes` long and touched before anything is timed.
struct Buffers {
  memory::PinnedBuffer host_source, host_destination;
  memory::DeviceBuffer device_destination, device_source;
};

class CopyBench {
 public:
  CopyBench(memory::Device& device, Buffers& buffers, uint64_t bytes, uint64_t chunk)
      : device_(device), b_(buffers), bytes_(bytes), chunk_(chunk) {}

  // Queues the whole buffer on one stream in chunks and waits for it: seconds. Returns its
  // failure rather than failing the run: it also runs on a thread of its own (both_at_once).
  Result<double> one_direction(memory::CopyStream stream) {
    const auto start = Clock::now();
    const bool to_device = stream == memory::CopyStream::kHostToDevice;
    auto* dst = static_cast<std::byte*>(to_device ? b_.device_destination.data()
                                                  : static_cast<void*>(b_.host_destination.data()));
    const auto* src = static_cast<const std::byte*>(
        to_device ? static_cast<const void*>(b_.host_source.data()) : b_.device_source.data());
    for (uint64_t off = 0; off < bytes_; off += chunk_) {
      STRATA_TRY(device_.copy_async(stream, dst + off, src + off, std::min(chunk_, bytes_ - off)));
    }
    STRATA_TRY(device_.synchronize(stream));
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

  // Both streams at once, each queued from its own thread (copy_async blocks while a stream's
  // queue is full, which one thread queuing both would turn into turns): each direction's seconds.
  std::pair<double, double> both_at_once() {
    Result<double> to_device = 0.0;
    std::thread other([&] { to_device = one_direction(memory::CopyStream::kHostToDevice); });
    Result<double> to_host = one_direction(memory::CopyStream::kDeviceToHost);
    other.join();  // before anything can fail the run
    return {take(std::move(to_device)), take(std::move(to_host))};
  }

  // The same bytes between the two host buffers on this thread, in the same chunks.
  double host_memcpy() {
    const auto start = Clock::now();
    for (uint64_t off = 0; off < bytes_; off += chunk_) {
      std::memcpy(b_.host_destination.data() + off, b_.host_source.data() + off,
                  std::min(chunk_, bytes_ - off));
    }
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

 private:
  memory::Device& device_;
  Buffers& b_;
  const uint64_t bytes_;
  const uint64_t chunk_;
};

memory::DeviceBackend parse_backend(const std::string& name) {
  if (name == "cuda") return memory::DeviceBackend::kCuda;
  if (name == "emulated") return memory::DeviceBackend::kEmulated;
  return memory::DeviceBackend::kAuto;
}

void run_copy_bench(const CopyArgs& args) {
  const std::optional<uint64_t> size = parse_bytes(args.size);
  const std::optional<uint64_t> chunk = parse_bytes(args.chunk);
  if (!size || *size == 0 || *size > kMaxCopyBytes) {
    fail(invalid_argument("--size: " + args.size + " is not a size from 1 byte to " +
                          format_bytes(kMaxCopyBytes)));
  }
  if (!chunk || *chunk == 0) fail(invalid_argument("--chunk: not a size: " + args.chunk));
  const uint64_t bytes = *size;
  const uint64_t chunk_bytes = std::min(*chunk, bytes);

  memory::DeviceOptions device_options;
  device_options.backend = parse_backend(args.backend);
  device_options.budget_bytes = 2 * align_up(bytes, kDeviceAlignment);
  std::unique_ptr<memory::Device> device = take(memory::open_device(device_options));

  memory::PinnedArenaOptions pinned;
  pinned.budget_bytes = 2 * align_up(bytes, kPageSize) + (uint64_t{4} << 20);
  pinned.device = device.get();
  std::unique_ptr<memory::PinnedArena> arena = take(memory::PinnedArena::create(pinned));

  Buffers buffers;
  buffers.host_source = take(arena->allocate(bytes));
  buffers.host_destination = take(arena->allocate(bytes));
  buffers.device_destination = take(memory::allocate_buffer(*device, bytes));
  buffers.device_source = take(memory::allocate_buffer(*device, bytes));
  // Every page touched before the first timed copy: the host buffers are written here, the
  // device's by one untimed pass each way (the emulated device's memfd pages fault on first use).
  // The source holds each byte's offset, so that a copy to the wrong place shows below.
  for (uint64_t i = 0; i < bytes; ++i) buffers.host_source.data()[i] = std::byte(i * 131 >> 8);
  std::memset(buffers.host_destination.data(), 0, bytes);
  CopyBench bench(*device, buffers, bytes, chunk_bytes);
  (void)take(bench.one_direction(memory::CopyStream::kHostToDevice));
  check(device->copy_async(memory::CopyStream::kHostToDevice, buffers.device_source.data(),
                           buffers.host_source.data(), bytes));
  check(device->synchronize(memory::CopyStream::kHostToDevice));
  (void)take(bench.one_direction(memory::CopyStream::kDeviceToHost));

  std::vector<double> memcpy_rates, to_device, to_host, at_once_to_device, at_once_to_host;
  for (uint32_t round = 0; round < args.rounds; ++round) {
    memcpy_rates.push_back(gbps(bytes, bench.host_memcpy()));
    to_device.push_back(gbps(bytes, take(bench.one_direction(memory::CopyStream::kHostToDevice))));
    to_host.push_back(gbps(bytes, take(bench.one_direction(memory::CopyStream::kDeviceToHost))));
    const auto [d, h] = bench.both_at_once();
    at_once_to_device.push_back(gbps(bytes, d));
    at_once_to_host.push_back(gbps(bytes, h));
  }
  // The timed copies must have moved the bytes: both device buffers read back whole, in one copy
  // (what the chunked copies to the device wrote) and in chunks (the chunked copies back).
  std::memset(buffers.host_destination.data(), 0, bytes);
  check(device->copy_async(memory::CopyStream::kDeviceToHost, buffers.host_destination.data(),
                           buffers.device_destination.data(), bytes));
  check(device->synchronize(memory::CopyStream::kDeviceToHost));
  const bool to_device_ok =
      std::memcmp(buffers.host_destination.data(), buffers.host_source.data(), bytes) == 0;
  std::memset(buffers.host_destination.data(), 0, bytes);
  (void)take(bench.one_direction(memory::CopyStream::kDeviceToHost));
  const bool to_host_ok =
      std::memcmp(buffers.host_destination.data(), buffers.host_source.data(), bytes) == 0;
  if (!to_device_ok || !to_host_ok) {
    fail(Status::error(STRATA_E_INTERNAL, std::string("the bytes copied ") +
                                              (to_device_ok ? "back from" : "to") +
                                              " the device do not match their source"));
  }

  const double mem = finetune::median(memcpy_rates);
  const double h2d = finetune::median(to_device), d2h = finetune::median(to_host);
  const double h2d_once = finetune::median(at_once_to_device);
  const double d2h_once = finetune::median(at_once_to_host);
  if (args.json) {
    nlohmann::ordered_json out = {{"device", device->name()},
                                  {"backend", memory::to_string(device->backend())},
                                  {"size_bytes", bytes},
                                  {"chunk_bytes", chunk_bytes},
                                  {"rounds", args.rounds},
                                  {"statistic", "median over rounds"},
                                  {"host_to_device_gbps", h2d},
                                  {"device_to_host_gbps", d2h},
                                  {"at_once_host_to_device_gbps", h2d_once},
                                  {"at_once_device_to_host_gbps", d2h_once},
                                  {"memcpy_gbps", mem},
                                  {"host_to_device_over_memcpy", mem > 0 ? h2d / mem : 0},
                                  {"device_to_host_over_memcpy", mem > 0 ? d2h / mem : 0},
                                  {"host_to_device_gbps_rounds", to_device},
                                  {"device_to_host_gbps_rounds", to_host},
                                  {"at_once_host_to_device_gbps_rounds", at_once_to_device},
                                  {"at_once_device_to_host_gbps_rounds", at_once_to_host},
                                  {"memcpy_gbps_rounds", memcpy_rates},
                                  {"load_average", finetune::load_average()}};
    std::printf("%s\n", out.dump().c_str());
    return;
  }
  Table table({"copy", "GB/s", "over memcpy"});
  table.add_row({"host to device", fixed(h2d, 2), fixed(mem > 0 ? h2d / mem : 0, 2)});
  table.add_row({"device to host", fixed(d2h, 2), fixed(mem > 0 ? d2h / mem : 0, 2)});
  table.add_row(
      {"host to device, both at once", fixed(h2d_once, 2), fixed(mem > 0 ? h2d_once / mem : 0, 2)});
  table.add_row(
      {"device to host, both at once", fixed(d2h_once, 2), fixed(mem > 0 ? d2h_once / mem : 0, 2)});
  table.add_row({"memcpy, host to host", fixed(mem, 2), "1.00"});
  std::printf("%s", table.render().c_str());
  std::printf(
      "\n%s: %s each way in %s copies, median of %u rounds (GB/s, decimal). Load average %.2f.\n",
      device->name().c_str(), format_bytes(bytes).c_str(), format_bytes(chunk_bytes).c_str(),
      args.rounds, finetune::load_average());
}

}  // namespace

void add_copy_command(CLI::App& bench) {
  auto args = std::make_shared<CopyArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "copy",
      "Copies between pinned host memory and the device (emulated or CUDA), each direction alone "
      "and both at once, beside memcpy (GB/s, decimal)");
  cmd->add_option("--size", args->size, "Bytes copied each way (K/M/G suffixes)")
      ->capture_default_str();
  cmd->add_option("--chunk", args->chunk, "Bytes per copy (the runtime's stream chunk: 4M)")
      ->capture_default_str();
  cmd->add_option("--rounds", args->rounds, "Rounds; the median is reported")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100u));
  cmd->add_option("--backend", args->backend, "auto, emulated or cuda")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "emulated", "cuda"}));
  cmd->add_flag("--json", args->json, "Print one JSON object instead of a table");
  cmd->callback([args] { run_copy_bench(*args); });
}

}  // namespace strata::bench
