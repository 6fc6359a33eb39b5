#include "memory/numa.h"

#include <gtest/gtest.h>

namespace strata::memory {
namespace {

// Two sockets, one NUMA node each; an NVMe drive hangs off socket 0 and a GPU (an H100's PCI ids)
// off socket 1, as on a typical dual-socket GPU server.
constexpr const char* kTwoSocketsGpuOnSocket1 = R"(<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x0000000f" complete_cpuset="0x0000000f" allowed_cpuset="0x0000000f" nodeset="0x00000003" complete_nodeset="0x00000003" allowed_nodeset="0x00000003" gp_index="1">
    <object type="Package" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="2">
      <object type="NUMANode" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="3" local_memory="68719476736"/>
      <object type="Core" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="4">
        <object type="PU" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="5"/>
      </object>
      <object type="Core" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="6">
        <object type="PU" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="7"/>
      </object>
      <object type="Bridge" gp_index="20" bridge_type="0-1" depth="0" bridge_pci="0000:[00-00]">
        <object type="PCIDev" gp_index="21" pci_busid="0000:00:02.0" pci_type="0108 [144d:a80a] [144d:a801] 00" pci_link_speed="0.000000"/>
      </object>
    </object>
    <object type="Package" os_index="1" cpuset="0x0000000c" complete_cpuset="0x0000000c" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="8">
      <object type="NUMANode" os_index="1" cpuset="0x0000000c" complete_cpuset="0x0000000c" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="9" local_memory="68719476736"/>
      <object type="Core" os_index="2" cpuset="0x00000004" complete_cpuset="0x00000004" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="10">
        <object type="PU" os_index="2" cpuset="0x00000004" complete_cpuset="0x00000004" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="11"/>
      </object>
      <object type="Core" os_index="3" cpuset="0x00000008" complete_cpuset="0x00000008" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="12">
        <object type="PU" os_index="3" cpuset="0x00000008" complete_cpuset="0x00000008" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="13"/>
      </object>
      <object type="Bridge" gp_index="22" bridge_type="0-1" depth="0" bridge_pci="0000:[65-65]">
        <object type="PCIDev" gp_index="23" pci_busid="0000:65:00.0" pci_type="0302 [10de:2330] [10de:16c1] a1" pci_link_speed="31.507999"/>
      </object>
    </object>
  </object>
</topology>
)";

TEST(Numa, TheGpuUnderSocket1IsNearestNode1) {
  Result<HwlocTopology> topology = HwlocTopology::load_xml(kTwoSocketsGpuOnSocket1);
  ASSERT_TRUE(topology.is_ok()) << topology.status().message();
  EXPECT_EQ(topology->numa_node_count(), 2);
  EXPECT_FALSE(topology->is_this_system());

  Result<int> node = numa_node_near_pci_device(*topology, "0000:65:00.0");
  ASSERT_TRUE(node.is_ok()) << node.status().message();
  EXPECT_EQ(*node, 1);
  // The short form cudaDeviceGetPCIBusId never gives, but people type.
  Result<int> short_form = numa_node_near_pci_device(*topology, "65:00.0");
  ASSERT_TRUE(short_form.is_ok());
  EXPECT_EQ(*short_form, 1);
}

TEST(Numa, ADeviceUnderSocket0IsNearestNode0) {
  Result<HwlocTopology> topology = HwlocTopology::load_xml(kTwoSocketsGpuOnSocket1);
  ASSERT_TRUE(topology.is_ok());
  Result<int> node = numa_node_near_pci_device(*topology, "0000:00:02.0");
  ASSERT_TRUE(node.is_ok());
  EXPECT_EQ(*node, 0);
}

TEST(Numa, AnUnknownBusIdIsAnErrorNotAGuess) {
  Result<HwlocTopology> topology = HwlocTopology::load_xml(kTwoSocketsGpuOnSocket1);
  ASSERT_TRUE(topology.is_ok());
  Result<int> node = numa_node_near_pci_device(*topology, "0000:17:00.0");
  ASSERT_FALSE(node.is_ok());
  EXPECT_EQ(node.status().code(), STRATA_E_INVALID);
  EXPECT_NE(node.status().message().find("0000:17:00.0"), std::string::npos);
}

TEST(Numa, ChoiceDefaultsToTheGpusNodeAndHonoursConfiguration) {
  Result<HwlocTopology> topology = HwlocTopology::load_xml(kTwoSocketsGpuOnSocket1);
  ASSERT_TRUE(topology.is_ok());

  Result<NumaChoice> gpu = choose_numa_node(*topology, -1, "0000:65:00.0");
  ASSERT_TRUE(gpu.is_ok());
  EXPECT_EQ(gpu->node, 1);
  EXPECT_NE(gpu->reason.find("nearest GPU"), std::string::npos);

  Result<NumaChoice> configured = choose_numa_node(*topology, 0, "0000:65:00.0");
  ASSERT_TRUE(configured.is_ok());
  EXPECT_EQ(configured->node, 0);
  EXPECT_EQ(configured->reason, "configured");

  Result<NumaChoice> missing = choose_numa_node(*topology, 7, "");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), STRATA_E_INVALID);
  EXPECT_NE(missing.status().message().find("2 NUMA nodes"), std::string::npos);

  // A GPU the topology does not know: no thread location on a foreign topology either, so the
  // first node, with the reason saying why.
  Result<NumaChoice> unknown = choose_numa_node(*topology, -1, "0000:99:00.0");
  ASSERT_TRUE(unknown.is_ok());
  EXPECT_EQ(unknown->node, 0);
  EXPECT_NE(unknown->reason.find("0000:99:00.0"), std::string::npos);
}

TEST(Numa, SyntheticTopologiesHaveTheirNodes) {
  Result<HwlocTopology> topology = HwlocTopology::load_synthetic("pack:2 [numa] core:4 pu:2");
  ASSERT_TRUE(topology.is_ok()) << topology.status().message();
  EXPECT_EQ(topology->numa_node_count(), 2);
  EXPECT_TRUE(topology->has_numa_node(1));
  EXPECT_FALSE(topology->has_numa_node(2));
  // No PCI devices in a synthetic topology.
  EXPECT_FALSE(numa_node_near_pci_device(*topology, "0000:65:00.0").is_ok());
}

TEST(Numa, BadDescriptionsAreErrors) {
  EXPECT_FALSE(HwlocTopology::load_xml("<not a topology").is_ok());
  EXPECT_FALSE(HwlocTopology::load_synthetic("pack:two").is_ok());
}

TEST(Numa, WithoutAGpuTheCallingThreadsNodeIsUsed) {
  Result<HwlocTopology> topology = HwlocTopology::load_system();
  ASSERT_TRUE(topology.is_ok()) << topology.status().message();
  EXPECT_TRUE(topology->is_this_system());
  Result<NumaChoice> choice = choose_numa_node(*topology, -1, "");
  ASSERT_TRUE(choice.is_ok());
  EXPECT_TRUE(topology->has_numa_node(choice->node));
  Result<int> own = numa_node_of_calling_thread(*topology);
  ASSERT_TRUE(own.is_ok()) << own.status().message();
  // The thread may move between sockets between the two calls; on one node it cannot.
  if (topology->numa_node_count() == 1) EXPECT_EQ(choice->node, *own);
  EXPECT_NE(choice->reason.find("calling thread"), std::string::npos);
}

}  // namespace
}  // namespace strata::memory
