// Route: where one op runs (its Path: which backend) and how (its
// Algorithm). Every op gets one, from one function (RoutePolicy::choose,
// backend/route_policy.h), on the executing thread just before it runs; the
// router (backend/router.h) is a table from Path to Backend, and each
// backend switches on the Algorithm only. The route is part of the op's
// description (OpDesc::route), so ranks whose routes differ fail with
// kMismatch instead of waiting in different places.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gflow::backend {

enum class Path : uint8_t {
  kNetwork = 0,           // gflow's algorithms over the network transport (TCP, verbs)
  kShm = 1,               // every rank on one host: the shared-memory backend
  kHierarchical = 2,      // several hosts: phases on each host and across hosts
  kNccl = 3,              // device buffers on NCCL
  kNcclHierarchical = 4,  // device buffers on NCCL split by host (equal hosts)
};
constexpr size_t kNumPaths = 5;
// Device buffers on a host path (not NCCL) are staged through host memory.
inline bool onHost(Path p) {
  return p == Path::kNetwork || p == Path::kShm || p == Path::kHierarchical;
}

enum class Algorithm : uint8_t {
  // Not chosen yet; on NCCL, NCCL's own choice; on the hierarchical path,
  // each phase has its own route.
  kAuto = 0,
  kRing = 1,               // pipelined reduce-scatter + allgather
  kRecursiveDoubling = 2,  // log2(N) exchanges of the whole buffer
  kHalvingDoubling = 3,    // recursive halving reduce-scatter + doubling allgather
  kChain = 4,              // pipelined chain (broadcast, reduce)
  kDissemination = 5,      // barrier
  kBinomial = 6,           // binomial tree (rooted ops: reduce, gather, scatter)
  kLinear = 7,             // root exchanges with every rank directly (gather, scatter)
  kPairwise = 8,           // every pair exchanges directly, staggered by rank (all-to-all)
  kDirect = 9,             // point-to-point: one message straight to its peer
  // Reproducible mode (allreduce, reduce-scatter): each element reduced by
  // one fixed tree over the ranks (host/fixed_order.cc; on shared memory
  // kernels/ordered_reduce.h).
  kFixedOrder = 10,
  kSlots = 11,       // shared memory: through the members' slots of the segment
  kSingleCopy = 12,  // shared memory: each member reads the others' buffers
};
constexpr size_t kNumAlgorithms = 13;

struct Route {
  Path path = Path::kNetwork;
  Algorithm algo = Algorithm::kAuto;
  constexpr Route() = default;
  // An algorithm alone: that algorithm over the network transport.
  constexpr Route(Algorithm a) : algo(a) {}  // NOLINT(google-explicit-constructor)
  constexpr Route(Path p, Algorithm a) : path(p), algo(a) {}
  friend bool operator==(Route a, Route b) { return a.path == b.path && a.algo == b.algo; }
  friend bool operator!=(Route a, Route b) { return !(a == b); }
};

const char* toString(Path path);
const char* toString(Algorithm algo);

}  // namespace gflow::backend
