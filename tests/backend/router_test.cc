// The router (src/backend/router.h) driven directly. Fake backends
// (fake_backend.h) record what reaches them, so the tests see which backend ran each op on
// host buffers (by OpDesc::algo), the path counters, and that abort,
// notifyPeers, peerStats and registerMemory reach every part. One test runs
// routers over real host backends on loopback TCP contexts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/collective_checks.h"
#include "backend/fake_backend.h"
#include "backend/loopback.h"
#include "backend/router.h"

namespace gflow {
namespace {

using backend::Algorithm;
using backend::Backend;
using backend::Op;
using backend::OpDesc;
using backend::OpKind;
using backend::P2PMessage;
using backend::Path;
using backend::PathCounts;
using backend::Router;
using ::testing::ElementsAre;
using testing::FakeBackend;
using ::testing::HasSubstr;
using testing::opDesc;
using testing::Seen;

Algorithm anyAlgorithm(OpKind, uint64_t, int) {
  return Algorithm::kRing;
}

class RouterTest : public ::testing::Test {
 protected:
  // A router whose flat backend is a fake; with `attach`, attach() gives it
  // fake shared-memory and hierarchical backends (each unless its flag says
  // otherwise).
  void build(bool attach, bool attachShm = true, bool attachHier = true) {
    backend::RouterParts parts;
    parts.rank = 0;
    parts.size = 1;
    parts.flat = std::make_unique<FakeBackend>(flat_, testing::fakeStats(100));
    parts.verifyNccl = false;
    parts.select = anyAlgorithm;
    router_ = std::make_unique<Router>(std::move(parts));
    if (!attach) return;
    backend::DeviceSetup device;
    device.store = createHashStore();
    device.prefix = "router/";
    device.hostOf = {0};
    router_->attach(
        attachShm ? std::make_unique<FakeBackend>(shm_, testing::fakeStats(10)) : nullptr,
        attachHier ? std::make_unique<FakeBackend>(hier_, testing::fakeStats(1)) : nullptr, device);
  }

  // Runs `op` through the router on this fixture's buffers.
  void submit(const Op& op) {
    switch (op.desc.kind) {
      case OpKind::kAllreduce: router_->allreduce(op, in_, out_); break;
      case OpKind::kReduceScatter: router_->reduceScatter(op, in_, out_); break;
      case OpKind::kAllgather: router_->allgather(op, in_, out_); break;
      case OpKind::kBroadcast: router_->broadcast(op, out_); break;
      case OpKind::kBarrier: router_->barrier(op); break;
      case OpKind::kReduce: router_->reduce(op, in_, out_); break;
      case OpKind::kGather: router_->gather(op, in_, out_); break;
      case OpKind::kScatter: router_->scatter(op, in_, out_); break;
      case OpKind::kAlltoall: router_->alltoall(op, in_, out_); break;
      case OpKind::kAlltoallv:
      case OpKind::kAllgatherv:
        router_->alltoallv(op, in_, backend::Blocks::equal(2, 4), out_,
                           backend::Blocks::equal(2, 4));
        break;
      case OpKind::kGatherv: router_->gatherv(op, in_, out_, backend::Blocks::equal(2, 4)); break;
      case OpKind::kScatterv: router_->scatterv(op, in_, backend::Blocks::equal(2, 4), out_); break;
      case OpKind::kPointToPoint: {
        std::vector<P2PMessage> m{{true, 1, 0, DataType::kFloat64, 8, out_, -1}};
        router_->startPointToPoint(op, m);
        break;
      }
    }
  }

  static Op op(uint64_t seq, OpKind kind, Algorithm algo) {
    Op o;
    o.seq = seq;
    o.desc = opDesc(kind, DataType::kFloat64, ReduceOp::kMax, algo, 8, 0);
    return o;
  }

