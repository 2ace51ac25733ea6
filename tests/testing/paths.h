// The host paths a world of ranks-as-threads can take, for tests that run
// the same checks on each: shared memory on (the default on one host),
// the network transport alone (TCP), two pretend hosts (the first half of
// the ranks on one), and verbs on the software RDMA device.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "gflow/gflow.h"
#include "testing/ranks.h"
#include "testing/soft_verbs.h"

namespace gflow::testing {

enum class WorldPath { kShm, kNetwork, kTwoHosts, kVerbs };
using PathParam = std::tuple<WorldPath, int>;  // the path and the world size

inline std::vector<std::shared_ptr<Communicator>> worldOnPath(WorldPath p, int n,
                                                              Options o = Options{}) {
  if (p == WorldPath::kNetwork) o.shm.enabled = false;
  if (p == WorldPath::kVerbs) o.transport = "verbs";
  if (p != WorldPath::kTwoHosts) return makeWorld(n, o);
  std::vector<int> hostOf(n);
  for (int r = 0; r < n; ++r) hostOf[r] = r < (n + 1) / 2 ? 0 : 1;
  return makeWorldWith(n, onHosts(hostOf, o));
}

inline std::string pathName(const ::testing::TestParamInfo<PathParam>& p) {
  static const char* const kNames[] = {"shm", "network", "two_hosts", "verbs"};
  return std::string(kNames[int(std::get<0>(p.param))]) + "_n" +
         std::to_string(std::get<1>(p.param));
}

// A fixture over PathParam: the software RDMA device is installed for the
// verbs path while the test runs.
class OnPaths : public ::testing::TestWithParam<PathParam> {
 protected:
  void SetUp() override {
    if (std::get<0>(GetParam()) == WorldPath::kVerbs) device_.emplace();
  }
  std::vector<std::shared_ptr<Communicator>> world(Options o = Options{}) {
    return worldOnPath(std::get<0>(GetParam()), std::get<1>(GetParam()), o);
  }
  int n() const { return std::get<1>(GetParam()); }

 private:
  std::optional<softverbs::Installed> device_;
};

}  // namespace gflow::testing
