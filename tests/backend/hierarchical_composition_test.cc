// The hierarchical backend's composition, seen from one rank over fake
// local and cross backends (fake_backend.h): which phases run on which
// part, in what order, with what description (hierarchical.h states the
// plan), and how abort, notifyPeers, peerStats, registerMemory and errors
// pass between the communicator's ranks and the parts' numbering. The
// results of the composition are checked over real contexts in
// hierarchical_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/collective_checks.h"
#include "backend/fake_backend.h"
#include "backend/hierarchical/hierarchical.h"

namespace gflow {
namespace {

using backend::Algorithm;
using backend::Backend;
using backend::Hierarchy;
using backend::Op;
using backend::OpDesc;
using backend::OpKind;
using ::testing::ElementsAre;
using testing::FakeBackend;
using ::testing::HasSubstr;
using testing::opDesc;
using testing::Seen;

// One cross phase as its route function saw it.
struct Selected {
  OpKind kind;
  uint64_t bytes;
  int groupSize;
};

class HierarchicalBackendComposition : public ::testing::Test {
 protected:
  // Rank `rank` of the world whose ranks live on hosts `hostHash`.
  void build(int rank, const std::vector<uint64_t>& hostHash) {
    backend::PhaseRoutes routes;
    routes.local = [](OpKind, uint64_t, int) {
      return backend::Route(backend::Path::kShm, Algorithm::kSlots);
    };
    routes.cross = [sel = selected_](OpKind kind, uint64_t bytes, int n) {
      sel->push_back({kind, bytes, n});
      return backend::Route(Algorithm::kRecursiveDoubling);
    };
    b_ = backend::createHierarchicalBackend(
        Hierarchy::fromHostHashes(rank, hostHash),
        std::make_unique<FakeBackend>(local_, testing::fakeStats(10)),
        std::make_unique<FakeBackend>(cross_, testing::fakeStats(1)), routes);
  }

  static Op op(uint64_t seq, const OpDesc& d) {
    Op o;
    o.seq = seq;
    o.desc = d;
    return o;
  }

  // The phases that reached `seen`, as "kind/count" (root for broadcasts).
  static std::vector<std::string> phases(const Seen& seen) {
    std::vector<std::string> out;
    for (const auto& c : seen.calls) {
      std::string s = std::string(backend::toString(c.kind)) + "/" + std::to_string(c.desc.count);
      if (c.kind == OpKind::kBroadcast) s += "@" + std::to_string(c.desc.root);
      out.push_back(s);
    }
    return out;
  }

