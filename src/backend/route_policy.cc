#include "backend/route_policy.h"

#include <sstream>

#include "common/check.h"
#include "common/logging.h"
#include "common/params.h"

namespace gflow::backend {
namespace {

// A rule's route: an algorithm over the network, or a path with its own
// choice; {kNetwork, kAuto} is "auto" (no rule).
Route parseRoute(const std::string& s, const std::string& source) {
  if (s == "ring") return Algorithm::kRing;
  if (s == "rd" || s == "recursive_doubling") return Algorithm::kRecursiveDoubling;
  if (s == "hd" || s == "halving_doubling") return Algorithm::kHalvingDoubling;
  if (s == "hier" || s == "hierarchical") return {Path::kHierarchical, Algorithm::kAuto};
  if (s == "shm") return {Path::kShm, Algorithm::kAuto};
  if (s == "auto") return {};
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

bool reduces(OpKind k) {
  return k == OpKind::kAllreduce || k == OpKind::kReduceScatter;
}

}  // namespace

// Measured on loopback TCP, float32 sum, by interleaved rounds
// (docs/performance.md, "Halving-doubling"). Recursive doubling moves log2(N)
// whole buffers in as many messages: on two ranks (one exchange) it wins up
// to about 512 KiB, on more only up to about 64 KiB. Halving-doubling moves
// the ring's bytes in 2 log2(N) pairwise exchanges of one message each and
// beats the ring's pipeline of pieces up to about 8 MiB on two ranks (where
// it is the ring without pieces) and 4 MiB on more.
uint64_t RoutePolicy::defaultRdMaxBytes(int worldSize) {
  return worldSize <= 2 ? (512u << 10) : (64u << 10);
}

uint64_t RoutePolicy::defaultHdMaxBytes(int worldSize) {
  return worldSize <= 2 ? (8u << 20) : (16u << 20);
}

RoutePolicy::RoutePolicy(const std::string& spec, const std::string& source,
                         const Thresholds& thresholds, std::optional<CostModel> model)
    : thresholds_(thresholds), model_(std::move(model)) {
  if (spec.empty() || spec == "auto") return;
  for (const std::string& part : split(spec, ',')) {
    std::vector<std::string> f = split(part, ':');
    if (f.size() == 1) {
      rules_.push_back({OpKind::kAllreduce, 0, UINT64_MAX, parseRoute(f[0], source)});
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
    rules_.push_back({OpKind::kAllreduce, lo, hi, parseRoute(f[2], source)});
  }
}

ByteRange RoutePolicy::shmSingleCopyRange(const std::string& setting, int members,
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

uint64_t RoutePolicy::bytesOf(const OpDesc& d, int ranks) {
  const bool perRank = d.kind == OpKind::kAllgather || d.kind == OpKind::kReduceScatter ||
                       d.kind == OpKind::kGather || d.kind == OpKind::kScatter ||
                       d.kind == OpKind::kAlltoall;
  return d.count * dataTypeSize(d.dtype) * (perRank ? static_cast<uint64_t>(ranks) : 1);
}

Route RoutePolicy::choose(const OpDesc& d, int ranks, const Capabilities& caps,
                          DeviceQuery* device) const {
  const Route host = onHost(d, bytesOf(d, ranks), ranks, caps);
  if (!device) return host;
  if (d.kind == OpKind::kPointToPoint) {
    return device->ncclPointToPoint() ? Route{Path::kNccl, Algorithm::kDirect} : host;
  }
  // NCCL cannot be made to reduce in rank order (its order follows its
  // channels and algorithm): reproducible ops stage through the host's
  // fixed order, so device and host buffers get the same bits.
  if (host.algo == Algorithm::kFixedOrder || !device->ncclRuns()) return host;
  // avg divides on the host in the hierarchical composition: flat on NCCL,
  // which averages natively, as are the collectives it regroups in memory.
  if (host.path == Path::kHierarchical && d.kind == OpKind::kAllreduce && d.op != ReduceOp::kAvg &&
      device->ncclHierarchical()) {
    return {Path::kNcclHierarchical, Algorithm::kAuto};
  }
  return {Path::kNccl, Algorithm::kAuto};
}

Route RoutePolicy::onHost(const OpDesc& d, uint64_t bytes, int ranks,
                          const Capabilities& caps) const {
  const OpKind kind = d.kind;
  if (d.reproducible && reduces(kind)) {
    return {caps.shm ? Path::kShm : Path::kNetwork, Algorithm::kFixedOrder};
  }
  if (kind == OpKind::kAllreduce) {
    if (std::optional<Route> r = byRule(kind, bytes, caps)) {
      return r->path == Path::kShm ? Route{Path::kShm, shm(kind, bytes, caps.shmSingleCopy)} : *r;
    }
  }
  // Shared memory has no point-to-point channel and no uneven forms; the
  // hierarchical composition runs the reductions, allgather, broadcast and
  // barrier (reduce-scatter and allgather on equal hosts only).
  const bool shmRuns = kind != OpKind::kPointToPoint && !isUneven(kind);
  const bool hierRuns =
      kind == OpKind::kAllreduce || kind == OpKind::kBroadcast || kind == OpKind::kBarrier ||
      (caps.uniform && (kind == OpKind::kReduceScatter || kind == OpKind::kAllgather));
  if (caps.shm && shmRuns) return {Path::kShm, shm(kind, bytes, caps.shmSingleCopy)};
  if (caps.hierarchical && hierRuns) {
    if (std::optional<Algorithm> flat = flatByModel(kind, bytes, caps)) {
      return {Path::kNetwork, *flat};
    }
    return {Path::kHierarchical, Algorithm::kAuto};
  }
  return network(kind, bytes, ranks);
}

std::optional<Route> RoutePolicy::byRule(OpKind kind, uint64_t bytes,
                                         const Capabilities& caps) const {
  for (const Rule& r : rules_) {
    if (r.kind != kind || !ByteRange{r.lo, r.hi}.has(bytes) || r.route == Route{}) continue;
    const bool shm = r.route.path == Path::kShm, hier = r.route.path == Path::kHierarchical;
    if ((shm && !caps.shm) || (hier && !caps.hierarchical)) {
      if (!warnedUnavailable_.exchange(true)) {
        GFLOW_LOG(WARN) << "algorithm '" << (shm ? "shm" : "hier")
                        << "' was requested but this communicator cannot run it ("
                        << (shm ? "its ranks are not all on one host with shared memory"
                                : "it does not span several hosts with several ranks on one")
                        << "); using the automatic choice";
      }
      continue;
    }
    return r.route;
  }
  return std::nullopt;
}

std::optional<Algorithm> RoutePolicy::flatByModel(OpKind kind, uint64_t bytes,
                                                  const Capabilities& caps) const {
  if (kind != OpKind::kAllreduce || !caps.uniform || !model_ || !model_->params().hasLocal ||
      thresholds_.rdMax || thresholds_.hdMax) {
    return std::nullopt;
  }
  const CostModel::Choice c =
      model_->fastest(bytes, CostModel::Layout{caps.hosts, caps.perHost}, caps.segmentBytes);
  if (c.hierarchical) return std::nullopt;
  return c.algo;
}

Route RoutePolicy::phase(OpKind kind, uint64_t bytes, int ranks, Path path,
                         const ByteRange& singleCopy) const {
  if (path == Path::kShm) return {Path::kShm, shm(kind, bytes, singleCopy)};
  return network(kind, bytes, ranks);
}

Algorithm RoutePolicy::shm(OpKind kind, uint64_t bytes, const ByteRange& singleCopy) {
  return kind == OpKind::kAllreduce && singleCopy.has(bytes) ? Algorithm::kSingleCopy
                                                             : Algorithm::kSlots;
}

Algorithm RoutePolicy::network(OpKind kind, uint64_t bytes, int ranks) const {
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
    if (r.kind == kind && ByteRange{r.lo, r.hi}.has(bytes) && r.route.path == Path::kNetwork &&
        r.route.algo != Algorithm::kAuto) {
      return r.route.algo;
    }
  }
  if (model_ && !thresholds_.rdMax && !thresholds_.hdMax) return model_->fastest(bytes, ranks);
  if (bytes <= thresholds_.rdMax.value_or(defaultRdMaxBytes(ranks))) {
    return Algorithm::kRecursiveDoubling;
  }
  return bytes <= thresholds_.hdMax.value_or(defaultHdMaxBytes(ranks)) ? Algorithm::kHalvingDoubling
                                                                       : Algorithm::kRing;
}

}  // namespace gflow::backend
