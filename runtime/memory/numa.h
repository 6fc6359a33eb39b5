// Which NUMA node pinned memory goes on, decided from the machine's topology (hwloc).
//
// Pinned staging buffers are DMA targets of the GPU: on a two-socket machine, memory on the
// socket the GPU hangs off avoids crossing the inter-socket link on every copy. So the default
// node is the one nearest the GPU's PCI device; without a GPU, the node of the calling thread
// (where the CPU optimizer and the I/O completions run).
#pragma once

#include <hwloc.h>

#include <string>
#include <string_view>

#include "common/status.h"

namespace strata::memory {

// An hwloc topology (RAII).
class HwlocTopology {
 public:
  // The machine this process runs on. PCI devices (to locate a GPU) only when asked for: their
  // discovery reads sysfs for every device and goes through libpciaccess.
  static Result<HwlocTopology> load_system(bool with_pci_devices = false);
  // Topologies described in text, for tests: hwloc's XML export (it may contain PCI devices) or a
  // synthetic description ("pack:2 [numa] core:2 pu:1", no I/O).
  static Result<HwlocTopology> load_xml(std::string_view xml);
  static Result<HwlocTopology> load_synthetic(const std::string& description);

  HwlocTopology(HwlocTopology&& other) noexcept;
  HwlocTopology& operator=(HwlocTopology&& other) noexcept;
  HwlocTopology(const HwlocTopology&) = delete;
  HwlocTopology& operator=(const HwlocTopology&) = delete;
  ~HwlocTopology();

  hwloc_topology_t get() const { return topology_; }
  // Whether the topology describes this machine (binding memory needs that).
  bool is_this_system() const;
  int numa_node_count() const;
  bool has_numa_node(int os_index) const;

 private:
  explicit HwlocTopology(hwloc_topology_t topology) : topology_(topology) {}
  hwloc_topology_t topology_ = nullptr;
};

// The NUMA node (OS index) nearest a PCI device given as "0000:65:00.0" (cudaDeviceGetPCIBusId's
// form; "65:00.0" also works): a node of the device's closest non-I/O ancestor (its package or
// machine). STRATA_E_INVALID when the topology has no such device.
Result<int> numa_node_near_pci_device(const HwlocTopology& topology, std::string_view bus_id);

// The NUMA node of the CPU the calling thread last ran on. Needs the system topology.
Result<int> numa_node_of_calling_thread(const HwlocTopology& topology);

struct NumaChoice {
  int node = -1;
  std::string reason;  // "configured", "nearest GPU 0000:65:00.0", "calling thread's", ...
};

// configured >= 0: that node (STRATA_E_INVALID if it does not exist). Else the node nearest
// gpu_bus_id when given and found, else the calling thread's node, else node 0.
Result<NumaChoice> choose_numa_node(const HwlocTopology& topology, int configured,
                                    std::string_view gpu_bus_id);

}  // namespace strata::memory
