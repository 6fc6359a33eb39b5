#include "memory/numa.h"

#include <cerrno>
#include <utility>

namespace strata::memory {
namespace {

// Creates a topology, keeping PCI devices when asked (hwloc drops I/O objects by default), lets
// `setup` choose the source, then loads it.
template <typename Setup>
Result<hwloc_topology_t> load(Setup setup, const char* what, bool with_pci_devices = true) {
  hwloc_topology_t topology = nullptr;
  if (hwloc_topology_init(&topology) != 0) {
    return errno_status(STRATA_E_NOMEM, std::string("hwloc_topology_init for ") + what, errno);
  }
  if (with_pci_devices) {
    hwloc_topology_set_io_types_filter(topology, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  }
  if (setup(topology) != 0 || hwloc_topology_load(topology) != 0) {
    const int error = errno;
    hwloc_topology_destroy(topology);
    return errno_status(STRATA_E_INVALID, std::string("loading the hwloc topology from ") + what,
                        error);
  }
  return topology;
}

// The first NUMA node (by OS index) in a nodeset, or -1.
int first_node(hwloc_const_nodeset_t nodeset) {
  return nodeset == nullptr ? -1 : hwloc_bitmap_first(nodeset);
}

}  // namespace

Result<HwlocTopology> HwlocTopology::load_system(bool with_pci_devices) {
  STRATA_ASSIGN_OR_RETURN(hwloc_topology_t t, load([](hwloc_topology_t) { return 0; },
                                                   "this system", with_pci_devices));
  return HwlocTopology(t);
}

Result<HwlocTopology> HwlocTopology::load_xml(std::string_view xml) {
  const std::string text(xml);
  Result<hwloc_topology_t> t = load(
      [&](hwloc_topology_t topology) {
        return hwloc_topology_set_xmlbuffer(topology, text.c_str(),
                                            static_cast<int>(text.size()) + 1);
      },
      "an XML description");
  if (!t.is_ok()) return std::move(t).take_status();
  return HwlocTopology(*t);
}

Result<HwlocTopology> HwlocTopology::load_synthetic(const std::string& description) {
  Result<hwloc_topology_t> t = load(
      [&](hwloc_topology_t topology) {
        return hwloc_topology_set_synthetic(topology, description.c_str());
      },
      ("the synthetic description \"" + description + "\"").c_str());
  if (!t.is_ok()) return std::move(t).take_status();
  return HwlocTopology(*t);
}

HwlocTopology::HwlocTopology(HwlocTopology&& other) noexcept
    : topology_(std::exchange(other.topology_, nullptr)) {}

HwlocTopology& HwlocTopology::operator=(HwlocTopology&& other) noexcept {
  if (this != &other) {
    if (topology_ != nullptr) hwloc_topology_destroy(topology_);
    topology_ = std::exchange(other.topology_, nullptr);
  }
  return *this;
}

HwlocTopology::~HwlocTopology() {
  if (topology_ != nullptr) hwloc_topology_destroy(topology_);
}

bool HwlocTopology::is_this_system() const {
  return hwloc_topology_is_thissystem(topology_) != 0;
}

int HwlocTopology::numa_node_count() const {
  return hwloc_get_nbobjs_by_type(topology_, HWLOC_OBJ_NUMANODE);
}

bool HwlocTopology::has_numa_node(int os_index) const {
  if (os_index < 0) return false;
  return hwloc_get_numanode_obj_by_os_index(topology_, static_cast<unsigned>(os_index)) != nullptr;
}

Result<int> numa_node_near_pci_device(const HwlocTopology& topology, std::string_view bus_id) {
  const std::string id(bus_id);
  hwloc_obj_t device = hwloc_get_pcidev_by_busidstring(topology.get(), id.c_str());
  if (device == nullptr) {
    return invalid_argument("PCI device " + id + " is not in the hwloc topology");
  }
  hwloc_obj_t ancestor = hwloc_get_non_io_ancestor_obj(topology.get(), device);
  const int node = ancestor != nullptr ? first_node(ancestor->nodeset) : -1;
  if (node < 0) return invalid_argument("PCI device " + id + " has no NUMA node nearby");
  return node;
}

Result<int> numa_node_of_calling_thread(const HwlocTopology& topology) {
  if (!topology.is_this_system()) {
    return unsupported("the calling thread's NUMA node needs the system topology");
  }
  hwloc_bitmap_t cpus = hwloc_bitmap_alloc();
  if (cpus == nullptr) return Status::error(STRATA_E_NOMEM, "hwloc_bitmap_alloc");
  int node = -1;
  if (hwloc_get_last_cpu_location(topology.get(), cpus, HWLOC_CPUBIND_THREAD) == 0) {
    // The NUMA node whose CPUs include the one we ran on.
    for (hwloc_obj_t n = hwloc_get_next_obj_by_type(topology.get(), HWLOC_OBJ_NUMANODE, nullptr);
         n != nullptr; n = hwloc_get_next_obj_by_type(topology.get(), HWLOC_OBJ_NUMANODE, n)) {
      if (n->cpuset != nullptr && hwloc_bitmap_intersects(n->cpuset, cpus)) {
        node = static_cast<int>(n->os_index);
        break;
      }
    }
  }
  const int error = errno;
  hwloc_bitmap_free(cpus);
  if (node < 0) return errno_status(STRATA_E_UNSUPPORTED, "finding the thread's NUMA node", error);
  return node;
}

Result<NumaChoice> choose_numa_node(const HwlocTopology& topology, int configured,
                                    std::string_view gpu_bus_id) {
  if (configured >= 0) {
    if (!topology.has_numa_node(configured)) {
      return invalid_argument("NUMA node " + std::to_string(configured) +
                              " does not exist (this machine has " +
                              std::to_string(topology.numa_node_count()) + " NUMA nodes)");
    }
    return NumaChoice{configured, "configured"};
  }
  std::string why_not_gpu;
  if (!gpu_bus_id.empty()) {
    Result<int> near = numa_node_near_pci_device(topology, gpu_bus_id);
    if (near.is_ok()) return NumaChoice{*near, "nearest GPU " + std::string(gpu_bus_id)};
    why_not_gpu = " (" + near.status().message() + ")";
  }
  if (Result<int> own = numa_node_of_calling_thread(topology); own.is_ok()) {
    return NumaChoice{*own, "calling thread's" + why_not_gpu};
  }
  hwloc_obj_t first = hwloc_get_next_obj_by_type(topology.get(), HWLOC_OBJ_NUMANODE, nullptr);
  return NumaChoice{first != nullptr ? static_cast<int>(first->os_index) : 0,
                    "first node" + why_not_gpu};
}

}  // namespace strata::memory
