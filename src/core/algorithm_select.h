// Algorithm selection, in one place: which algorithm runs an op of a given
// kind and size. Defaults are measured (docs/algorithms.md); GFLOW_ALGO or
// Options::algorithm override them with rules such as
//   "ring"                                   every allreduce uses ring
//   "allreduce:0-64k:rd,allreduce:64k-:ring" by message size (bytes)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace gflow {

// What the communicator can run besides the flat algorithms.
struct Capabilities {
  bool shm = false;           // every rank on one host, shared memory connected
  bool hierarchical = false;  // several hosts, some with several ranks
  bool uniform = false;       // ... and every host has the same number of ranks
};

class AlgorithmSelector {
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
  AlgorithmSelector(const std::string& spec, const std::string& source,
                    const Thresholds& thresholds = {});

  void setCapabilities(const Capabilities& caps) { caps_ = caps; }

  // The automatic choice, in order: shm on one host, hierarchical across
  // hosts, else recursive doubling up to Thresholds::rdMax, halving-doubling
  // up to Thresholds::hdMax and ring above. A
  // rule naming shm or hier where that is not available is skipped (logged
  // once). `reproducible` (allreduce and reduce-scatter; no rule applies):
  // the shared-memory backend's fixed order on one host, else the host
  // backend's over the network transport, across hosts too (the
  // hierarchical composition's order depends on the hosts).
  backend::Algorithm select(backend::OpKind kind, uint64_t bytes, int worldSize,
                            bool reproducible = false) const;
  // The flat choice only (ring/rd rules and the threshold; chain and
  // dissemination for broadcast and barrier): the cross-host phase of a
  // hierarchical op, among `groupSize` ranks, moving `bytes`.
  backend::Algorithm selectFlat(backend::OpKind kind, uint64_t bytes, int groupSize) const;

  // The default thresholds for a world size (GFLOW_RD_MAX_BYTES=auto,
  // GFLOW_HD_MAX_BYTES=auto).
  static uint64_t defaultRdMaxBytes(int worldSize);
  static uint64_t defaultHdMaxBytes(int worldSize);

  // The allreduce sizes [lo, hi) a shared-memory group of `members` runs by
  // single-copy reads, for GFLOW_SHM_SINGLE_COPY's value in force ("auto",
  // "off" or "LO-HI", checked by resolveSettings). `oversubscribed`: more
  // members than cores.
  struct ByteRange {
    uint64_t lo = 0;
    uint64_t hi = 0;  // exclusive; lo == hi: none
  };
  static ByteRange shmSingleCopyRange(const std::string& setting, int members, bool oversubscribed);

 private:
  struct Rule {
    backend::OpKind kind;
    uint64_t lo;
    uint64_t hi;  // exclusive; UINT64_MAX: no upper bound
    backend::Algorithm algo;
  };
  std::vector<Rule> rules_;
  Thresholds thresholds_;
  Capabilities caps_;
  mutable bool warnedUnavailable_ = false;
};

}  // namespace gflow
