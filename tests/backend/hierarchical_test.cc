// The hierarchical backend (src/backend/hierarchical/) driven directly: a
// Hierarchy learned from per-rank host hashes, `local` = a host backend over
// a loopback TCP context of the host's ranks, `cross` = a host backend over
// the ranks with this rank's local rank. Ranks are threads; results are
// checked against exact references over the whole world (the composition
// must equal one flat collective over every rank).
//
// The test binary's GFLOW_HIER_SEGMENT (4 KiB, tests/testing/test_env.cc)
// makes allreduces of a few thousand elements run as pipelined segments.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/collective_checks.h"
#include "backend/hierarchical/hierarchical.h"
#include "backend/loopback.h"
#include "testing/values.h"

namespace gflow {
namespace {

using backend::Algorithm;
using backend::Backend;
using backend::Hierarchy;
using backend::Op;
using backend::OpKind;
using testing::BackendWorld;
using testing::errorOf;
using ::testing::HasSubstr;
using testing::opDesc;

// The phases' routes, as a policy would pick them: the local phases run as
// the host backend's default, the cross phases by size.
backend::Route crossRoute(OpKind kind, uint64_t bytes, int) {
  switch (kind) {
    case OpKind::kAllreduce: return bytes <= 256 ? Algorithm::kRecursiveDoubling : Algorithm::kRing;
    case OpKind::kBroadcast: return Algorithm::kChain;
    case OpKind::kBarrier: return Algorithm::kDissemination;
    default: return Algorithm::kRing;
  }
}

// Rank r's hierarchical backend; collective over all ranks of `hostHash`.
std::unique_ptr<Backend> hierarchicalBackend(int r, const std::vector<uint64_t>& hostHash,
                                             const std::shared_ptr<Store>& store,
                                             std::chrono::milliseconds timeout) {
  const Hierarchy h = Hierarchy::fromHostHashes(r, hostHash);
  auto local = testing::loopbackHostBackend(h.localRank(), h.localSize(), store,
                                            "host" + std::to_string(h.host()) + "/", timeout);
  const std::vector<int> cross = h.ranksWithLocalRank(h.localRank());
  const int crossRank = static_cast<int>(std::find(cross.begin(), cross.end(), r) - cross.begin());
  auto crossB =
      testing::loopbackHostBackend(crossRank, static_cast<int>(cross.size()), store,
                                   "cross" + std::to_string(h.localRank()) + "/", timeout);
  backend::PhaseRoutes routes{[](OpKind, uint64_t, int) { return backend::Route(); }, crossRoute};
  return backend::createHierarchicalBackend(h, std::move(local), std::move(crossB), routes);
}

BackendWorld hierarchicalWorld(const std::vector<uint64_t>& hostHash,
                               std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  return BackendWorld(static_cast<int>(hostHash.size()),
                      [&](int r, const std::shared_ptr<Store>& store) {
                        return hierarchicalBackend(r, hostHash, store, timeout);
                      });
}

struct Layout {
  const char* name;
  std::vector<uint64_t> hostHash;  // host identity of every rank
};
void PrintTo(const Layout& l, std::ostream* os) {
  *os << l.name;
}

class HierarchicalBackendTest : public ::testing::TestWithParam<Layout> {
 protected:
  void SetUp() override {
    world_ = std::make_unique<BackendWorld>(hierarchicalWorld(GetParam().hostHash));
  }
  Hierarchy hierarchy() const { return Hierarchy::fromHostHashes(0, GetParam().hostHash); }