  std::shared_ptr<Seen> flat_ = std::make_shared<Seen>();
  std::shared_ptr<Seen> shm_ = std::make_shared<Seen>();
  std::shared_ptr<Seen> hier_ = std::make_shared<Seen>();
  std::unique_ptr<Router> router_;
  double inBuf_[8] = {}, outBuf_[8] = {};
  const void* in_ = inBuf_;
  void* out_ = outBuf_;
};

constexpr OpKind kAllKinds[] = {OpKind::kAllreduce,    OpKind::kReduceScatter, OpKind::kAllgather,
                                OpKind::kBroadcast,    OpKind::kBarrier,       OpKind::kReduce,
                                OpKind::kGather,       OpKind::kScatter,       OpKind::kAlltoall,
                                OpKind::kPointToPoint, OpKind::kAlltoallv,     OpKind::kAllgatherv,
                                OpKind::kGatherv,      OpKind::kScatterv};

uint64_t at(const PathCounts& c, Path p) {
  return c[static_cast<size_t>(p)];
}

// kShm goes to the shared-memory backend, kHierarchical to the hierarchical
// one, every other algorithm to the flat backend; the op and its buffers
// arrive unchanged, and each op counts once on its path.
TEST_F(RouterTest, HostOpsGoToTheBackendOfTheirAlgorithm) {
  build(true);
  const Algorithm flatAlgos[] = {
      Algorithm::kAuto,   Algorithm::kRing,          Algorithm::kRecursiveDoubling,
      Algorithm::kChain,  Algorithm::kDissemination, Algorithm::kBinomial,
      Algorithm::kLinear, Algorithm::kPairwise};
  uint64_t seq = 0;
  for (OpKind kind : kAllKinds) {
    for (Algorithm algo : flatAlgos) {
      const Op o = op(++seq, kind, algo);
      submit(o);
      ASSERT_FALSE(flat_->calls.empty());
      const Seen::Call& c = flat_->calls.back();
      EXPECT_EQ(c.seq, seq);
      EXPECT_EQ(c.kind, kind);
      EXPECT_EQ(c.desc.algo, algo);
      EXPECT_EQ(c.desc.count, 8u);
      EXPECT_EQ(c.desc.op, ReduceOp::kMax);
      EXPECT_EQ(c.desc.dtype, DataType::kFloat64);
      if (kind == OpKind::kAllreduce) {
        EXPECT_EQ(c.in, in_);
        EXPECT_EQ(c.out, out_);
      }
    }
    submit(op(++seq, kind, Algorithm::kShm));
    ASSERT_FALSE(shm_->calls.empty());
    EXPECT_EQ(shm_->calls.back().seq, seq);
    EXPECT_EQ(shm_->calls.back().kind, kind);
    submit(op(++seq, kind, Algorithm::kHierarchical));
    ASSERT_FALSE(hier_->calls.empty());
    EXPECT_EQ(hier_->calls.back().seq, seq);
    EXPECT_EQ(hier_->calls.back().kind, kind);
  }
  const size_t kinds = std::size(kAllKinds), algos = std::size(flatAlgos);
  EXPECT_EQ(flat_->calls.size(), kinds * algos);
  EXPECT_EQ(shm_->calls.size(), kinds);
  EXPECT_EQ(hier_->calls.size(), kinds);
  const PathCounts p = router_->paths();
  EXPECT_EQ(at(p, Path::kShm), kinds);
  EXPECT_EQ(at(p, Path::kHierarchical), kinds);
  EXPECT_EQ(at(p, Path::kNetwork), kinds * algos);
  EXPECT_EQ(at(p, Path::kNccl), 0u);
  EXPECT_EQ(at(p, Path::kStaged), 0u);
  router_->resetPaths();
  EXPECT_THAT(router_->paths(), ElementsAre(0u, 0u, 0u, 0u, 0u));
  submit(op(++seq, OpKind::kAllreduce, Algorithm::kShm));
  EXPECT_EQ(at(router_->paths(), Path::kShm), 1u);
}

// Before attach() (the communicator's own setup ops) everything runs flat.
TEST_F(RouterTest, FlatRunsBeforeAttach) {
  build(false);
  submit(op(1, OpKind::kAllgather, Algorithm::kRing));
  EXPECT_EQ(flat_->calls.size(), 1u);
  EXPECT_EQ(at(router_->paths(), Path::kNetwork), 1u);
}

// An op whose algorithm names a backend this router lacks is an internal
// error (algorithm selection never picks it), raised as gflow::Error before
// any backend sees the op.
TEST_F(RouterTest, OpForAMissingBackendFailsWithInternalError) {
  build(false);
  for (Algorithm algo : {Algorithm::kShm, Algorithm::kHierarchical}) {
    try {
      submit(op(1, OpKind::kAllreduce, algo));
      ADD_FAILURE() << "an op for " << backend::toString(algo) << " ran without its backend";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInternal) << e.what();
      EXPECT_THAT(e.detail(), HasSubstr("internal invariant failed"));
    }
  }
  EXPECT_TRUE(flat_->calls.empty());
  // The router keeps working for what it has.
  submit(op(2, OpKind::kAllreduce, Algorithm::kRing));
  EXPECT_EQ(flat_->calls.size(), 1u);
}

// Shared memory may be unavailable on a host (attach gets nullptr): the
// hierarchical backend still runs, kShm ops fail cleanly.
TEST_F(RouterTest, AttachWithoutSharedMemory) {
  build(true, /*attachShm=*/false);
  submit(op(1, OpKind::kBroadcast, Algorithm::kHierarchical));
  EXPECT_EQ(hier_->calls.size(), 1u);
  EXPECT_THROW(submit(op(2, OpKind::kBroadcast, Algorithm::kShm)), Error);
  EXPECT_TRUE(shm_->calls.empty());
}

TEST_F(RouterTest, AbortAndNotifyPeersReachEveryPart) {
  build(true);
  router_->abort(Error(ErrorCode::kAborted, "abort for the test"));
  router_->notifyPeers(Error(ErrorCode::kPeerLost, "notice for the test"));
  for (const auto& seen : {flat_, shm_, hier_}) {
    EXPECT_THAT(seen->aborted, ElementsAre("abort for the test"));
    EXPECT_THAT(seen->notified, ElementsAre("notice for the test"));
  }
}

TEST_F(RouterTest, AbortBeforeAttachReachesTheFlatBackend) {
  build(false);
  router_->abort(Error(ErrorCode::kAborted, "early abort"));
  EXPECT_THAT(flat_->aborted, ElementsAre("early abort"));
}

TEST_F(RouterTest, PeerStatsSumTheParts) {
  build(true);
  const PeerStats s = router_->peerStats(3);
  // flat 100, shm 10, hierarchical 1 (each adds the peer to bytesSent).
  EXPECT_EQ(s.bytesSent, 111u + 3 * 3);
  EXPECT_EQ(s.bytesReceived, 222u);
  EXPECT_EQ(s.messagesSent, 333u);
  EXPECT_EQ(s.messagesReceived, 444u);
}

TEST_F(RouterTest, RegisterMemoryReachesEveryPart) {
  build(true);
  std::vector<std::unique_ptr<transport::MemoryRegion>> regions;
  router_->registerMemory(outBuf_, sizeof outBuf_, &regions);
  EXPECT_EQ(flat_->registered, 1);
  EXPECT_EQ(shm_->registered, 1);
  EXPECT_EQ(hier_->registered, 1);
}

// split hands a child only to another Router; anything else is a bug.
TEST_F(RouterTest, SplitIntoAcceptsOnlyARouter) {
  build(true);
  const Op o = op(1, OpKind::kAllgather, Algorithm::kRing);
  router_->splitInto(o, 0, 0, nullptr);  // NCCL not running: nothing to derive
  FakeBackend notARouter(std::make_shared<Seen>(), PeerStats{});
  try {
    router_->splitInto(o, 0, 0, &notARouter);
    ADD_FAILURE() << "split into a non-router child succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal) << e.what();
  }
}

// Routers over real host backends (loopback TCP, 3 ranks): a flat allreduce
// is exact and counts once on the network path of every rank.
TEST(RouterOverLoopback, FlatAllreduceIsExactAndCounted) {
  const int n = 3;
  testing::BackendWorld w(n, [&](int r, const std::shared_ptr<Store>& store) {
    backend::RouterParts parts;
    parts.rank = r;
    parts.size = n;
    parts.flat = testing::loopbackHostBackend(r, n, store, "flat/", std::chrono::seconds(20));
    parts.verifyNccl = false;
    parts.select = anyAlgorithm;
    return std::make_unique<Router>(std::move(parts));
  });
  for (Algorithm algo : {Algorithm::kRing, Algorithm::kRecursiveDoubling}) {
    testing::checkExactAllreduce(
        w, opDesc(OpKind::kAllreduce, DataType::kFloat32, ReduceOp::kSum, algo, 1001), false);
  }
  for (int r = 0; r < n; ++r) {
    const PathCounts p = dynamic_cast<Router&>(w.at(r)).paths();
    EXPECT_EQ(at(p, Path::kNetwork), 2u) << "rank " << r;
    EXPECT_EQ(
        at(p, Path::kShm) + at(p, Path::kHierarchical) + at(p, Path::kNccl) + at(p, Path::kStaged),
        0u)
        << "rank " << r;
    EXPECT_GT(w.at(r).peerStats((r + 1) % n).bytesSent, 0u);
  }
}

}  // namespace
}  // namespace gflow
