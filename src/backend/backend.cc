#include "backend/backend.h"

#include <sstream>

#include "common/check.h"
#include "common/hash.h"

namespace gflow::backend {

const char* toString(OpKind kind) {
  switch (kind) {
    case OpKind::kAllreduce: return "allreduce";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAllgather: return "allgather";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kReduce: return "reduce";
    case OpKind::kGather: return "gather";
    case OpKind::kScatter: return "scatter";
    case OpKind::kAlltoall: return "alltoall";
    case OpKind::kPointToPoint: return "send/recv";
    case OpKind::kAlltoallv: return "alltoallv";
    case OpKind::kAllgatherv: return "allgatherv";
    case OpKind::kGatherv: return "gatherv";
    case OpKind::kScatterv: return "scatterv";
  }
  return "unknown-op";
}

const char* toString(Path path) {
  switch (path) {
    case Path::kNetwork: return "network";
    case Path::kShm: return "shm";
    case Path::kHierarchical: return "hierarchical";
    case Path::kNccl: return "nccl";
    case Path::kNcclHierarchical: return "nccl-hierarchical";
  }
  return "unknown-path";
}

const char* toString(Algorithm algo) {
  switch (algo) {
    case Algorithm::kAuto: return "auto";
    case Algorithm::kRing: return "ring";
    case Algorithm::kRecursiveDoubling: return "rd";
    case Algorithm::kHalvingDoubling: return "hd";
    case Algorithm::kChain: return "chain";
    case Algorithm::kDissemination: return "dissemination";
    case Algorithm::kBinomial: return "binomial";
    case Algorithm::kLinear: return "linear";
    case Algorithm::kPairwise: return "pairwise";
    case Algorithm::kDirect: return "direct";
    case Algorithm::kFixedOrder: return "fixed-order";
    case Algorithm::kSlots: return "slots";
    case Algorithm::kSingleCopy: return "single-copy";
  }
  return "unknown-algorithm";
}

namespace {
// The route in one byte of the envelope: path in the high nibble.
static_assert(kNumPaths <= 16 && kNumAlgorithms <= 16, "a route fits one byte");
uint64_t routeByte(Route r) {
  return static_cast<uint64_t>(r.path) << 4 | static_cast<uint64_t>(r.algo);
}
}  // namespace

transport::Envelope encode(const OpDesc& d) {
  transport::Envelope e;
  e.words[0] = static_cast<uint64_t>(d.kind) | static_cast<uint64_t>(d.dtype) << 8 |
               static_cast<uint64_t>(d.op) << 16 | routeByte(d.route) << 24 |
               static_cast<uint64_t>(static_cast<uint32_t>(d.root)) << 32;
  e.words[1] = d.count;
  // Low 40 bits: "gflow", the version tag of this encoding; high 24 bits: the
  // parent op's fingerprint (phases of a composed op, 0 otherwise).
  e.words[2] = 0x67666c6f77ull | (d.parent & 0xffffff) << 40;
  return e;
}

namespace {
// FNV-1a over `words`, folded to 24 nonzero bits (0 means "none").
uint64_t digest24(const uint64_t* words, size_t n) {
  uint64_t h = hash::kFnvOffset;
  for (size_t i = 0; i < n; ++i) h = hash::fnv1aWord(h, words[i]);
  h ^= h >> 24;
  return (h & 0xffffff) ? (h & 0xffffff) : 1;
}
}  // namespace

uint64_t fingerprint(const OpDesc& d) {
  const transport::Envelope e = encode(d);
  return digest24(e.words, 3);
}

std::string describe(const transport::Envelope& e) {
  // Decoded defensively: the envelope may come from a confused peer.
  const auto kind = static_cast<OpKind>(e.words[0] & 0xff);
  const auto dtype = static_cast<DataType>((e.words[0] >> 8) & 0xff);
  const auto op = static_cast<ReduceOp>((e.words[0] >> 16) & 0xff);
  const auto path = static_cast<Path>((e.words[0] >> 28) & 0xf);
  const auto algo = static_cast<Algorithm>((e.words[0] >> 24) & 0xf);
  const auto root = static_cast<int32_t>(e.words[0] >> 32);
  std::ostringstream os;
  os << toString(kind) << "(count=" << e.words[1];
  if (kind != OpKind::kBarrier) os << ", " << gflow::toString(dtype);
  if (kind == OpKind::kAllreduce || kind == OpKind::kReduceScatter || kind == OpKind::kReduce)
    os << ", " << gflow::toString(op);
  if (kind == OpKind::kBroadcast || kind == OpKind::kReduce || kind == OpKind::kGather ||
      kind == OpKind::kScatter || kind == OpKind::kGatherv || kind == OpKind::kScatterv)
    os << ", root=" << root;
  os << ", path=" << toString(path) << ", algorithm=" << toString(algo);
  const bool uneven = isUneven(kind);  // alltoallv's parent is 0
  if (const uint64_t parent = e.words[2] >> 40) {
    // An allreduce's is a hierarchical phase's parent, reduceScatterv's
    // counts or, for a piece of a compressed op, the op's count and the
    // piece's place.
    os << (uneven                       ? ", counts digest "
           : kind == OpKind::kAllreduce ? ", phase of op, counts or piece digest "
                                        : ", phase of op ")
       << std::hex << parent;
  }
  os << ")";
  return os.str();
}

Blocks Blocks::equal(int ranks, uint64_t count) {
  Blocks b;
  for (int r = 0; r < ranks; ++r) {
    b.counts.push_back(count);
    b.offsets.push_back(uint64_t(r) * count);
  }
  return b;
}

Blocks Blocks::packed(std::vector<uint64_t> counts) {
  Blocks b;
  uint64_t at = 0;
  for (uint64_t c : counts) {
    b.offsets.push_back(at);
    at += c;
  }
  b.counts = std::move(counts);
  return b;
}

uint64_t Blocks::total() const {
  uint64_t t = 0;
  for (uint64_t c : counts) t += c;
  return t;
}

uint64_t blocksDigest(const std::vector<uint64_t>& counts) {
  return digest24(counts.data(), counts.size());
}

namespace {
[[noreturn]] void notRun(const Backend& b, const Op& op) {
  GFLOW_THROW(kInternal, ErrorContext::forOp(toString(op.desc.kind)).withSeq(op.seq))
      << "the " << b.name() << " backend does not run " << toString(op.desc.kind) << " (route "
      << toString(op.desc.route.path) << "/" << toString(op.desc.route.algo) << " led to it)";
}
}  // namespace

void Backend::reduce(const Op& op, const void*, void*) {
  notRun(*this, op);
}
void Backend::gather(const Op& op, const void*, void*) {
  notRun(*this, op);
}
void Backend::scatter(const Op& op, const void*, void*) {
  notRun(*this, op);
}
void Backend::alltoall(const Op& op, const void*, void*) {
  notRun(*this, op);
}
void Backend::alltoallv(const Op& op, const void*, const Blocks&, void*, const Blocks&) {
  notRun(*this, op);
}
void Backend::gatherv(const Op& op, const void*, void*, const Blocks&) {
  notRun(*this, op);
}
void Backend::scatterv(const Op& op, const void*, const Blocks&, void*) {
  notRun(*this, op);
}
std::unique_ptr<P2PInFlight> Backend::startPointToPoint(const Op& op, std::vector<P2PMessage>) {
  notRun(*this, op);
}

}  // namespace gflow::backend
