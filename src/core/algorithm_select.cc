#include "core/algorithm_select.h"

#include <sstream>

#include "common/check.h"
#include "common/logging.h"
#include "common/params.h"

namespace gflow {
namespace {

using backend::Algorithm;
using backend::OpKind;

Algorithm parseAlgo(const std::string& s, const std::string& source) {
  if (s == "ring") return Algorithm::kRing;
  if (s == "rd" || s == "recursive_doubling") return Algorithm::kRecursiveDoubling;
  if (s == "hd" || s == "halving_doubling") return Algorithm::kHalvingDoubling;
  if (s == "hier" || s == "hierarchical") return Algorithm::kHierarchical;
  if (s == "shm") return Algorithm::kShm;
  if (s == "auto") return Algorithm::kAuto;
  GFLOW_THROW(kInvalidArgument, ErrorContext{"config"})
      << source << ": unknown allreduce algorithm '" << s
      << "' (expected ring, rd, hd, hier, shm or auto)";
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream is(s);
  while (std::getline(is, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.push_back("");
  return out;
}

}  // namespace

// Measured on loopback TCP, float32 sum, by interleaved rounds
// (docs/performance.md, "Halving-doubling"). Recursive doubling moves log2(N)
// whole buffers in as many messages: on two ranks (one exchange) it wins up
// to about 512 KiB, on more only up to about 64 KiB. Halving-doubling moves
// the ring's bytes in 2 log2(N) pairwise exchanges of one message each and
// beats the ring's pipeline of pieces up to about 8 MiB on two ranks (where
// it is the ring without pieces) and 4 MiB on more.
uint64_t AlgorithmSelector::defaultRdMaxBytes(int worldSize) {
  return worldSize <= 2 ? (512u << 10) : (64u << 10);
}

uint64_t AlgorithmSelector::defaultHdMaxBytes(int worldSize) {
  return worldSize <= 2 ? (8u << 20) : (16u << 20);
}

AlgorithmSelector::AlgorithmSelector(const std::string& spec, const std::string& source,
                                     const Thresholds& thresholds)
    : thresholds_(thresholds) {
  if (spec.empty() || spec == "auto") return;
  for (const std::string& part : split(spec, ',')) {
    std::vector<std::string> f = split(part, ':');
    if (f.size() == 1) {
      rules_.push_back({OpKind::kAllreduce, 0, UINT64_MAX, parseAlgo(f[0], source)});
      continue;
    }
    if (f.size() != 3 || f[0] != "allreduce") {
      GFLOW_THROW(kInvalidArgument, ErrorContext{"config"})
          << source << ": rule '" << part
          << "' is not of the form ALGO or allreduce:LO-HI:ALGO (e.g. allreduce:0-64k:rd)";
    }
    auto dash = f[1].find('-');
    if (dash == std::string::npos) {
      GFLOW_THROW(kInvalidArgument, ErrorContext{"config"})
          << source << ": size range '" << f[1] << "' needs a '-' (e.g. 0-64k or 64k-)";
    }
    uint64_t lo = 0, hi = UINT64_MAX;
    if (!params::parseByteRange(f[1], &lo, &hi)) {
      GFLOW_THROW(kInvalidArgument, ErrorContext{"config"})
          << source << ": bad size range '" << f[1] << "'";
    }
    rules_.push_back({OpKind::kAllreduce, lo, hi, parseAlgo(f[2], source)});
  }
}

AlgorithmSelector::ByteRange AlgorithmSelector::shmSingleCopyRange(const std::string& setting,
                                                                   int members,
                                                                   bool oversubscribed) {
  ByteRange r;
  if (setting == "auto") {
    // Measured with two ranks on two cores (docs/performance.md): below
    // 128 KiB the one-sync slot path is faster, from 32 MiB on (buffers
    // beyond the last-level cache) the slot path's lower DRAM traffic wins.
    // With more ranks than cores the extra syncs cost more than the copies
    // saved (4 ranks on 2 cores: slower at 5 of 6 sizes). Groups of 3+ ranks
    // with a core each were not measured: they keep the slot path.
    if (members == 2 && !oversubscribed) r = {128 << 10, 32 << 20};
    return r;
  }
  if (setting != "off") params::parseByteRange(setting, &r.lo, &r.hi);
  return r;
}

Algorithm AlgorithmSelector::select(OpKind kind, uint64_t bytes, int worldSize,
                                    bool reproducible) const {
  if (reproducible && (kind == OpKind::kAllreduce || kind == OpKind::kReduceScatter)) {
    return caps_.shm ? Algorithm::kShmFixedOrder : Algorithm::kFixedOrder;
  }
  switch (kind) {
    case OpKind::kReduceScatter:
    case OpKind::kAllgather:
      return caps_.shm                             ? Algorithm::kShm
             : caps_.hierarchical && caps_.uniform ? Algorithm::kHierarchical
                                                   : Algorithm::kRing;
    case OpKind::kBroadcast:
      return caps_.shm            ? Algorithm::kShm
             : caps_.hierarchical ? Algorithm::kHierarchical
                                  : Algorithm::kChain;
    case OpKind::kBarrier:
      return caps_.shm            ? Algorithm::kShm
             : caps_.hierarchical ? Algorithm::kHierarchical
                                  : Algorithm::kDissemination;
    case OpKind::kReduce:
    case OpKind::kGather:
    case OpKind::kScatter:
    case OpKind::kAlltoall:
      // Across hosts these run flat: the hierarchical backend composes the
      // reductions and broadcast only.
      return caps_.shm ? Algorithm::kShm : selectFlat(kind, bytes, worldSize);
    case OpKind::kPointToPoint:
    case OpKind::kAlltoallv:
    case OpKind::kAllgatherv:
    case OpKind::kGatherv:
    case OpKind::kScatterv:
      // Over the network transport, which connects every pair: shared
      // memory has no point-to-point channel and no uneven forms.
      return selectFlat(kind, bytes, worldSize);
    case OpKind::kAllreduce: break;
  }
  for (const Rule& r : rules_) {
    if (r.kind != kind || bytes < r.lo || bytes >= r.hi || r.algo == Algorithm::kAuto) continue;
    if ((r.algo == Algorithm::kShm && !caps_.shm) ||
        (r.algo == Algorithm::kHierarchical && !caps_.hierarchical)) {
      if (!warnedUnavailable_) {
        warnedUnavailable_ = true;
        GFLOW_LOG(WARN) << "algorithm '" << backend::toString(r.algo)
                        << "' was requested but this communicator cannot run it ("
                        << (r.algo == Algorithm::kShm
                                ? "its ranks are not all on one host with shared memory"
                                : "it does not span several hosts with several ranks on one")
                        << "); using the automatic choice";
      }
      continue;
    }
    return r.algo;
  }
  if (caps_.shm) return Algorithm::kShm;
  if (caps_.hierarchical) return Algorithm::kHierarchical;
  return selectFlat(kind, bytes, worldSize);
}

Algorithm AlgorithmSelector::selectFlat(OpKind kind, uint64_t bytes, int worldSize) const {
  switch (kind) {
    case OpKind::kReduceScatter:
    case OpKind::kAllgather: return Algorithm::kRing;
    case OpKind::kBroadcast: return Algorithm::kChain;
    case OpKind::kBarrier: return Algorithm::kDissemination;
    // Trees while latency dominates, then the bandwidth-bound forms
    // (docs/algorithms.md): `bytes` is the whole buffer (reduce) or all
    // ranks' blocks (gather, scatter).
    case OpKind::kReduce:
      return bytes <= kRootedTreeMaxBytes ? Algorithm::kBinomial : Algorithm::kChain;
    case OpKind::kGather:
    case OpKind::kScatter:
      return bytes <= kRootedTreeMaxBytes ? Algorithm::kBinomial : Algorithm::kLinear;
    case OpKind::kAlltoall: return Algorithm::kPairwise;
    case OpKind::kPointToPoint: return Algorithm::kDirect;
    case OpKind::kAlltoallv:
    case OpKind::kAllgatherv: return Algorithm::kPairwise;
    case OpKind::kGatherv:
    case OpKind::kScatterv: return Algorithm::kLinear;
    case OpKind::kAllreduce: break;
  }
  for (const Rule& r : rules_) {
    if (r.kind == kind && bytes >= r.lo && bytes < r.hi &&
        (r.algo == Algorithm::kRing || r.algo == Algorithm::kRecursiveDoubling ||
         r.algo == Algorithm::kHalvingDoubling)) {
      return r.algo;
    }
  }
  if (bytes <= thresholds_.rdMax.value_or(defaultRdMaxBytes(worldSize))) {
    return Algorithm::kRecursiveDoubling;
  }
  return bytes <= thresholds_.hdMax.value_or(defaultHdMaxBytes(worldSize))
             ? Algorithm::kHalvingDoubling
             : Algorithm::kRing;
}

}  // namespace gflow
