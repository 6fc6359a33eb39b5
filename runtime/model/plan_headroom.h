// Host RAM headroom: a job cannot pin every byte of a machine's RAM. The OS, the framework
// (Python, PyTorch), the CUDA context's host side and the data loader need their own, so the
// planner recommends the job's host bytes plus a stated margin, and a plan fits only when the
// recommended figure fits the RAM given. docs/planner.md, "Host RAM and headroom".
#pragma once

#include <cstdint>

namespace strata {

struct HostHeadroom {
  double fraction = 0.10;                      // of the job's own host bytes (fragmentation)
  uint64_t reserve_bytes = uint64_t{8} << 30;  // OS, framework, CUDA host side, data loader
};

// The RAM to have for a job whose states take `job_bytes`: job x (1 + fraction) + reserve,
// rounded up to a whole MiB.
uint64_t recommended_host_bytes(uint64_t job_bytes, const HostHeadroom& headroom);

// The inverse: how much of `host_ram_bytes` the job's states may take, (RAM - reserve) /
// (1 + fraction) with the RAM in whole MiB, rounded down to 4 KiB: the most whose
// recommended_host_bytes is at most the RAM; 0 when the reserve alone does not fit.
uint64_t usable_host_bytes(uint64_t host_ram_bytes, const HostHeadroom& headroom);

// A plan's host RAM, as `strata plan` reports it.
struct HostRam {
  uint64_t job_bytes = 0;          // what the plan's states take (simulated peak for NVMe)
  uint64_t recommended_bytes = 0;  // job_bytes with headroom: the fit test
  uint64_t full_speed_bytes = 0;   // least job bytes with nothing on NVMe (every state in RAM)
  uint64_t full_speed_recommended_bytes = 0;
};

}  // namespace strata
