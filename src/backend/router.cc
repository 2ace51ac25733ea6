#include "backend/router.h"

#include "backend/device_buffers.h"
#include "backend/nccl/nccl_backend.h"
#include "backend/staged/staged_backend.h"
#include "common/check.h"
#include "common/hash.h"

#include <vector>

namespace gflow::backend {

// Host buffers: the backend that implements the op's algorithm.
class ByAlgorithm final : public Backend {
 public:
  explicit ByAlgorithm(std::unique_ptr<Backend> flat) : flat_(std::move(flat)) {
    GFLOW_ENFORCE(flat_ != nullptr);
  }
  void attach(std::unique_ptr<Backend> shm, std::unique_ptr<Backend> hier) {
    shm_ = std::move(shm);
    hier_ = std::move(hier);
  }

  void allreduce(const Op& op, const void* in, void* out) override {
    pick(op).allreduce(op, in, out);
  }
  void reduceScatter(const Op& op, const void* in, void* out) override {
    pick(op).reduceScatter(op, in, out);
  }
  void allgather(const Op& op, const void* in, void* out) override {
    pick(op).allgather(op, in, out);
  }
  void broadcast(const Op& op, void* buf) override { pick(op).broadcast(op, buf); }
  void barrier(const Op& op) override { pick(op).barrier(op); }
  void reduce(const Op& op, const void* in, void* out) override { pick(op).reduce(op, in, out); }
  void gather(const Op& op, const void* in, void* out) override { pick(op).gather(op, in, out); }
  void scatter(const Op& op, const void* in, void* out) override { pick(op).scatter(op, in, out); }
  void alltoall(const Op& op, const void* in, void* out) override {
    pick(op).alltoall(op, in, out);
  }
  void alltoallv(const Op& op, const void* in, const Blocks& inBlocks, void* out,
                 const Blocks& outBlocks) override {
    pick(op).alltoallv(op, in, inBlocks, out, outBlocks);
  }
  void gatherv(const Op& op, const void* in, void* out, const Blocks& blocks) override {
    pick(op).gatherv(op, in, out, blocks);
  }
  void scatterv(const Op& op, const void* in, const Blocks& blocks, void* out) override {
    pick(op).scatterv(op, in, blocks, out);
  }
  std::unique_ptr<P2PInFlight> startPointToPoint(const Op& op,
                                                 std::vector<P2PMessage> msgs) override {
    return pick(op).startPointToPoint(op, std::move(msgs));
  }
  const char* name() const override { return "host"; }

  void abort(const Error& error) override {
    for (Backend* b : all()) b->abort(error);
  }
  void notifyPeers(const Error& error) override {
    for (Backend* b : all()) b->notifyPeers(error);
  }
  std::vector<Error> awaitReports(Deadline until, int exclude) override {
    std::vector<Error> all;
    for (Backend* b : this->all()) {
      for (Error& e : b->awaitReports(until, exclude)) all.push_back(std::move(e));
    }
    return all;
  }
  // Every backend keeps its own op numbering: each hears of the rejection.
  bool reject(uint64_t seq, const std::string& why) override {
    bool ok = true;
    for (Backend* b : all()) ok = b->reject(seq, why) && ok;
    return ok;
  }
  PeerStats peerStats(int peer) const override {
    PeerStats s;
    for (Backend* b : all()) accumulate(s, b->peerStats(peer));
    return s;
  }
  void registerMemory(void* data, size_t bytes,
                      std::vector<std::unique_ptr<transport::MemoryRegion>>* out) override {
    for (Backend* b : all()) b->registerMemory(data, bytes, out);
  }

 private:
  Backend& pick(const Op& op) {
    const Algorithm a = op.desc.algo;
    Backend* b = a == Algorithm::kShm || a == Algorithm::kShmFixedOrder ? shm_.get()
                 : a == Algorithm::kHierarchical                        ? hier_.get()
                                                                        : flat_.get();
    GFLOW_ENFORCE(b != nullptr);
    return *b;
  }
  std::vector<Backend*> all() const {
    std::vector<Backend*> v;
    for (Backend* b : {flat_.get(), shm_.get(), hier_.get()}) {
      if (b) v.push_back(b);
    }
    return v;
  }

