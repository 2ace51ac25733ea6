// RoutePolicy: the one decision of where and how an op runs (its Route,
// backend/route.h), from the op and from what the communicator can do.
// Defaults are measured (docs/algorithms.md); GFLOW_ALGO or
// Options::algorithm override them with rules such as
//   "ring"                                   every allreduce on the network ring
//   "allreduce:0-64k:rd,allreduce:64k-:ring" by message size (bytes)
//   "shm", "hier"                            every allreduce on that path
// The router calls choose() for every op it is given, on the executing
// thread; a composed op's phases (hierarchical) take phase().
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cost_model.h"

namespace gflow::backend {

// The allreduce sizes [lo, hi) that a shared-memory group runs by single copy.
struct ByteRange {
  uint64_t lo = 0;
  uint64_t hi = 0;  // exclusive; lo == hi: none
  bool has(uint64_t bytes) const { return bytes >= lo && bytes < hi; }
};

// What the communicator's host side can run besides the flat network
// algorithms; known once the host grouping is (Router::attach).
struct Capabilities {
  bool shm = false;           // every rank on one host, shared memory connected
  bool hierarchical = false;  // several hosts, some with several ranks
  bool uniform = false;       // ... and every host has the same number of ranks
  int hosts = 1;              // hierarchical: the hosts,
  int perHost = 1;            // ... their ranks (uniform),
  uint64_t segmentBytes = 0;  // ... and the composition's segment
  // Allreduces this host's shared-memory group (the whole communicator's,
  // or the local phase's) runs by single copy: the setting's range where
  // the group can read its members' memory, else none.
  ByteRange shmSingleCopy;
};

// What the device side can do for one op on device buffers. Asked only
// when the answer decides the route: ncclRuns() makes NCCL decide, on
// every rank at once, whether it runs the communicator (its first op).
class DeviceQuery {
 public:
  virtual ~DeviceQuery() = default;
  virtual bool ncclRuns() = 0;          // this op's buffers can run on NCCL
  virtual bool ncclHierarchical() = 0;  // NCCL is split by host (equal hosts)
  virtual bool ncclPointToPoint() = 0;  // this point-to-point call goes through NCCL
};

class RoutePolicy {
 public:
  // Rooted ops (reduce, gather, scatter) of at most this many bytes take a
  // binomial tree; larger ones the chain (reduce) or linear form.
  static constexpr uint64_t kRootedTreeMaxBytes = 64 << 10;

  // The size thresholds of the flat allreduce; unset: the world size's default.
  struct Thresholds {
    std::optional<uint64_t> rdMax;  // recursive doubling up to this
    std::optional<uint64_t> hdMax;  // then halving-doubling up to this, then ring
  };

  // Throws Error(kInvalidArgument) naming `source` on a malformed spec.
  // `model`: the flat allreduce takes the algorithm it predicts fastest
  // where no rule and no threshold that was set decides.
  RoutePolicy(const std::string& spec, const std::string& source, const Thresholds& thresholds = {},
              std::optional<CostModel> model = std::nullopt);

  // The route of op `d` among `ranks` ranks. `device`: null for host
  // buffers. In order: NCCL for device buffers where it runs (split by
  // host for a hierarchical allreduce; never for a reproducible op, which
  // NCCL cannot order), else the host route: a rule of the spec, then
  // shared memory on one host, hierarchical across hosts, else the flat
  // network choice (the cost model's fastest, if one is loaded and no
  // threshold was set; else recursive doubling up to Thresholds::rdMax,
  // halving-doubling up to Thresholds::hdMax, ring above). Across equal
  // hosts a model with local parameters decides between the hierarchical
  // composition and the flat algorithms too (no threshold set). A rule naming
  // shm or hier where that is not available is skipped (logged once).
  // Reproducible ops take the fixed order on shared memory (one host) or
  // over the network (the hierarchical composition's order depends on the
  // hosts).
  Route choose(const OpDesc& d, int ranks, const Capabilities& caps, DeviceQuery* device) const;
  // A phase of a composed op among `ranks` ranks on `path` (shared memory
  // or the network): the algorithm that path's choice gives it.
  Route phase(OpKind kind, uint64_t bytes, int ranks, Path path, const ByteRange& singleCopy) const;

  // The default thresholds for a world size (GFLOW_RD_MAX_BYTES=auto,
  // GFLOW_HD_MAX_BYTES=auto).
  static uint64_t defaultRdMaxBytes(int worldSize);
  static uint64_t defaultHdMaxBytes(int worldSize);
  // The single-copy range of a shared-memory group of `members`, for
  // GFLOW_SHM_SINGLE_COPY's value in force ("auto", "off" or "LO-HI",
  // checked by resolveSettings). `oversubscribed`: more members than cores.
  static ByteRange shmSingleCopyRange(const std::string& setting, int members, bool oversubscribed);
  // The bytes op `d` moves among `ranks` ranks (the selection's size).
  static uint64_t bytesOf(const OpDesc& d, int ranks);

 private:
  struct Rule {
    OpKind kind;
    uint64_t lo;
    uint64_t hi;  // exclusive; UINT64_MAX: no upper bound
    Route route;  // algorithm kAuto: that path's own choice
  };
  Route onHost(const OpDesc& d, uint64_t bytes, int ranks, const Capabilities& caps) const;
  // A rule's route where the communicator can run it.
  std::optional<Route> byRule(OpKind kind, uint64_t bytes, const Capabilities& caps) const;
  Algorithm network(OpKind kind, uint64_t bytes, int ranks) const;
  // Across equal hosts: the flat algorithm a model with local parameters
  // predicts faster than the hierarchical composition, if any.
  std::optional<Algorithm> flatByModel(OpKind kind, uint64_t bytes, const Capabilities& caps) const;
  static Algorithm shm(OpKind kind, uint64_t bytes, const ByteRange& singleCopy);

  std::vector<Rule> rules_;
  Thresholds thresholds_;
  std::optional<CostModel> model_;
  mutable std::atomic<bool> warnedUnavailable_{false};
};

}  // namespace gflow::backend
