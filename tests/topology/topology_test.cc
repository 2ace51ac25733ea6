// Topology::discover() on the machine running the tests: whatever it is, the
// result must be self-consistent and cover every cpu this process may use.
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <set>
#include <thread>
#include <vector>

#include "topology/pinning.h"
#include "topology/topology.h"

namespace gflow::topology {
namespace {

TEST(Topology, DiscoverFindsNumaNodesAndEveryAllowedCpu) {
  const Topology& t = Topology::discover();
  EXPECT_EQ(t.source(), "this machine");
  ASSERT_GE(t.numaNodes().size(), 1u);
  ASSERT_GE(t.cpus().size(), 1u);
  EXPECT_GE(t.cores().size(), 1u);

  const std::vector<int> ids = t.cpuIds();
  EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end()));
  const std::vector<int> affinity = currentThreadAffinity();
  ASSERT_FALSE(affinity.empty());
  for (int cpu : affinity) {
    EXPECT_TRUE(std::binary_search(ids.begin(), ids.end(), cpu)) << "cpu " << cpu;
  }
  // hwloc leaves out cpus a cgroup forbids; otherwise it sees every online cpu.
  const unsigned online = std::thread::hardware_concurrency();
  EXPECT_LE(ids.size(), online);
  if (affinity.size() == online) {
    EXPECT_EQ(ids.size(), online);
  }
}

TEST(Topology, NodesAndCoresPartitionTheCpus) {
  const Topology& t = Topology::discover();
  std::multiset<int> fromNodes, fromCores;
  for (const NumaNode& n : t.numaNodes()) fromNodes.insert(n.cpus.begin(), n.cpus.end());
  for (const Core& c : t.cores()) {
    EXPECT_FALSE(c.cpus.empty());
    fromCores.insert(c.cpus.begin(), c.cpus.end());
  }
  const std::vector<int> ids = t.cpuIds();
  EXPECT_EQ(fromNodes, std::multiset<int>(ids.begin(), ids.end()));
  EXPECT_EQ(fromCores, std::multiset<int>(ids.begin(), ids.end()));
  for (const Topology::Cpu& c : t.cpus()) {
    EXPECT_GE(c.numaNode, 0) << "cpu " << c.id;
    EXPECT_EQ(t.numaNodeOfCpu(c.id), c.numaNode);
    ASSERT_GE(c.core, 0);
    const auto& coreCpus = t.cores()[static_cast<size_t>(c.core)].cpus;
    EXPECT_TRUE(std::binary_search(coreCpus.begin(), coreCpus.end(), c.id));
  }
  EXPECT_EQ(t.numaNodeOfCpu(1 << 20), -1);
}

TEST(Topology, DiscoverIsCachedAndThreadSafe) {
  std::vector<const Topology*> seen(4, nullptr);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < seen.size(); ++i) {
    threads.emplace_back([&seen, i] { seen[i] = &Topology::discover(); });
  }
  for (auto& th : threads) th.join();
  for (const Topology* p : seen) EXPECT_EQ(p, &Topology::discover());
}

TEST(Topology, DevicesAreLocatedWithinTheMachine) {
  const Topology& t = Topology::discover();
  const std::vector<int> ids = t.cpuIds();
  for (const Nic& n : t.nics()) {
    EXPECT_FALSE(n.name.empty());
    EXPECT_EQ(t.nic(n.name), &n);
    EXPECT_FALSE(n.ancestry.empty());
    const std::vector<int> near = t.cpusNear(n.name);
    EXPECT_FALSE(near.empty()) << n.name;
    EXPECT_TRUE(std::includes(ids.begin(), ids.end(), near.begin(), near.end())) << n.name;
    if (n.numaNode >= 0) {
      EXPECT_NE(t.numaNode(n.numaNode), nullptr) << n.name;
    }
  }
  for (const Gpu& g : t.gpus()) {
    EXPECT_EQ(g.pciBusId.size(), 12u) << g.pciBusId;  // dddd:bb:dd.f
    EXPECT_EQ(t.gpuByPciBusId(g.pciBusId), &g);
  }
  if (!t.cpus().empty() && !t.nics().empty()) {
    EXPECT_NE(t.nearestNicToCpu(t.cpus().front().id), nullptr);
  }
}

TEST(Topology, UnknownNicIsNearEveryCpu) {
  const Topology& t = Topology::discover();
  EXPECT_EQ(t.nic("no-such-nic0"), nullptr);
  EXPECT_EQ(t.cpusNear("no-such-nic0"), t.cpuIds());
  EXPECT_EQ(t.cpusNear(""), t.cpuIds());
}

TEST(Topology, DescribeReportsWhatWasFound) {
  const Topology& t = Topology::discover();
  const std::string d = t.describe();
  EXPECT_NE(d.find("NUMA nodes: " + std::to_string(t.numaNodes().size())), std::string::npos) << d;
  EXPECT_NE(d.find("hardware threads: " + std::to_string(t.cpus().size())), std::string::npos) << d;
  for (const Nic& n : t.nics()) EXPECT_NE(d.find(n.name), std::string::npos) << d;
}

TEST(Topology, EmptyTopologyAnswersSafely) {
  Topology t;
  EXPECT_TRUE(t.cpuIds().empty());
  EXPECT_EQ(t.numaNodeOfCpu(0), -1);
  EXPECT_EQ(t.nearestNicToGpu(0), nullptr);
  EXPECT_EQ(t.nearestNicToCpu(0), nullptr);
  EXPECT_TRUE(t.cpusNear("eth0").empty());
  EXPECT_FALSE(t.describe().empty());
}

TEST(Topology, FormatCpuList) {
  EXPECT_EQ(formatCpuList({}), "");
  EXPECT_EQ(formatCpuList({3}), "3");
  EXPECT_EQ(formatCpuList({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(formatCpuList({1, 3, 5}), "1,3,5");
}

}  // namespace
}  // namespace gflow::topology