  std::unique_ptr<Backend> flat_;
  std::unique_ptr<Backend> shm_;
  std::unique_ptr<Backend> hier_;
};

namespace {

Path hostPath(Algorithm a) {
  return a == Algorithm::kShm || a == Algorithm::kShmFixedOrder ? Path::kShm
         : a == Algorithm::kHierarchical                        ? Path::kHierarchical
                                                                : Path::kNetwork;
}

// 64 bits of everything in an op's description that must agree.
uint64_t digest(const OpDesc& d) {
  uint64_t h = hash::kFnvOffset;
  for (uint64_t v : {uint64_t(d.kind), uint64_t(d.dtype), uint64_t(d.op), uint64_t(d.algo),
                     uint64_t(int64_t(d.root)), d.count, d.parent}) {
    h = hash::mix(h, v);
    h ^= h >> 29;
  }
  return h;
}

}  // namespace

Router::Router(RouterParts parts)
    : rank_(parts.rank),
      size_(parts.size),
      verify_(parts.verifyNccl),
      ncclP2P_(parts.ncclP2P),
      select_(std::move(parts.select)),
      host_(std::make_unique<ByAlgorithm>(std::move(parts.flat))),
      staged_(createStagedBackend(*host_)) {}

Router::~Router() = default;

void Router::attach(std::unique_ptr<Backend> shm, std::unique_ptr<Backend> hierarchical,
                    const DeviceSetup& device) {
  host_->attach(std::move(shm), std::move(hierarchical));
  nccl_ = std::make_unique<NcclBackend>(device);
}

void Router::allreduce(const Op& op, const void* in, void* out) {
  route(op).allreduce(op, in, out);
}
void Router::reduceScatter(const Op& op, const void* in, void* out) {
  route(op).reduceScatter(op, in, out);
}
void Router::allgather(const Op& op, const void* in, void* out) {
  route(op).allgather(op, in, out);
}
void Router::broadcast(const Op& op, void* buf) {
  route(op).broadcast(op, buf);
}
void Router::barrier(const Op& op) {
  route(op).barrier(op);
}
void Router::reduce(const Op& op, const void* in, void* out) {
  route(op).reduce(op, in, out);
}
void Router::gather(const Op& op, const void* in, void* out) {
  route(op).gather(op, in, out);
}
void Router::scatter(const Op& op, const void* in, void* out) {
  route(op).scatter(op, in, out);
}
void Router::alltoall(const Op& op, const void* in, void* out) {
  route(op).alltoall(op, in, out);
}
void Router::alltoallv(const Op& op, const void* in, const Blocks& inBlocks, void* out,
                       const Blocks& outBlocks) {
  route(op, &inBlocks, &outBlocks).alltoallv(op, in, inBlocks, out, outBlocks);
}
void Router::gatherv(const Op& op, const void* in, void* out, const Blocks& blocks) {
  route(op).gatherv(op, in, out, blocks);
}
void Router::scatterv(const Op& op, const void* in, const Blocks& blocks, void* out) {
  route(op).scatterv(op, in, blocks, out);
}
std::unique_ptr<P2PInFlight> Router::startPointToPoint(const Op& op, std::vector<P2PMessage> msgs) {
  if (p2pOnNccl(op)) {
    count(Path::kNccl);
    return nccl_->startNcclPointToPoint(op, std::move(msgs), *host_);
  }
  return route(op).startPointToPoint(op, std::move(msgs));
}

bool Router::p2pOnNccl(const Op& op) {
  if (!ncclP2P_ || !op.buffers || !nccl_) return false;
  const auto refuse = [&](const std::string& why) {
    GFLOW_THROW(kInvalidArgument, ErrorContext().withSeq(op.seq).withRank(rank_))
        << "point-to-point on cuda tensors runs on NCCL here (GFLOW_NCCL_P2P=1, "
           "Options::device.p2p), but "
        << why;
  };
  if (nccl_->undecided() && !nccl_->stagedByConfiguration()) {
    refuse(
        "NCCL has not started on this rank: call a collective on cuda tensors first (that "
        "first call is where the ranks choose NCCL or staging)");
  }
  if (!nccl_->active()) return false;  // every rank stages (or will)
  int device = -1;
  void* ready = nullptr;
  if (!op.buffers->single(&device, &ready) || device != nccl_->device()) {
    refuse("the call's tensors are not all in memory of cuda:" + std::to_string(nccl_->device()) +
           " on one stream (a call's messages go all through NCCL or all through the host: pass "
           "only cuda tensors of this communicator's GPU, or only cpu tensors)");
  }
  return true;
}

namespace {

// Ops whose root-only buffer (none off the root) comes after the buffer
// every rank passes: NCCL runs them when that one is on the GPU, and the
// root's own buffer may be anywhere (NcclBackend copies it through the GPU).
bool rooted(OpKind k) {
  return k == OpKind::kReduce || k == OpKind::kGather || k == OpKind::kScatter ||
         k == OpKind::kGatherv || k == OpKind::kScatterv;
}

// A well-mixed 64-bit digest of "rank `from` sends `count` elements to rank
// `to`" (splitmix64's finalizer over the three).
uint64_t pairDigest(uint64_t from, uint64_t to, uint64_t count) {
  uint64_t z = hash::mix(hash::mix(hash::mix(hash::kFnvOffset, from), to), count);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Up to this many ranks the alltoallv check carries every count (and names
// the pair that disagrees); beyond, two digest sums per rank.
constexpr int kCountsInCheck = 64;

}  // namespace

Backend& Router::route(const Op& op, const Blocks* in, const Blocks* out) {
  const bool p2p = op.desc.kind == OpKind::kPointToPoint;
  // Device point-to-point calls made before this collective enqueue their
  // NCCL groups first: a rank's ops start in program order.
  if (nccl_ && !p2p) nccl_->launchP2P(nullptr, true);
  if (!p2p && op.buffers && usable(op) && (!verify_ || size_ == 1 || checkNccl(op, in, out))) {
    count(Path::kNccl);
    return nccl_->forOp(op);
  }
  count(hostPath(op.desc.algo));
  if (!op.buffers) return *host_;
  count(Path::kStaged);
  return *staged_;
}

bool Router::usable(const Op& op) {
  // NCCL cannot be made to reduce in rank order (its order follows its
  // channels and algorithm): reproducible ops stage through the host's
  // fixed-order algorithm, so device and host buffers get the same bits.
  if (isFixedOrder(op.desc.algo)) return false;
  int device = -1;
  void* ready = nullptr;
  const bool on = rooted(op.desc.kind) ? op.buffers->leading(&device, &ready)
                                       : op.buffers->single(&device, &ready);
  if (!nccl_ || !nccl_->use(op, op.buffers->plugin(), device) || !on) return false;
  if (device != nccl_->device()) {
    GFLOW_THROW(kInvalidArgument, ErrorContext().withSeq(op.seq).withRank(rank_))
        << "this communicator runs NCCL on cuda:" << nccl_->device()
        << ", but this op's tensors are on cuda:" << device
        << " (NCCL binds a communicator to one GPU: use another communicator for this GPU, or "
           "GFLOW_DEVICE_BACKEND=staged)";
  }
  return true;
}

bool Router::checkNccl(const Op& op, const Blocks* in, const Blocks* out) {
  // A tiny allgather over the host backend whose envelope carries this op's
  // fingerprint (24 bits). Its values: a digest of the whole description
  // (all 64 bits) and, for all-to-all-v (whose counts differ by rank), every
  // rank's send and receive counts, or beyond kCountsInCheck ranks the sums
  // of its digests of each pair's send count and of each pair's receive
  // count, whose totals over all ranks agree exactly when every send matches
  // its receive. Every rank sees the same values and reaches the same
  // verdict; one round, whose width every rank knows.
  const size_t n = static_cast<size_t>(size_);
  const bool counts = in && out, full = counts && size_ <= kCountsInCheck;
  std::vector<int64_t> mine = {static_cast<int64_t>(digest(op.desc))};
  if (full) {
    for (size_t r = 0; r < n; ++r) mine.push_back(static_cast<int64_t>(in->counts[r]));
    for (size_t r = 0; r < n; ++r) mine.push_back(static_cast<int64_t>(out->counts[r]));
  } else if (counts) {
    uint64_t sends = 0, receives = 0;
    for (size_t r = 0; r < n; ++r) {
      sends += pairDigest(uint64_t(rank_), r, in->counts[r]);
      receives += pairDigest(r, uint64_t(rank_), out->counts[r]);
    }
    mine.push_back(static_cast<int64_t>(sends));
    mine.push_back(static_cast<int64_t>(receives));
  }
  const size_t width = mine.size();
  OpDesc v{OpKind::kAllgather, DataType::kInt64, ReduceOp::kSum, Algorithm::kAuto, 0, width};
  v.algo = select_(OpKind::kAllgather, sizeof(int64_t) * width * n, size_);
  v.parent = fingerprint(op.desc);
  Op check;
  check.seq = op.seq;
  check.desc = v;
  check.deadline = op.deadline;
  std::vector<int64_t> all(width * n);
  host_->allgather(check, mine.data(), all.data());
  uint64_t sends = 0, receives = 0;
  for (size_t r = 0; r < n; ++r) {
    if (all[r * width] != mine[0]) {
      GFLOW_THROW(kMismatch, ErrorContext().withSeq(op.seq).withRank(rank_).withPeer(int(r)))
          << "rank " << r << " called another op on NCCL than this rank ("
          << describe(encode(op.desc)) << ")";
    }
    if (counts && !full) {
      sends += static_cast<uint64_t>(all[r * width + 1]);
      receives += static_cast<uint64_t>(all[r * width + 2]);
    }
  }
  for (size_t i = 0; full && i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      const int64_t sent = all[i * width + 1 + j], expects = all[j * width + 1 + n + i];
      if (sent == expects) continue;
      GFLOW_THROW(kMismatch, ErrorContext().withSeq(op.seq).withRank(rank_).withPeer(int(i)))
          << "rank " << i << " sends " << sent << " elements to rank " << j << ", which expects "
          << expects << " from it (alltoallv counts)";
    }
  }
  if (sends != receives) {
    GFLOW_THROW(kMismatch, ErrorContext().withSeq(op.seq).withRank(rank_))
        << "the ranks' alltoallv counts disagree: some rank sends a block of another size than "
           "its receiver expects";
  }
  return true;
}

void Router::abort(const Error& error) {
  host_->abort(error);
  if (nccl_) nccl_->abort(error);
}

void Router::notifyPeers(const Error& error) {
  host_->notifyPeers(error);
  if (nccl_) nccl_->notifyPeers(error);
}

std::vector<Error> Router::awaitReports(Deadline until, int exclude) {
  return host_->awaitReports(until, exclude);  // NCCL's one report is the verdict already
}

bool Router::reject(uint64_t seq, const std::string& why) {
  // Once NCCL has run, a peer's kernel for the op cannot be recalled: NCCL
  // says no (NcclBackend::reject), and the communicator fails as before.
  if (nccl_ && !nccl_->reject(seq, why)) return false;
  return host_->reject(seq, why);
}

PeerStats Router::peerStats(int peer) const {
  return host_->peerStats(peer);
}

void Router::registerMemory(void* data, size_t bytes,
                            std::vector<std::unique_ptr<transport::MemoryRegion>>* out) {
  host_->registerMemory(data, bytes, out);
}

void Router::splitInto(const Op& op, int color, int key, Backend* child) {
  Router* c = child ? dynamic_cast<Router*>(child) : nullptr;
  GFLOW_ENFORCE(child == nullptr || c != nullptr);
  if (nccl_) nccl_->splitInto(op, color, key, c ? c->nccl_.get() : nullptr);
}

PathCounts Router::paths() const {
  PathCounts out{};
  for (size_t i = 0; i < kNumPaths; ++i) out[i] = paths_[i].load(std::memory_order_relaxed);
  return out;
}

void Router::resetPaths() {
  for (auto& p : paths_) p.store(0, std::memory_order_relaxed);
}

}  // namespace gflow::backend