  std::unique_ptr<BackendWorld> world_;
};

TEST_P(HierarchicalBackendTest, HierarchyGroupsRanksByHost) {
  const Hierarchy h = hierarchy();
  const auto& hash = GetParam().hostHash;
  int ranks = 0;
  for (int host = 0; host < h.numHosts; ++host) {
    const std::vector<int> members = h.ranksOfHost(host);
    ASSERT_FALSE(members.empty());
    for (size_t l = 0; l < members.size(); ++l) {
      EXPECT_EQ(hash[members[l]], hash[members[0]]);
      EXPECT_EQ(h.localRankOf[members[l]], static_cast<int>(l));
    }
    ranks += static_cast<int>(members.size());
  }
  EXPECT_EQ(ranks, h.size);
}

// Allreduce of exact inputs; counts cover an empty op, fewer elements than
// the local size, tails (count % localSize != 0) and pipelined segments.
TEST_P(HierarchicalBackendTest, AllreduceIsExactForEveryOp) {
  for (DataType t :
       {DataType::kFloat32, DataType::kFloat64, DataType::kInt32, DataType::kFloat16}) {
    for (ReduceOp rop : testing::allReduceOps()) {
      if (!supportsReduceOp(t, rop)) continue;
      for (size_t count : {0, 1, 2, 3, 7, 1000, 4097}) {
        testing::checkExactAllreduce(
            *world_, opDesc(OpKind::kAllreduce, t, rop, Algorithm::kAuto, count), false);
        if (HasFailure()) return;
      }
    }
  }
}

TEST_P(HierarchicalBackendTest, AllreduceInPlaceWithSegmentsAndTail) {
  for (ReduceOp rop : {ReduceOp::kSum, ReduceOp::kAvg}) {
    testing::checkExactAllreduce(
        *world_, opDesc(OpKind::kAllreduce, DataType::kFloat32, rop, Algorithm::kAuto, 6001), true);
  }
}

TEST_P(HierarchicalBackendTest, AllreduceOfDistinctValuesMatchesClosedForm) {
  for (ReduceOp rop : {ReduceOp::kSum, ReduceOp::kAvg}) {
    for (size_t count : {1, 5, 3001}) {
      testing::checkDistinctAllreduce(
          *world_, opDesc(OpKind::kAllreduce, DataType::kFloat64, rop, Algorithm::kAuto, count));
      if (HasFailure()) return;
    }
  }
}

TEST_P(HierarchicalBackendTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < world_->size(); ++root) {
    for (size_t count : {0, 1, 7, 3001}) {
      testing::checkBroadcast(*world_, opDesc(OpKind::kBroadcast, DataType::kFloat32,
                                              ReduceOp::kSum, Algorithm::kAuto, count, root));
      if (HasFailure()) return;
    }
  }
}

TEST_P(HierarchicalBackendTest, BarrierHoldsEveryRankUntilAllArrive) {
  testing::checkBarrier(
      *world_, opDesc(OpKind::kBarrier, DataType::kFloat32, ReduceOp::kSum, Algorithm::kAuto, 0),
      10);
}

// Reduce-scatter and allgather run hierarchically on equal hosts only (the
// route policy runs them flat otherwise).
class HierarchicalBackendEqualHosts : public HierarchicalBackendTest {};
class HierarchicalBackendUnequalHosts : public HierarchicalBackendTest {};

TEST_P(HierarchicalBackendEqualHosts, ReduceScatterIsExact) {
  ASSERT_TRUE(hierarchy().uniform);
  for (DataType t : {DataType::kFloat32, DataType::kFloat64, DataType::kInt32}) {
    for (ReduceOp rop : testing::allReduceOps()) {
      if (!supportsReduceOp(t, rop)) continue;
      for (size_t block : {0, 1, 3, 1001}) {
        testing::checkExactReduceScatter(
            *world_, opDesc(OpKind::kReduceScatter, t, rop, Algorithm::kAuto, block));
        if (HasFailure()) return;
      }
    }
  }
}

TEST_P(HierarchicalBackendEqualHosts, AllgatherPlacesEveryRanksBlock) {
  for (DataType t : {DataType::kFloat32, DataType::kFloat16, DataType::kFloat64}) {
    for (size_t block : {0, 1, 3, 1001}) {
      for (bool inPlace : {false, true}) {
        testing::checkAllgather(
            *world_, opDesc(OpKind::kAllgather, t, ReduceOp::kSum, Algorithm::kAuto, block),
            inPlace);
        if (HasFailure()) return;
      }
    }
  }
}

// On unequal hosts every rank refuses reduce-scatter and allgather at once
// with kInternal, instead of starting a phase its peers never join.
TEST_P(HierarchicalBackendUnequalHosts, RefuseReduceScatterAndAllgather) {
  ASSERT_FALSE(hierarchy().uniform);
  const int n = world_->size();
  for (OpKind kind : {OpKind::kReduceScatter, OpKind::kAllgather}) {
    const Op op = world_->op(opDesc(kind, DataType::kFloat32, ReduceOp::kSum, Algorithm::kAuto, 4));
    auto errors = world_->runCollect(
        [&](int, Backend& b) {
          std::vector<float> in(4 * n), out(4 * n);
          if (kind == OpKind::kReduceScatter) b.reduceScatter(op, in.data(), out.data());
          if (kind == OpKind::kAllgather) b.allgather(op, in.data(), out.data());
        },
        /*abortOthers=*/false);
    for (int r = 0; r < n; ++r) {
      const Error e = errorOf(errors[r]);
      EXPECT_EQ(e.code(), ErrorCode::kInternal) << e.what();
      EXPECT_THAT(e.detail(), HasSubstr("route policy bug"));
    }
  }
  // Refusing sent nothing: the backend still runs what it supports.
  testing::checkExactAllreduce(
      *world_, opDesc(OpKind::kAllreduce, DataType::kFloat32, ReduceOp::kSum, Algorithm::kAuto, 9),
      false);
}

const std::vector<Layout> kEqualHosts = {
    {"TwoHostsOfTwo", {11, 11, 22, 22}},
    {"TwoHostsOfTwoInterleaved", {11, 22, 11, 22}},
    {"ThreeHostsOfTwo", {7, 8, 9, 7, 8, 9}},
};
const std::vector<Layout> kUnequalHosts = {
    {"OneThenTwo", {11, 22, 22}},
    {"TwoThenOne", {11, 11, 22}},
    {"ThreeAndOneInterleaved", {11, 22, 11, 11}},
};
std::vector<Layout> allLayouts() {
  std::vector<Layout> v = kEqualHosts;
  v.insert(v.end(), kUnequalHosts.begin(), kUnequalHosts.end());
  return v;
}
std::string layoutName(const ::testing::TestParamInfo<Layout>& p) {
  return p.param.name;
}

INSTANTIATE_TEST_SUITE_P(Hosts, HierarchicalBackendTest, ::testing::ValuesIn(allLayouts()),
                         layoutName);
INSTANTIATE_TEST_SUITE_P(Hosts, HierarchicalBackendEqualHosts, ::testing::ValuesIn(kEqualHosts),
                         layoutName);
INSTANTIATE_TEST_SUITE_P(Hosts, HierarchicalBackendUnequalHosts, ::testing::ValuesIn(kUnequalHosts),
                         layoutName);

// Traffic is counted per communicator rank: a peer on this host through
// `local`, a peer with this rank's local rank through `cross`, none for the
// rest.
TEST(HierarchicalBackend, PeerStatsNameCommunicatorRanks) {
  BackendWorld w = hierarchicalWorld({11, 11, 22, 22});
  testing::checkExactAllreduce(
      w, opDesc(OpKind::kAllreduce, DataType::kFloat32, ReduceOp::kSum, Algorithm::kAuto, 1000),
      false);
  // Rank 0: rank 1 shares its host, rank 2 its local rank, rank 3 neither.
  EXPECT_GT(w.at(0).peerStats(1).bytesSent, 0u);
  EXPECT_GT(w.at(0).peerStats(2).bytesSent, 0u);
  EXPECT_GT(w.at(0).peerStats(2).bytesReceived, 0u);
  EXPECT_EQ(w.at(0).peerStats(3).bytesSent, 0u);
  EXPECT_EQ(w.at(0).peerStats(3).bytesReceived, 0u);
}

// A rank that never calls: the error names it by its communicator rank, and
// says which phase waited for it.
TEST(HierarchicalBackend, TimeoutNamesTheSilentRankByCommunicatorRank) {
  BackendWorld w = hierarchicalWorld({11, 11, 22, 22}, std::chrono::milliseconds(1000));
  const Op op =
      w.op(opDesc(OpKind::kBarrier, DataType::kFloat32, ReduceOp::kSum, Algorithm::kAuto, 0),
           std::chrono::milliseconds(150));
  auto errors = w.runCollect(
      [&](int r, Backend& b) {
        if (r != 2) b.barrier(op);
      },
      /*abortOthers=*/false);
  // Rank 0 (leader of host 0) waits for rank 2 in the leaders' barrier.
  const Error e0 = errorOf(errors[0]);
  EXPECT_EQ(e0.code(), ErrorCode::kTimeout) << e0.what();
  EXPECT_EQ(e0.rank(), 0);
  EXPECT_EQ(e0.peer(), 2) << e0.what();
  EXPECT_THAT(e0.detail(), HasSubstr("across hosts"));
  // Rank 3 waits for rank 2 in the barrier of host 1.
  const Error e3 = errorOf(errors[3]);
  EXPECT_EQ(e3.code(), ErrorCode::kTimeout) << e3.what();
  EXPECT_EQ(e3.rank(), 3);
  EXPECT_EQ(e3.peer(), 2) << e3.what();
  EXPECT_THAT(e3.detail(), HasSubstr("on this host"));
  EXPECT_TRUE(errors[1]);  // waits for rank 0, which never finishes the barrier
  EXPECT_FALSE(errors[2]);
}

}  // namespace
}  // namespace gflow
