#include "backend/router.h"

#include "backend/device_buffers.h"
#include "backend/nccl/nccl_backend.h"
#include "backend/staged/staged_backend.h"
#include "common/check.h"
#include "common/logging.h"

#include <vector>

namespace gflow::backend {

// The host paths: the backend of a routed op's path (network, shared
// memory, hierarchical). The staged backend runs device ops through it.
class HostPaths final : public Backend {
 public:
  explicit HostPaths(std::unique_ptr<Backend> flat) : flat_(std::move(flat)) {
    GFLOW_ENFORCE(flat_ != nullptr);
  }
  // The network path's backend (NCCL's point-to-point headers go there).
  Backend& network() { return *flat_; }
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
    const Path p = op.desc.route.path;
    Backend* b = p == Path::kNetwork        ? flat_.get()
                 : p == Path::kShm          ? shm_.get()
                 : p == Path::kHierarchical ? hier_.get()
                                            : nullptr;
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

Router::Router(RouterParts parts)
    : rank_(parts.rank),
      size_(parts.size),
      verify_(parts.verifyNccl),
      ncclP2P_(parts.ncclP2P),
      policy_(std::move(parts.policy)),
      host_(std::make_unique<HostPaths>(std::move(parts.flat))),
      staged_(createStagedBackend(*host_)) {
  GFLOW_ENFORCE(policy_ != nullptr);
}

Router::~Router() = default;

void Router::attach(HostParts host, const DeviceSetup& device) {
  caps_ = host.caps;
  host_->attach(std::move(host.shm), std::move(host.hierarchical));
  nccl_ = std::make_unique<NcclBackend>(device);
  if (verify_ && size_ > 1) {
    // The check's allgather runs on the host route of its own description.
    nccl_->setOpCheck(std::make_unique<NcclOpCheck>(rank_, size_, *host_, [this](const OpDesc& d) {
      return policy_->choose(d, size_, caps_, nullptr);
    }));
  }
}

void Router::allreduce(const Op& op, const void* in, void* out) {
  const Op o = route(op);
  at(o).allreduce(o, in, out);
}
void Router::reduceScatter(const Op& op, const void* in, void* out) {
  const Op o = route(op);
  at(o).reduceScatter(o, in, out);
}
void Router::allgather(const Op& op, const void* in, void* out) {
  const Op o = route(op);
  at(o).allgather(o, in, out);
}
void Router::broadcast(const Op& op, void* buf) {
  const Op o = route(op);
  at(o).broadcast(o, buf);
}
void Router::barrier(const Op& op) {
  const Op o = route(op);
  at(o).barrier(o);
}
void Router::reduce(const Op& op, const void* in, void* out) {
  const Op o = route(op);
  at(o).reduce(o, in, out);
}
void Router::gather(const Op& op, const void* in, void* out) {
  const Op o = route(op);
  at(o).gather(o, in, out);
}
void Router::scatter(const Op& op, const void* in, void* out) {
  const Op o = route(op);
  at(o).scatter(o, in, out);
}
void Router::alltoall(const Op& op, const void* in, void* out) {
  const Op o = route(op);
  at(o).alltoall(o, in, out);
}
void Router::alltoallv(const Op& op, const void* in, const Blocks& inBlocks, void* out,
                       const Blocks& outBlocks) {
  const Op o = route(op);
  at(o).alltoallv(o, in, inBlocks, out, outBlocks);
}
void Router::gatherv(const Op& op, const void* in, void* out, const Blocks& blocks) {
  const Op o = route(op);
  at(o).gatherv(o, in, out, blocks);
}
void Router::scatterv(const Op& op, const void* in, const Blocks& blocks, void* out) {
  const Op o = route(op);
  at(o).scatterv(o, in, blocks, out);
}
std::unique_ptr<P2PInFlight> Router::startPointToPoint(const Op& op, std::vector<P2PMessage> msgs) {
  const Op o = route(op);
  if (o.desc.route.path == Path::kNccl) {
    return nccl_->startNcclPointToPoint(o, std::move(msgs), host_->network());
  }
  return at(o).startPointToPoint(o, std::move(msgs));
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

}  // namespace

// The capabilities of the NCCL side that RoutePolicy::choose asks for one op.
class Router::Device final : public DeviceQuery {
 public:
  Device(Router& r, const Op& op) : r_(r), op_(op) {}
  bool ncclRuns() override { return r_.usable(op_); }
  bool ncclHierarchical() override { return r_.nccl_->hierarchical() != nullptr; }
  bool ncclPointToPoint() override { return r_.p2pOnNccl(op_); }