  std::shared_ptr<Seen> local_ = std::make_shared<Seen>();
  std::shared_ptr<Seen> cross_ = std::make_shared<Seen>();
  std::shared_ptr<std::vector<Selected>> selected_ = std::make_shared<std::vector<Selected>>();
  std::unique_ptr<Backend> b_;
  float in_[64] = {}, out_[64] = {};
};

// Equal hosts of 2: local reduce-scatter -> cross allreduce of this rank's
// block -> local allgather, then the tail (count % 2) as a local + cross
// allreduce. Phases are tagged with the op they belong to and numbered per
// part; each phase takes the route its PhaseRoutes give it, and an
// average is carried as a sum.
TEST_F(HierarchicalBackendComposition, EqualHostsAllreduceRunsBlocksThenTail) {
  build(0, {11, 11, 22, 22});
  const OpDesc d =
      opDesc(OpKind::kAllreduce, DataType::kFloat32, ReduceOp::kAvg, Algorithm::kAuto, 5);
  b_->allreduce(op(7, d), in_, out_);
  EXPECT_THAT(phases(*local_), ElementsAre("reduce_scatter/2", "allgather/2", "allreduce/1"));
  EXPECT_THAT(phases(*cross_), ElementsAre("allreduce/2", "allreduce/1"));
  for (const auto& c : local_->calls) {
    EXPECT_EQ(c.desc.route, backend::Route(backend::Path::kShm, Algorithm::kSlots));
    EXPECT_EQ(c.desc.op, ReduceOp::kSum);
    EXPECT_EQ(c.desc.parent, backend::fingerprint(d));
  }
  for (const auto& c : cross_->calls) {
    EXPECT_EQ(c.desc.route, backend::Route(Algorithm::kRecursiveDoubling));
    EXPECT_EQ(c.desc.op, ReduceOp::kSum);
    EXPECT_EQ(c.desc.parent, backend::fingerprint(d));
  }
  EXPECT_EQ(local_->calls[0].seq, 1u);
  EXPECT_EQ(local_->calls[2].seq, 3u);
  EXPECT_EQ(cross_->calls[1].seq, 2u);
  ASSERT_EQ(selected_->size(), 2u);
  EXPECT_EQ((*selected_)[0].bytes, 2 * sizeof(float));
  EXPECT_EQ((*selected_)[0].groupSize, 2);  // the hosts
  // The tail reads and writes the elements after the blocks.
  EXPECT_EQ(local_->calls[2].in, in_ + 4);
  EXPECT_EQ(local_->calls[2].out, out_ + 4);
}

// Unequal hosts: local allreduce -> leaders' allreduce -> local broadcast
// from the leader; a rank that is not its host's leader skips the cross
// phase.
TEST_F(HierarchicalBackendComposition, UnequalHostsAllreduceGoesThroughLeaders) {
  const OpDesc d =
      opDesc(OpKind::kAllreduce, DataType::kFloat32, ReduceOp::kSum, Algorithm::kAuto, 5);
  build(1, {11, 22, 22});  // leader of host 1
  b_->allreduce(op(1, d), in_, out_);
  EXPECT_THAT(phases(*local_), ElementsAre("allreduce/5", "broadcast/5@0"));
  EXPECT_THAT(phases(*cross_), ElementsAre("allreduce/5"));
  local_->calls.clear();
  cross_->calls.clear();
  build(2, {11, 22, 22});  // local rank 1 of host 1
  b_->allreduce(op(1, d), in_, out_);
  EXPECT_THAT(phases(*local_), ElementsAre("allreduce/5", "broadcast/5@0"));
  EXPECT_TRUE(cross_->calls.empty());
}

// A broadcast from another host: the leaders' broadcast from the root's
// host (numbered by host in the leaders' group), then the local broadcast
// from the leader; the root's host broadcasts locally first, from the
// root's local rank.
TEST_F(HierarchicalBackendComposition, BroadcastFromAnotherHost) {
  const OpDesc d = opDesc(OpKind::kBroadcast, DataType::kFloat32, ReduceOp::kSum, Algorithm::kAuto,
                          3, /*root=*/3);
  build(0, {11, 11, 22, 22});
  b_->broadcast(op(1, d), out_);
  EXPECT_THAT(phases(*cross_), ElementsAre("broadcast/3@1"));
  EXPECT_THAT(phases(*local_), ElementsAre("broadcast/3@0"));
  local_->calls.clear();
  cross_->calls.clear();
  build(2, {11, 11, 22, 22});  // leader of the root's host
  b_->broadcast(op(1, d), out_);
  EXPECT_THAT(phases(*local_), ElementsAre("broadcast/3@1"));
  EXPECT_THAT(phases(*cross_), ElementsAre("broadcast/3@1"));
}

TEST_F(HierarchicalBackendComposition, BarrierIsLocalLeadersLocal) {
  const OpDesc d =
      opDesc(OpKind::kBarrier, DataType::kFloat32, ReduceOp::kSum, Algorithm::kAuto, 0);
  build(0, {11, 11, 22, 22});
  b_->barrier(op(1, d));
  EXPECT_THAT(phases(*local_), ElementsAre("barrier/0", "barrier/0"));
  EXPECT_THAT(phases(*cross_), ElementsAre("barrier/0"));
  local_->calls.clear();
  cross_->calls.clear();
  build(1, {11, 11, 22, 22});
  b_->barrier(op(1, d));
  EXPECT_THAT(phases(*local_), ElementsAre("barrier/0", "barrier/0"));
  EXPECT_TRUE(cross_->calls.empty());
}

// abort, notifyPeers and registerMemory reach both parts; peerStats asks
// the part that joins this rank to the peer, under that part's numbering.
TEST_F(HierarchicalBackendComposition, ControlReachesBothPartsAndPeersAreRenumbered) {
  build(0, {11, 11, 22, 22});  // local group {0, 1}, cross group {0, 2}
  b_->abort(Error(ErrorCode::kAborted, "abort for the test"));
  b_->notifyPeers(Error(ErrorCode::kPeerLost, "notice for the test"));
  std::vector<std::unique_ptr<transport::MemoryRegion>> regions;
  b_->registerMemory(out_, sizeof out_, &regions);
  for (const auto& seen : {local_, cross_}) {
    EXPECT_THAT(seen->aborted, ElementsAre("abort for the test"));
    EXPECT_THAT(seen->notified, ElementsAre("notice for the test"));
    EXPECT_EQ(seen->registered, 1);
  }
  EXPECT_EQ(b_->peerStats(1).bytesSent, 10u + 1);  // local peer index 1
  EXPECT_EQ(b_->peerStats(1).messagesReceived, 40u);
  EXPECT_EQ(b_->peerStats(2).bytesSent, 1u + 1);  // cross peer index 1
  EXPECT_EQ(b_->peerStats(2).messagesReceived, 4u);
  EXPECT_EQ(b_->peerStats(3).bytesSent, 0u);  // shares neither
  EXPECT_EQ(b_->peerStats(3).messagesReceived, 0u);
}

// A phase's error names the peer by its communicator rank and says where
// the phase ran; the code is kept.
TEST_F(HierarchicalBackendComposition, PhaseErrorsNameCommunicatorRanks) {
  build(0, {11, 11, 22, 22});
  cross_->onOp = [](const Op& o) {
    throw Error(ErrorCode::kPeerLost, "peer 1 went away",
                ErrorContext().withSeq(o.seq).withRank(0).withPeer(1));
  };
  const OpDesc d =
      opDesc(OpKind::kAllreduce, DataType::kFloat32, ReduceOp::kSum, Algorithm::kAuto, 8);
  try {
    b_->allreduce(op(1, d), in_, out_);
    ADD_FAILURE() << "the cross phase's error was lost";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPeerLost);
    EXPECT_EQ(e.rank(), 0);
    EXPECT_EQ(e.peer(), 2) << e.what();
    EXPECT_THAT(e.detail(), HasSubstr("across hosts"));
    EXPECT_THAT(e.detail(), HasSubstr("group ranks 0,2"));
    EXPECT_THAT(e.detail(), HasSubstr("peer 1 went away"));
  }
}

}  // namespace
}  // namespace gflow
