// Topology::fromXml on a hand-written two-socket machine
// (two_numa_gpus_nics.xml):
//   socket 0: NUMA node 0 (cpus 0-3); on its host bridge GPU 0000:01:00.0
//             (hwloc CUDA device cuda0) and NIC 0000:02:00.0 (ens1f0 + mlx5_0).
//   socket 1: NUMA node 1 (cpus 4-7); on its host bridge NIC 0000:80:00.0
//             (ens2), and behind a PCIe switch GPU 0000:82:00.0 (no OS
//             device) and NIC 0000:83:00.0 (ib0 + mlx5_1, port down).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gflow/error.h"
#include "topology/topology.h"

namespace gflow::topology {
namespace {

const std::string kFixture =
    std::string(GFLOW_TEST_SOURCE_DIR) + "/tests/topology/two_numa_gpus_nics.xml";

const Topology& fixture() {
  static const Topology t = Topology::fromXml(kFixture);
  return t;
}

std::vector<std::string> nicNames(const Topology& t) {
  std::vector<std::string> names;
  for (const Nic& n : t.nics()) names.push_back(n.name);
  return names;
}

TEST(TopologyXml, NumaNodesCoresAndCpus) {
  const Topology& t = fixture();
  EXPECT_EQ(t.source(), "XML file " + kFixture);
  EXPECT_EQ(t.hostName(), "fixture");
  EXPECT_TRUE(t.ioKnown());
  ASSERT_EQ(t.numaNodes().size(), 2u);
  EXPECT_EQ(t.numaNodes()[0].cpus, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(t.numaNodes()[1].cpus, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(t.numaNodes()[1].memoryBytes, 64ull << 30);
  ASSERT_EQ(t.cores().size(), 4u);
  EXPECT_EQ(t.cores()[2].cpus, (std::vector<int>{4, 5}));
  EXPECT_EQ(t.cores()[2].numaNode, 1);
  EXPECT_EQ(t.cpuIds(), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(t.numaNodeOfCpu(2), 0);
  EXPECT_EQ(t.numaNodeOfCpu(5), 1);
  EXPECT_EQ(t.numaNodeOfCpu(8), -1);
}

TEST(TopologyXml, GpusByPciOrder) {
  const Topology& t = fixture();
  ASSERT_EQ(t.gpus().size(), 2u);
  // Only one GPU has a CUDA OS device, so indexes follow PCI bus order.
  EXPECT_EQ(t.gpus()[0].index, 0);
  EXPECT_EQ(t.gpus()[0].pciBusId, "0000:01:00.0");
  EXPECT_EQ(t.gpus()[0].name, "NVIDIA A100-SXM4-40GB");  // the CUDA device's model
  EXPECT_EQ(t.gpus()[0].numaNode, 0);
  EXPECT_EQ(t.gpus()[1].index, 1);
  EXPECT_EQ(t.gpus()[1].pciBusId, "0000:82:00.0");
  EXPECT_EQ(t.gpus()[1].name, "GA100 [A100 SXM4 40GB]");  // the PCI name
  EXPECT_EQ(t.gpus()[1].numaNode, 1);
  EXPECT_EQ(t.gpus()[1].localCpus, (std::vector<int>{4, 5, 6, 7}));

  // The forms CUDA and nvidia-smi print.
  EXPECT_EQ(t.gpuByPciBusId("00000000:82:00.0"), &t.gpus()[1]);
  EXPECT_EQ(t.gpuByPciBusId("0000:01:00.0"), &t.gpus()[0]);
  EXPECT_EQ(t.gpuByPciBusId("0000:82:00.1"), nullptr);
  EXPECT_EQ(t.gpuByPciBusId("not a bus id"), nullptr);
  EXPECT_EQ(t.gpu(2), nullptr);
}

TEST(TopologyXml, NicsWithKindBusIdNodeAndLink) {
  const Topology& t = fixture();
  EXPECT_EQ(nicNames(t), (std::vector<std::string>{"ens1f0", "ens2", "ib0", "mlx5_0", "mlx5_1"}));
  const Nic* mlx0 = t.nic("mlx5_0");
  ASSERT_NE(mlx0, nullptr);
  EXPECT_EQ(mlx0->kind, NicKind::kOpenFabrics);
  EXPECT_EQ(mlx0->pciBusId, "0000:02:00.0");
  EXPECT_EQ(mlx0->numaNode, 0);
  EXPECT_EQ(mlx0->link, LinkState::kUp);
  EXPECT_EQ(t.nic("mlx5_1")->link, LinkState::kDown);
  const Nic* ens2 = t.nic("ens2");
  ASSERT_NE(ens2, nullptr);
  EXPECT_EQ(ens2->kind, NicKind::kNet);
  EXPECT_EQ(ens2->pciBusId, "0000:80:00.0");
  EXPECT_EQ(ens2->numaNode, 1);
  // Another machine's interface state cannot be read from here.
  EXPECT_EQ(ens2->link, LinkState::kUnknown);
}

TEST(TopologyXml, NearestNicOfEachGpuIsOnItsNumaNode) {
  const Topology& t = fixture();
  for (const Gpu& g : t.gpus()) {
    const Nic* n = t.nearestNicToGpu(g.index);
    ASSERT_NE(n, nullptr) << "gpu " << g.index;
    EXPECT_EQ(n->numaNode, g.numaNode) << "gpu " << g.index << " -> " << n->name;
  }
  // GPU 0 shares a host bridge with ens1f0/mlx5_0: equal distance, name decides.
  EXPECT_EQ(t.nearestNicToGpu(0)->name, "ens1f0");
  EXPECT_EQ(t.nearestNicToGpu(0, NicKind::kOpenFabrics)->name, "mlx5_0");
  // GPU 1 shares a PCIe switch with ib0/mlx5_1: deeper than ens2's host
  // bridge, even though "ens2" sorts first.
  EXPECT_EQ(t.nearestNicToGpu(1)->name, "ib0");
  EXPECT_EQ(t.nearestNicToGpu(1, NicKind::kNet)->name, "ib0");
  EXPECT_EQ(t.nearestNicToGpu(1, NicKind::kOpenFabrics)->name, "mlx5_1");
  EXPECT_EQ(t.nearestNicToGpu(7), nullptr);
}

TEST(TopologyXml, NearestNicOfACpu) {
  const Topology& t = fixture();
  EXPECT_EQ(t.nearestNicToCpu(1)->name, "ens1f0");
  EXPECT_EQ(t.nearestNicToCpu(1, NicKind::kOpenFabrics)->name, "mlx5_0");
  // Same package for ens2, ib0 and mlx5_1; ens2 is fewer hops away.
  EXPECT_EQ(t.nearestNicToCpu(5)->name, "ens2");
  EXPECT_EQ(t.nearestNicToCpu(5, NicKind::kOpenFabrics)->name, "mlx5_1");
  EXPECT_EQ(t.nearestNicToCpu(99), nullptr);
}

TEST(TopologyXml, CpusNearANicAreItsNodesCpus) {
  const Topology& t = fixture();
  EXPECT_EQ(t.cpusNear("mlx5_0"), t.numaNode(0)->cpus);
  EXPECT_EQ(t.cpusNear("ens1f0"), t.numaNode(0)->cpus);
  EXPECT_EQ(t.cpusNear("ib0"), t.numaNode(1)->cpus);
  EXPECT_EQ(t.cpusNear("ens2"), t.numaNode(1)->cpus);
  EXPECT_EQ(t.cpusNear("eth9"), t.cpuIds());
}

TEST(TopologyXml, Describe) {
  const std::string d = fixture().describe();
  EXPECT_NE(d.find("Topology of fixture (XML file "), std::string::npos) << d;
  EXPECT_NE(d.find("NUMA nodes: 2"), std::string::npos) << d;
  EXPECT_NE(d.find("node 1: cpus 4-7 (4), 64.0 GiB"), std::string::npos) << d;
  EXPECT_NE(d.find("Cores: 4, hardware threads: 8 (2 per core)"), std::string::npos) << d;
  EXPECT_NE(d.find("gpu 1: 0000:82:00.0 GA100 [A100 SXM4 40GB], NUMA node 1, nearest NIC "
                   "mlx5_1 (openfabrics), ib0 (net)"),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("mlx5_1: openfabrics, PCI 0000:83:00.0, NUMA node 1, cpus 4-7, link down"),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("node 1: mlx5_1 (openfabrics), ens2 (net)"), std::string::npos) << d;
}

TEST(TopologyXml, MissingFileIsAClearError) {
  try {
    Topology::fromXml("/nonexistent/topo.xml");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(e.detail().find("/nonexistent/topo.xml"), std::string::npos) << e.what();
  }
}

TEST(TopologyXml, MalformedFileIsAClearError) {
  char path[] = "/tmp/gflow_topology_test.XXXXXX";
  int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  std::ofstream(path) << "<topology version=\"2.0\"><object type=\"Machine\"";
  try {
    Topology::fromXml(path);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(e.detail().find(path), std::string::npos) << e.what();
  }
  std::remove(path);
}

}  // namespace
}  // namespace gflow::topology
