// Pinning policy (planPin, on the two-socket fixture) and its effect on real
// threads of this machine (pinCurrentThreadNear, the engine's worker).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/params.h"
#include "core/executor.h"
#include "topology/hwloc_machine.h"
#include "topology/pinning.h"
#include "topology/topology.h"

namespace gflow::topology {
namespace {

const Topology& fixture() {
  static const Topology t = Topology::fromXml(std::string(GFLOW_TEST_SOURCE_DIR) +
                                              "/tests/topology/two_numa_gpus_nics.xml");
  return t;
}

const std::vector<int> kNode0{0, 1, 2, 3};
const std::vector<int> kNode1{4, 5, 6, 7};

// Sets GFLOW_PIN for one test and restores the environment afterwards.
class PinEnv {
 public:
  explicit PinEnv(const char* value) {
    if (const char* old = std::getenv("GFLOW_PIN")) {
      had_ = true;
      old_ = old;
    }
    setenv("GFLOW_PIN", value, 1);
    params::resetCacheForTesting();
  }
  ~PinEnv() {
    if (had_) {
      setenv("GFLOW_PIN", old_.c_str(), 1);
    } else {
      unsetenv("GFLOW_PIN");
    }
    params::resetCacheForTesting();
  }

 private:
  bool had_ = false;
  std::string old_;
};

// Runs `fn` on a fresh thread, so pinning never touches the test's own thread.
template <typename Fn>
void onFreshThread(Fn fn) {
  std::thread(fn).join();
}

TEST(TopologyPinning, PlanPinsNearTheNicsNode) {
  PinPlan p = planPin(fixture(), "mlx5_1", {}, -1);
  EXPECT_TRUE(p.bind);
  EXPECT_EQ(p.cpus, kNode1);
  EXPECT_NE(p.reason.find("near NIC mlx5_1 (NUMA node 1)"), std::string::npos) << p.reason;

  p = planPin(fixture(), "ens1f0", {}, 6);  // the NIC wins over the hint
  EXPECT_TRUE(p.bind);
  EXPECT_EQ(p.cpus, kNode0);
}

TEST(TopologyPinning, PlanKeepsWithinTheAllowedCpus) {
  PinPlan p = planPin(fixture(), "ib0", {5, 2, 3, 4}, -1);
  EXPECT_TRUE(p.bind);
  EXPECT_EQ(p.cpus, (std::vector<int>{4, 5}));
}

TEST(TopologyPinning, PlanLeavesAThreadOnOneNodeAlone) {
  // The launcher bound the rank to node 0: its placement is not overridden.
  PinPlan p = planPin(fixture(), "mlx5_1", {0, 1}, -1);
  EXPECT_FALSE(p.bind);
  EXPECT_NE(p.reason.find("one NUMA node"), std::string::npos) << p.reason;
}

TEST(TopologyPinning, PlanWithoutAKnownNicUsesTheStartingCpusNode) {
  PinPlan p = planPin(fixture(), "", {}, 6);
  EXPECT_TRUE(p.bind);
  EXPECT_EQ(p.cpus, kNode1);

  p = planPin(fixture(), "lo", {}, 1);
  EXPECT_TRUE(p.bind);
  EXPECT_EQ(p.cpus, kNode0);
  EXPECT_NE(p.reason.find("NIC lo not found"), std::string::npos) << p.reason;

  p = planPin(fixture(), "", {}, -1);
  EXPECT_FALSE(p.bind);
}

TEST(TopologyPinning, PlanOnAnEmptyTopologyDoesNothing) {
  EXPECT_FALSE(planPin(Topology(), "eth0", {0, 1}, 0).bind);
}

TEST(TopologyPinning, PlanOnThisMachineStaysWithinTheAllowedCpus) {
  const Topology& t = Topology::discover();
  const std::vector<int> allowed = currentThreadAffinity();
  PinPlan p = planPin(t, "", allowed, currentCpu());
  if (t.numaNodes().size() == 1) {
    EXPECT_FALSE(p.bind) << p.reason;
  }
  EXPECT_TRUE(std::includes(allowed.begin(), allowed.end(), p.cpus.begin(), p.cpus.end()));
}

// The binding itself, which a one-node machine never reaches through planPin.
TEST(TopologyPinning, BindCurrentThreadNarrowsItsAffinity) {
  onFreshThread([] {
    const std::vector<int> before = currentThreadAffinity();
    ASSERT_FALSE(before.empty());
    EXPECT_EQ(machine::bindCurrentThread({before.back()}), "");
    EXPECT_EQ(currentThreadAffinity(), std::vector<int>{before.back()});
  });
}

TEST(TopologyPinning, BindToACpuThatDoesNotExistFailsWithoutThrowing) {
  onFreshThread([] {
    const std::vector<int> before = currentThreadAffinity();
    EXPECT_NE(machine::bindCurrentThread({1 << 20}), "");
    EXPECT_EQ(currentThreadAffinity(), before);
  });
}

TEST(TopologyPinning, DisabledByGflowPin0) {
  PinEnv env("0");
  onFreshThread([] {
    const std::vector<int> before = currentThreadAffinity();
    PinPlan p = pinCurrentThreadNear("mlx5_0");
    EXPECT_FALSE(p.bind);
    EXPECT_EQ(p.reason, "GFLOW_PIN=0");
    EXPECT_EQ(currentThreadAffinity(), before);
  });
}

TEST(TopologyPinning, DisabledByOptionsOverGflowPin1) {
  PinEnv env("1");
  onFreshThread([] {
    const std::vector<int> before = currentThreadAffinity();
    PinPlan p = pinCurrentThreadNear("mlx5_0", -1, false);
    EXPECT_FALSE(p.bind);
    EXPECT_EQ(p.reason, "Options::progress.pinThreads=false");
    EXPECT_EQ(currentThreadAffinity(), before);
  });
}

TEST(TopologyPinning, PinningStaysWithinTheAllowedCpus) {
  PinEnv env("1");
  const std::string nic = Topology::discover().nics().empty()
                              ? std::string("")
                              : Topology::discover().nics().front().name;
  for (const std::string& name : {std::string(""), nic, std::string("no-such-nic0")}) {
    onFreshThread([&] {
      const std::vector<int> before = currentThreadAffinity();
      PinPlan p = pinCurrentThreadNear(name);
      const std::vector<int> after = currentThreadAffinity();
      EXPECT_FALSE(after.empty());
      EXPECT_TRUE(std::includes(before.begin(), before.end(), after.begin(), after.end()))
          << "nic '" << name << "': " << p.reason;
      EXPECT_EQ(after, p.bind ? p.cpus : before) << "nic '" << name << "': " << p.reason;
    });
  }
}

TEST(TopologyPinning, InvalidGflowPinNeverFails) {
  PinEnv env("maybe");
  onFreshThread([] {
    const std::vector<int> before = currentThreadAffinity();
    PinPlan p = pinCurrentThreadNear("");
    EXPECT_FALSE(p.bind);
    EXPECT_NE(p.reason.find("GFLOW_PIN"), std::string::npos) << p.reason;
    EXPECT_EQ(currentThreadAffinity(), before);
  });
}

// The engine's worker (gflow's progress thread) pins itself before its first
// op, and only within what the starting thread allowed.
std::vector<int> workerAffinity(Executor& engine) {
  std::vector<int> seen;
  auto work = engine.submit([&] { seen = currentThreadAffinity(); }, /*blocking=*/false);
  work->wait(std::chrono::milliseconds(0));
  return seen;
}

TEST(TopologyPinning, EngineWorkerIsPinnedWithinTheAllowedCpus) {
  PinEnv env("1");
  const std::vector<int> allowed = currentThreadAffinity();
  Executor engine;
  engine.setPinNear("");
  const std::vector<int> seen = workerAffinity(engine);
  ASSERT_FALSE(seen.empty());
  EXPECT_TRUE(std::includes(allowed.begin(), allowed.end(), seen.begin(), seen.end()));
  PinPlan expected = planPin(Topology::discover(), "", allowed, currentCpu());
  if (!expected.bind && Topology::discover().numaNodes().size() == 1) {
    EXPECT_EQ(seen, allowed);
  }
}

TEST(TopologyPinning, EngineWorkerIsNotPinnedWithGflowPin0) {
  PinEnv env("0");
  const std::vector<int> allowed = currentThreadAffinity();
  Executor engine;  // default: near the data interface
  EXPECT_EQ(workerAffinity(engine), allowed);
}

}  // namespace
}  // namespace gflow::topology
