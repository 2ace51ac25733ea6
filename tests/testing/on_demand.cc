#include "testing/on_demand.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>

namespace gflow::testing {

Options onDemand(const std::string& transport, const std::string& algorithm) {
  Options o;
  o.transport = transport;
  o.connect = "lazy";
  o.shm.enabled = false;
  o.algorithm = algorithm;
  o.timeout = std::chrono::seconds(30);
  return o;
}

void allreduceExactly(Communicator& c, size_t count) {
  std::vector<int64_t> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = c.rank() * 1000003 + static_cast<int64_t>(i);
  c.allreduce(Tensor(v.data(), count, DataType::kInt64));
  const int64_t n = c.size();
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(v[i], 1000003 * n * (n - 1) / 2 + n * static_cast<int64_t>(i)) << "at " << i;
  }
}

void expectPeersOf(const std::string& algorithm, const std::vector<std::set<int>>& peers) {
  const int n = static_cast<int>(peers.size());
  for (int r = 0; r < n; ++r) {
    // Creation's exchanges (the allgather of host identities and settings)
    // go round the ring: the two neighbours. Recursive doubling and
    // halving-doubling add the partners r ^ 2^k. A full mesh: all n - 1.
    std::set<int> want = {(r + 1) % n, (r + n - 1) % n};
    if (algorithm != "ring") {
      for (int k = 1; k < n; k *= 2) want.insert(r ^ k);
    }
    // A rank that reached the barrier first may have connected already
    // (the dissemination barrier's partners r +- 2^k).
    std::set<int> may = want;
    for (int k = 1; k < n; k *= 2) may.insert({(r + k) % n, (r + n - k) % n});
    for (int p : want) {
      EXPECT_EQ(peers[r].count(p), 1u) << algorithm << ", rank " << r << " lacks " << p;
    }
    for (int p : peers[r]) {
      EXPECT_EQ(may.count(p), 1u) << algorithm << ", rank " << r << " holds " << p;
    }
  }
}

}  // namespace gflow::testing
