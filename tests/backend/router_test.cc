// The router (src/backend/router.h) driven directly. Fake backends
// (fake_backend.h) record what reaches them, so the tests see the route the
// router chose for each op on host buffers (RoutePolicy::choose over the
// capabilities attach() gave it), which backend ran it, the path and route
// counters, and that abort, notifyPeers, peerStats and registerMemory reach
// every part. One test runs routers over real host backends on loopback
// TCP contexts.
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
using backend::Capabilities;
using backend::Op;
using backend::OpDesc;
using backend::OpKind;
using backend::P2PMessage;
using backend::Path;
using backend::PathCounts;
using backend::Route;
using backend::RouteCount;
using backend::RoutePolicy;
using backend::Router;
using ::testing::ElementsAre;
using testing::FakeBackend;
using ::testing::HasSubstr;
using testing::opDesc;
using testing::Seen;

class RouterTest : public ::testing::Test {
 protected:
  // A router over `size` ranks whose flat backend is a fake, routed by
  // GFLOW_ALGO-style `spec`; with `attach`, attach() gives it fake
  // shared-memory and hierarchical backends (each unless its flag says
  // otherwise) and `caps`.
  void build(bool attach, Capabilities caps = {}, bool attachShm = true, bool attachHier = true,
             const std::string& spec = "", int size = 4) {
    backend::RouterParts parts;
    parts.rank = 0;
    parts.size = size;
    parts.flat = std::make_unique<FakeBackend>(flat_, testing::fakeStats(100));
    parts.policy = std::make_shared<const RoutePolicy>(spec, "test");
    parts.verifyNccl = false;
    router_ = std::make_unique<Router>(std::move(parts));
    if (!attach) return;
    backend::DeviceSetup device;
    device.store = createHashStore();
    device.prefix = "router/";
    device.hostOf = {0};
    Router::HostParts host;
    if (attachShm) host.shm = std::make_unique<FakeBackend>(shm_, testing::fakeStats(10));
    if (attachHier) host.hierarchical = std::make_unique<FakeBackend>(hier_, testing::fakeStats(1));
    host.caps = caps;
    router_->attach(std::move(host), device);
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

  // An op as core submits it: not routed yet.
  static Op op(uint64_t seq, OpKind kind) {
    Op o;
    o.seq = seq;
    o.desc = opDesc(kind, DataType::kFloat64, ReduceOp::kMax, Algorithm::kAuto, 8, 0);
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

bool shmRuns(OpKind k) {
  return k != OpKind::kPointToPoint && !backend::isUneven(k);
}
bool hierRuns(OpKind k) {
  return k == OpKind::kAllreduce || k == OpKind::kBroadcast || k == OpKind::kBarrier ||
         k == OpKind::kReduceScatter || k == OpKind::kAllgather;
}

// One host with shared memory: every kind shared memory runs goes there on
// the slots (8 doubles: below any single-copy range), the others to the
// network with their flat algorithm; each op arrives with its route stamped
// and otherwise unchanged, and counts once on its path and route.
TEST_F(RouterTest, OneHostRoutesToSharedMemory) {
  Capabilities caps;
  caps.shm = true;
  caps.shmSingleCopy = {128 << 10, 32 << 20};
  build(true, caps);
  uint64_t seq = 0;
  for (OpKind kind : kAllKinds) {
    submit(op(++seq, kind));
    const auto& seen = shmRuns(kind) ? shm_ : flat_;
    ASSERT_FALSE(seen->calls.empty()) << toString(kind);
    const Seen::Call& c = seen->calls.back();
    EXPECT_EQ(c.seq, seq);
    EXPECT_EQ(c.kind, kind);
    EXPECT_EQ(c.desc.route.path, shmRuns(kind) ? Path::kShm : Path::kNetwork) << toString(kind);
    EXPECT_EQ(c.desc.route.algo == Algorithm::kSlots, shmRuns(kind)) << toString(kind);
    EXPECT_NE(c.desc.route.algo, Algorithm::kAuto) << toString(kind);
    EXPECT_EQ(c.desc.count, 8u);
    EXPECT_EQ(c.desc.op, ReduceOp::kMax);
    EXPECT_EQ(c.desc.dtype, DataType::kFloat64);
    if (kind == OpKind::kAllreduce) {
      EXPECT_EQ(c.in, in_);
      EXPECT_EQ(c.out, out_);
    }
  }
  EXPECT_TRUE(hier_->calls.empty());
  const PathCounts p = router_->paths();
  EXPECT_EQ(p.of(Path::kShm), shm_->calls.size());
  EXPECT_EQ(p.of(Path::kNetwork), flat_->calls.size());
  EXPECT_EQ(p.of(Path::kShm) + p.of(Path::kNetwork), std::size(kAllKinds));
  EXPECT_EQ(p.staged, 0u);
  uint64_t routed = 0;
  for (const RouteCount& r : router_->routes()) routed += r.ops;
  EXPECT_EQ(routed, std::size(kAllKinds));
  router_->resetPaths();
  EXPECT_THAT(router_->paths().ops, ElementsAre(0u, 0u, 0u, 0u, 0u));
  EXPECT_TRUE(router_->routes().empty());
  submit(op(++seq, OpKind::kAllreduce));
  EXPECT_EQ(router_->paths().of(Path::kShm), 1u);
  ASSERT_EQ(router_->routes().size(), 1u);
  EXPECT_EQ(router_->routes()[0].route, Route(Path::kShm, Algorithm::kSlots));
}

// Several equal hosts: the composed kinds go to the hierarchical backend,
// the rest run flat; unequal hosts keep reduce-scatter and allgather flat.
TEST_F(RouterTest, SeveralHostsRouteToTheHierarchy) {
  for (bool uniform : {true, false}) {
    Capabilities caps;
    caps.hierarchical = true;
    caps.uniform = uniform;
    flat_->calls.clear();
    hier_->calls.clear();
    build(true, caps);
    uint64_t seq = 0;
    for (OpKind kind : kAllKinds) {
      submit(op(++seq, kind));
      const bool hier = hierRuns(kind) &&
                        (uniform || (kind != OpKind::kReduceScatter && kind != OpKind::kAllgather));
      const auto& seen = hier ? hier_ : flat_;
      ASSERT_FALSE(seen->calls.empty());
      EXPECT_EQ(seen->calls.back().seq, seq) << toString(kind) << " uniform " << uniform;
      EXPECT_EQ(seen->calls.back().desc.route.path, hier ? Path::kHierarchical : Path::kNetwork);
    }
    EXPECT_TRUE(shm_->calls.empty());
  }
}

// GFLOW_ALGO's rules override the route in the policy: "ring" runs a
// one-host allreduce flat on the ring, a size rule picks by bytes, and a
// rule for a path the communicator lacks falls back to the automatic choice.
TEST_F(RouterTest, RulesOverrideTheRoute) {
  Capabilities caps;
  caps.shm = true;
  build(true, caps, true, true, "ring");
  submit(op(1, OpKind::kAllreduce));
  ASSERT_EQ(flat_->calls.size(), 1u);
  EXPECT_EQ(flat_->calls.back().desc.route, Route(Algorithm::kRing));
  submit(op(2, OpKind::kBroadcast));  // rules name allreduce only
  EXPECT_EQ(shm_->calls.size(), 1u);

  flat_->calls.clear();
  build(true, {}, true, true, "allreduce:0-32:hd,allreduce:32-:rd");
  submit(op(1, OpKind::kAllreduce));  // 64 bytes
  ASSERT_EQ(flat_->calls.size(), 1u);
  EXPECT_EQ(flat_->calls.back().desc.route, Route(Algorithm::kRecursiveDoubling));

  flat_->calls.clear();
  build(true, {}, true, true, "hier");
  submit(op(1, OpKind::kAllreduce));
  ASSERT_EQ(flat_->calls.size(), 1u);
  EXPECT_TRUE(hier_->calls.empty());
}

// Before attach() (the communicator's own setup ops) everything runs flat.
TEST_F(RouterTest, FlatRunsBeforeAttach) {
  build(false);
  submit(op(1, OpKind::kAllgather));
  EXPECT_EQ(flat_->calls.size(), 1u);
  EXPECT_EQ(flat_->calls.back().desc.route, Route(Algorithm::kRing));
  EXPECT_EQ(router_->paths().of(Path::kNetwork), 1u);
}

// A route to a backend this router lacks is an internal error (attach()
// gives the capabilities with the backends), raised as gflow::Error before
// any backend sees the op.
TEST_F(RouterTest, OpForAMissingBackendFailsWithInternalError) {
  Capabilities caps;
  caps.shm = true;
  build(true, caps, /*attachShm=*/false);
  try {
    submit(op(1, OpKind::kAllreduce));
    ADD_FAILURE() << "an op routed to shared memory ran without its backend";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal) << e.what();
    EXPECT_THAT(e.detail(), HasSubstr("internal invariant failed"));
  }
  EXPECT_TRUE(flat_->calls.empty());
  // The router keeps working for what it has.
  submit(op(2, OpKind::kAlltoallv));
  EXPECT_EQ(flat_->calls.size(), 1u);
}

// Shared memory may be unavailable on a host (attach gets nullptr): the
// hierarchical backend still runs.
TEST_F(RouterTest, AttachWithoutSharedMemory) {
  Capabilities caps;
  caps.hierarchical = true;
  build(true, caps, /*attachShm=*/false);
  submit(op(1, OpKind::kBroadcast));
  EXPECT_EQ(hier_->calls.size(), 1u);
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
  const Op o = op(1, OpKind::kAllgather);
  router_->splitInto(o, 0, 0, nullptr);  // NCCL not running: nothing to derive
  FakeBackend notARouter(std::make_shared<Seen>(), PeerStats{});
  try {
    router_->splitInto(o, 0, 0, &notARouter);
    ADD_FAILURE() << "split into a non-router child succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal) << e.what();
  }
}

// Routers over real host backends (loopback TCP, 3 ranks): flat allreduces
// are exact, take the route the rules give their size, and count once on
// the network path of every rank.
TEST(RouterOverLoopback, FlatAllreduceIsExactAndCounted) {
  const int n = 3;
  testing::BackendWorld w(n, [&](int r, const std::shared_ptr<Store>& store) {
    backend::RouterParts parts;
    parts.rank = r;
    parts.size = n;
    parts.flat = testing::loopbackHostBackend(r, n, store, "flat/", std::chrono::seconds(20));
    parts.policy =
        std::make_shared<const RoutePolicy>("allreduce:0-8000:ring,allreduce:8000-:rd", "test");
    parts.verifyNccl = false;
    return std::make_unique<Router>(std::move(parts));
  });
  for (uint64_t count : {1001, 2001}) {  // 4004 and 8004 bytes
    testing::checkExactAllreduce(
        w, opDesc(OpKind::kAllreduce, DataType::kFloat32, ReduceOp::kSum, Algorithm::kAuto, count),
        false);
  }
  for (int r = 0; r < n; ++r) {
    const Router& router = dynamic_cast<Router&>(w.at(r));
    const PathCounts p = router.paths();
    EXPECT_EQ(p.of(Path::kNetwork), 2u) << "rank " << r;
    EXPECT_EQ(p.of(Path::kShm) + p.of(Path::kHierarchical) + p.of(Path::kNccl) + p.staged, 0u)
        << "rank " << r;
    const std::vector<RouteCount> routes = router.routes();
    ASSERT_EQ(routes.size(), 2u) << "rank " << r;
    EXPECT_EQ(routes[0].route, Route(Algorithm::kRing));
    EXPECT_EQ(routes[1].route, Route(Algorithm::kRecursiveDoubling));
    EXPECT_EQ(routes[0].ops + routes[1].ops, 2u);
    EXPECT_GT(w.at(r).peerStats((r + 1) % n).bytesSent, 0u);
  }
}

}  // namespace
}  // namespace gflow
