// RoutePolicy (src/backend/route_policy.h): the one decision of where and
// how an op runs, checked against a table written out here for every op
// kind and capability set, the size thresholds, GFLOW_ALGO's rules, the
// device side (asked only when it decides) and the phases of a composed op.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "backend/route_policy.h"
#include "gflow/error.h"

namespace gflow {
namespace {

using backend::Algorithm;
using backend::Capabilities;
using backend::DeviceQuery;
using backend::OpDesc;
using backend::OpKind;
using backend::Path;
using backend::Route;
using backend::RoutePolicy;

// `bytes` of uint8 (every kind's count is per op, so bytes is what the
// policy sees for allreduce, broadcast, reduce and the uneven forms).
OpDesc desc(OpKind kind, uint64_t bytes, ReduceOp op = ReduceOp::kSum) {
  OpDesc d;
  d.kind = kind;
  d.dtype = DataType::kUInt8;
  d.op = op;
  d.count = bytes;
  return d;
}

Route hostRoute(const RoutePolicy& p, OpKind kind, uint64_t bytes, int ranks,
                const Capabilities& caps = {}) {
  return p.choose(desc(kind, bytes), ranks, caps, nullptr);
}

Algorithm flat(const RoutePolicy& p, OpKind kind, uint64_t bytes, int ranks) {
  const Route r = hostRoute(p, kind, bytes, ranks);
  EXPECT_EQ(r.path, Path::kNetwork);
  return r.algo;
}

// A device side that answers as told and counts the questions.
class FakeDevice final : public DeviceQuery {
 public:
  bool runs = true, hierarchical = false, p2p = false;
  int asked = 0;
  bool ncclRuns() override { return ++asked, runs; }
  bool ncclHierarchical() override { return hierarchical; }
  bool ncclPointToPoint() override { return ++asked, p2p; }
};

TEST(RoutePolicy, FlatDefaultsFollowSizeAndRanks) {
  const RoutePolicy def("", "test");
  EXPECT_EQ(flat(def, OpKind::kAllreduce, 4096, 4), Algorithm::kRecursiveDoubling);
  EXPECT_EQ(flat(def, OpKind::kAllreduce, 1 << 20, 4), Algorithm::kHalvingDoubling);
  EXPECT_EQ(flat(def, OpKind::kAllreduce, 1 << 20, 3), Algorithm::kHalvingDoubling);
  EXPECT_EQ(flat(def, OpKind::kAllreduce, 16 << 20, 4), Algorithm::kHalvingDoubling);
  EXPECT_EQ(flat(def, OpKind::kAllreduce, 32 << 20, 3), Algorithm::kRing);
  EXPECT_EQ(flat(def, OpKind::kAllreduce, 64 << 20, 4), Algorithm::kRing);
  // Two ranks: the thresholds are higher.
  EXPECT_EQ(flat(def, OpKind::kAllreduce, 256 << 10, 2), Algorithm::kRecursiveDoubling);
  EXPECT_EQ(flat(def, OpKind::kAllreduce, 4 << 20, 2), Algorithm::kHalvingDoubling);
  EXPECT_EQ(flat(def, OpKind::kAllreduce, 16 << 20, 2), Algorithm::kRing);
  // The other kinds.
  EXPECT_EQ(flat(def, OpKind::kBroadcast, 10, 4), Algorithm::kChain);
  EXPECT_EQ(flat(def, OpKind::kBarrier, 0, 4), Algorithm::kDissemination);
  EXPECT_EQ(flat(def, OpKind::kReduceScatter, 10, 4), Algorithm::kRing);
  EXPECT_EQ(flat(def, OpKind::kAllgather, 10, 4), Algorithm::kRing);
  EXPECT_EQ(flat(def, OpKind::kReduce, 64 << 10, 4), Algorithm::kBinomial);
  EXPECT_EQ(flat(def, OpKind::kReduce, (64 << 10) + 1, 4), Algorithm::kChain);
  EXPECT_EQ(flat(def, OpKind::kAlltoall, 10, 4), Algorithm::kPairwise);
  EXPECT_EQ(flat(def, OpKind::kPointToPoint, 10, 4), Algorithm::kDirect);
  EXPECT_EQ(flat(def, OpKind::kGatherv, 10, 4), Algorithm::kLinear);
  // gather and scatter count every rank's block: 16 KiB each of 4 ranks is
  // the tree's limit, one byte more is linear.
  EXPECT_EQ(flat(def, OpKind::kGather, 16 << 10, 4), Algorithm::kBinomial);
  EXPECT_EQ(flat(def, OpKind::kScatter, (16 << 10) + 1, 4), Algorithm::kLinear);
  // Explicit thresholds, 0 included, replace the defaults.
  const RoutePolicy set("", "test", {uint64_t{0}, uint64_t{1} << 30});
  EXPECT_EQ(flat(set, OpKind::kAllreduce, 4096, 4), Algorithm::kHalvingDoubling);
  EXPECT_EQ(flat(set, OpKind::kAllreduce, 64 << 20, 2), Algorithm::kHalvingDoubling);
}

TEST(RoutePolicy, RulesOverrideTheAllreduce) {
  const RoutePolicy rules("allreduce:0-1k:ring,allreduce:1k-64k:hd,allreduce:64k-:rd", "test");
  EXPECT_EQ(flat(rules, OpKind::kAllreduce, 100, 4), Algorithm::kRing);
  EXPECT_EQ(flat(rules, OpKind::kAllreduce, 4096, 4), Algorithm::kHalvingDoubling);
  EXPECT_EQ(flat(rules, OpKind::kAllreduce, 1 << 30, 4), Algorithm::kRecursiveDoubling);
  EXPECT_EQ(flat(rules, OpKind::kBroadcast, 100, 4), Algorithm::kChain);  // allreduce only
  const RoutePolicy ring("ring", "test");
  EXPECT_EQ(flat(ring, OpKind::kAllreduce, 8, 2), Algorithm::kRing);
  Capabilities oneHost;
  oneHost.shm = true;
  // A network rule wins over the host's shared memory.
  EXPECT_EQ(hostRoute(ring, OpKind::kAllreduce, 8, 2, oneHost), Route(Algorithm::kRing));
  // "shm" and "hier" name a path; where it is missing, the automatic choice.
  const RoutePolicy shm("shm", "test"), hier("hier", "test");
  EXPECT_EQ(hostRoute(shm, OpKind::kAllreduce, 8, 2, oneHost),
            Route(Path::kShm, Algorithm::kSlots));
  EXPECT_EQ(hostRoute(hier, OpKind::kAllreduce, 8, 2, oneHost),
            Route(Path::kShm, Algorithm::kSlots));
  EXPECT_EQ(hostRoute(shm, OpKind::kAllreduce, 8, 2), Route(Algorithm::kRecursiveDoubling));
  for (const char* bad : {"tree", "allreduce:5:ring", "allreduce:10-5:ring", "reduce:0-1k:ring"}) {
    EXPECT_THROW(RoutePolicy(bad, "GFLOW_ALGO"), Error) << bad;
  }
}

// Every kind on one host, several equal hosts, several unequal hosts.
TEST(RoutePolicy, HostPathsByKindAndLayout) {
  const RoutePolicy p("", "test");
  Capabilities shm, equal, unequal;
  shm.shm = true;
  equal.hierarchical = equal.uniform = true;
  unequal.hierarchical = true;
  struct Row {
    OpKind kind;
    Path onShm, onEqual, onUnequal;
  };
  const Path S = Path::kShm, H = Path::kHierarchical, N = Path::kNetwork;
  const Row rows[] = {
      {OpKind::kAllreduce, S, H, H}, {OpKind::kReduceScatter, S, H, N},
      {OpKind::kAllgather, S, H, N}, {OpKind::kBroadcast, S, H, H},
      {OpKind::kBarrier, S, H, H},   {OpKind::kReduce, S, N, N},
      {OpKind::kGather, S, N, N},    {OpKind::kScatter, S, N, N},
      {OpKind::kAlltoall, S, N, N},  {OpKind::kPointToPoint, N, N, N},
      {OpKind::kAlltoallv, N, N, N}, {OpKind::kAllgatherv, N, N, N},
      {OpKind::kGatherv, N, N, N},   {OpKind::kScatterv, N, N, N},
  };
  for (const Row& row : rows) {
    const char* k = backend::toString(row.kind);
    EXPECT_EQ(hostRoute(p, row.kind, 64, 4, shm).path, row.onShm) << k;
    EXPECT_EQ(hostRoute(p, row.kind, 64, 8, equal).path, row.onEqual) << k;
    EXPECT_EQ(hostRoute(p, row.kind, 64, 5, unequal).path, row.onUnequal) << k;
    EXPECT_EQ(hostRoute(p, row.kind, 64, 4).path, N) << k;
  }
}

// Shared memory's algorithm: single copy for allreduces in the group's range.
TEST(RoutePolicy, SharedMemorySingleCopyRange) {
  const RoutePolicy p("", "test");
  Capabilities caps;
  caps.shm = true;
  caps.shmSingleCopy = {128 << 10, 32 << 20};
  EXPECT_EQ(hostRoute(p, OpKind::kAllreduce, (128 << 10) - 1, 2, caps).algo, Algorithm::kSlots);
  EXPECT_EQ(hostRoute(p, OpKind::kAllreduce, 128 << 10, 2, caps).algo, Algorithm::kSingleCopy);
  EXPECT_EQ(hostRoute(p, OpKind::kAllreduce, (32 << 20) - 1, 2, caps).algo, Algorithm::kSingleCopy);
  EXPECT_EQ(hostRoute(p, OpKind::kAllreduce, 32 << 20, 2, caps).algo, Algorithm::kSlots);
  EXPECT_EQ(hostRoute(p, OpKind::kBroadcast, 1 << 20, 2, caps).algo, Algorithm::kSlots);
  // A hierarchical op's local phase takes the same choice.
  EXPECT_EQ(p.phase(OpKind::kAllreduce, 1 << 20, 2, Path::kShm, caps.shmSingleCopy),
            Route(Path::kShm, Algorithm::kSingleCopy));
  EXPECT_EQ(p.phase(OpKind::kAllreduce, 1 << 20, 2, Path::kNetwork, caps.shmSingleCopy),
            Route(Algorithm::kHalvingDoubling));
  EXPECT_EQ(p.phase(OpKind::kBroadcast, 1 << 20, 3, Path::kNetwork, {}), Route(Algorithm::kChain));
}

TEST(RoutePolicy, ReproducibleTakesTheFixedOrder) {
  const RoutePolicy p("ring", "test");  // no rule applies to it
  Capabilities shm, equal;
  shm.shm = true;
  equal.hierarchical = equal.uniform = true;
  for (OpKind kind : {OpKind::kAllreduce, OpKind::kReduceScatter}) {
    OpDesc d = desc(kind, 1 << 20);
    d.reproducible = true;
    EXPECT_EQ(p.choose(d, 2, shm, nullptr), Route(Path::kShm, Algorithm::kFixedOrder));
    EXPECT_EQ(p.choose(d, 8, equal, nullptr), Route(Algorithm::kFixedOrder));
    EXPECT_EQ(p.choose(d, 4, {}, nullptr), Route(Algorithm::kFixedOrder));
    // NCCL cannot keep the order: it is not even asked.
    FakeDevice dev;
    EXPECT_EQ(p.choose(d, 4, {}, &dev), Route(Algorithm::kFixedOrder));
    EXPECT_EQ(dev.asked, 0);
  }
}

TEST(RoutePolicy, DeviceBuffersRunOnNcclWhereItRuns) {
  const RoutePolicy p("", "test");
  Capabilities equal;
  equal.hierarchical = equal.uniform = true;
  FakeDevice dev;
  EXPECT_EQ(p.choose(desc(OpKind::kAllreduce, 64), 4, {}, &dev),
            Route(Path::kNccl, Algorithm::kAuto));
  EXPECT_EQ(p.choose(desc(OpKind::kAlltoallv, 64), 4, {}, &dev).path, Path::kNccl);
  // Split by host where NCCL is, for a hierarchical allreduce only (not avg).
  dev.hierarchical = true;
  EXPECT_EQ(p.choose(desc(OpKind::kAllreduce, 64), 8, equal, &dev).path, Path::kNcclHierarchical);
  EXPECT_EQ(p.choose(desc(OpKind::kAllreduce, 64, ReduceOp::kAvg), 8, equal, &dev).path,
            Path::kNccl);
  EXPECT_EQ(p.choose(desc(OpKind::kBroadcast, 64), 8, equal, &dev).path, Path::kNccl);
  EXPECT_EQ(p.choose(desc(OpKind::kAllreduce, 64), 4, {}, &dev).path, Path::kNccl);
  // Where NCCL does not run, the host route (the router stages it).
  dev.runs = false;
  EXPECT_EQ(p.choose(desc(OpKind::kAllreduce, 64), 8, equal, &dev),
            Route(Path::kHierarchical, Algorithm::kAuto));
  // Point-to-point asks only whether NCCL carries the call.
  dev.asked = 0;
  EXPECT_EQ(p.choose(desc(OpKind::kPointToPoint, 8), 4, {}, &dev), Route(Algorithm::kDirect));
  dev.p2p = true;
  EXPECT_EQ(p.choose(desc(OpKind::kPointToPoint, 8), 4, {}, &dev),
            Route(Path::kNccl, Algorithm::kDirect));
  EXPECT_EQ(dev.asked, 2);
}

TEST(RoutePolicy, ShmSingleCopyRangeSetting) {
  auto range = [](const char* setting, int members, bool over) {
    const auto r = RoutePolicy::shmSingleCopyRange(setting, members, over);
    return std::make_pair(r.lo, r.hi);
  };
  using R = std::pair<uint64_t, uint64_t>;
  // auto: measured for two ranks with a core each; the slot path elsewhere.
  EXPECT_EQ(range("auto", 2, false), R(128 << 10, 32 << 20));
  EXPECT_EQ(range("auto", 2, true).second, 0u);
  EXPECT_EQ(range("auto", 4, false).second, 0u);
  EXPECT_EQ(range("off", 2, false).second, 0u);
  // A range applies at any group size.
  EXPECT_EQ(range("64K-", 4, true), R(64 << 10, UINT64_MAX));
  EXPECT_EQ(range("1M-2M", 3, false), R(1 << 20, 2 << 20));
}

// The route is part of the op's description: ranks that route one op
// differently disagree on its envelope and fingerprint.
TEST(RoutePolicy, RouteIsInTheEnvelope) {
  OpDesc a = desc(OpKind::kAllreduce, 64), b = a;
  a.route = {Path::kShm, Algorithm::kSlots};
  b.route = {Path::kNetwork, Algorithm::kSlots};
  EXPECT_NE(backend::fingerprint(a), backend::fingerprint(b));
  b.route = {Path::kShm, Algorithm::kSingleCopy};
  EXPECT_NE(backend::fingerprint(a), backend::fingerprint(b));
  const std::string s = backend::describe(backend::encode(a));
  EXPECT_NE(s.find("path=shm, algorithm=slots"), std::string::npos) << s;
}

}  // namespace
}  // namespace gflow