 private:
  Router& r_;
  const Op& op_;
};

Op Router::route(const Op& op) {
  // Device point-to-point calls made before this collective enqueue their
  // NCCL groups first: a rank's ops start in program order.
  if (nccl_ && op.desc.kind != OpKind::kPointToPoint) nccl_->launchP2P(nullptr, true);
  Op routed = op;
  Device device(*this, op);
  routed.desc.route = policy_->choose(op.desc, size_, caps_, op.buffers ? &device : nullptr);
  record(routed);
  return routed;
}

Backend& Router::at(const Op& routed) {
  const Path p = routed.desc.route.path;
  if (p == Path::kNccl) return *nccl_;
  if (p == Path::kNcclHierarchical) return *nccl_->hierarchical();
  if (routed.buffers) return *staged_;
  return *host_;
}

void Router::record(const Op& routed) {
  const OpDesc& d = routed.desc;
  const size_t kind = static_cast<size_t>(d.kind), path = static_cast<size_t>(d.route.path);
  paths_[path].fetch_add(1, std::memory_order_relaxed);
  const bool staged = routed.buffers && onHost(d.route.path);
  if (staged) stagedOps_.fetch_add(1, std::memory_order_relaxed);
  routes_[(kind * kNumPaths + path) * kNumAlgorithms + static_cast<size_t>(d.route.algo)].fetch_add(
      1, std::memory_order_relaxed);
  if (lastRoute_[kind] == d.route || !log::enabled(log::Level::INFO)) return;
  lastRoute_[kind] = d.route;
  GFLOW_LOG(INFO) << "rank " << rank_ << ": " << toString(d.kind) << " #" << routed.seq << " ("
                  << d.count * dataTypeSize(d.dtype) << " bytes x" << size_ << " ranks): path "
                  << toString(d.route.path) << (staged ? " (staged)" : "") << ", algorithm "
                  << toString(d.route.algo);
}

bool Router::usable(const Op& op) {
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

bool Router::canShrink() const {
  return nccl_ && nccl_->canShrink();
}

void Router::shrinkInto(const Op& op, const std::vector<int>& excluded, bool failed,
                        Backend* child) {
  Router* c = child ? dynamic_cast<Router*>(child) : nullptr;
  GFLOW_ENFORCE(c != nullptr && nccl_ != nullptr && c->nccl_ != nullptr);
  nccl_->shrinkInto(op, excluded, failed, c->nccl_.get());
}

PathCounts Router::paths() const {
  PathCounts out;
  for (size_t i = 0; i < kNumPaths; ++i) out.ops[i] = paths_[i].load(std::memory_order_relaxed);
  out.staged = stagedOps_.load(std::memory_order_relaxed);
  return out;
}

std::vector<RouteCount> Router::routes() const {
  std::vector<RouteCount> out;
  for (size_t i = 0; i < routes_.size(); ++i) {
    const uint64_t n = routes_[i].load(std::memory_order_relaxed);
    if (n == 0) continue;
    const auto kind = static_cast<OpKind>(i / (kNumPaths * kNumAlgorithms));
    const auto path = static_cast<Path>(i / kNumAlgorithms % kNumPaths);
    out.push_back({kind, Route{path, static_cast<Algorithm>(i % kNumAlgorithms)}, n});
  }
  return out;
}

void Router::resetPaths() {
  for (auto& p : paths_) p.store(0, std::memory_order_relaxed);
  stagedOps_.store(0, std::memory_order_relaxed);
  for (auto& r : routes_) r.store(0, std::memory_order_relaxed);
}

}  // namespace gflow::backend
