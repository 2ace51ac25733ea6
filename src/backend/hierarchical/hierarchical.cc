#include "backend/hierarchical/hierarchical.h"
#include "backend/hierarchical/phase_worker.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "common/check.h"
#include "common/params.h"
#include "kernels/reduce.h"

namespace gflow::backend {

int Hierarchy::localSizeOf(int h) const {
  return static_cast<int>(std::count(hostOf.begin(), hostOf.end(), h));
}

std::vector<int> Hierarchy::ranksOfHost(int h) const {
  std::vector<int> out;
  for (int r = 0; r < size; ++r) {
    if (hostOf[r] == h) out.push_back(r);
  }
  return out;
}

std::vector<int> Hierarchy::ranksWithLocalRank(int l) const {
  std::vector<int> byHost(numHosts, -1);
  for (int r = 0; r < size; ++r) {
    if (localRankOf[r] == l) byHost[hostOf[r]] = r;
  }
  std::vector<int> out;
  for (int r : byHost) {
    if (r >= 0) out.push_back(r);
  }
  return out;
}

Hierarchy Hierarchy::fromHostHashes(int rank, const std::vector<uint64_t>& hostHash) {
  Hierarchy h;
  h.rank = rank;
  h.size = static_cast<int>(hostHash.size());
  std::map<uint64_t, int> index;
  std::vector<int> count;
  for (int r = 0; r < h.size; ++r) {
    auto it = index.find(hostHash[r]);
    if (it == index.end()) {
      it = index.emplace(hostHash[r], static_cast<int>(count.size())).first;
      count.push_back(0);
    }
    h.hostOf.push_back(it->second);
    h.localRankOf.push_back(count[it->second]++);
  }
  h.numHosts = static_cast<int>(count.size());
  h.uniform = std::all_of(count.begin(), count.end(), [&](int c) { return c == count[0]; });
  return h;
}

namespace {

class HierarchicalBackend final : public Backend {
 public:
  HierarchicalBackend(const Hierarchy& h, std::unique_ptr<Backend> local,
                      std::unique_ptr<Backend> cross, PhaseRoutes routes, uint64_t segmentBytes)
      : h_(h),
        routes_(std::move(routes)),
        local_(std::move(local)),
        cross_(std::move(cross)),
        localRanks_(h.ranksOfHost(h.host())),
        crossRanks_(h.ranksWithLocalRank(h.localRank())),
        segmentBytes_(segmentBytes > 0 ? segmentBytes
                                       : std::max<uint64_t>(params::hierSegment(), 4096)) {
    for (int host = 0; host < h.numHosts; ++host) hostRanks_.push_back(h.ranksOfHost(host));
    for (size_t i = 0; i < localRanks_.size(); ++i) localIndex_[localRanks_[i]] = int(i);
    for (size_t i = 0; i < crossRanks_.size(); ++i) crossIndex_[crossRanks_[i]] = int(i);
    local_->setWhileWaiting([this] { answerFor(*cross_, crossMu_); });
    cross_->setWhileWaiting([this] { answerFor(*local_, localMu_); });
  }

  void allreduce(const Op& op, const void* inp, void* outp) override {
    const OpDesc& d = op.desc;
    const size_t es = dataTypeSize(d.dtype);
    const char* in = static_cast<const char*>(inp);
    char* out = static_cast<char*>(outp);
    const ReduceOp rop = d.op == ReduceOp::kAvg ? ReduceOp::kSum : d.op;
    const uint64_t L = static_cast<uint64_t>(localRanks_.size());
    if (!h_.uniform) {
      // Leaders (local rank 0) carry the host's sum across hosts.
      runLocal(op, OpKind::kAllreduce, rop, d.count, 0,
               [&](const Op& o) { local_->allreduce(o, in, out); });
      if (h_.localRank() == 0) {
        runCross(op, OpKind::kAllreduce, rop, d.count, 0,
                 [&](const Op& o) { cross_->allreduce(o, out, out); });
        if (d.op == ReduceOp::kAvg && d.count > 0) kernels::divide(out, d.count, d.dtype, h_.size);
      }
      runLocal(op, OpKind::kBroadcast, rop, d.count, 0,
               [&](const Op& o) { local_->broadcast(o, out); });
      return;
    }
    const uint64_t block = d.count / L;
    const uint64_t tail = d.count - block * L;
    if (block > 0 || tail == 0) allreduceBlocks(op, rop, in, out, block * L);
    if (tail > 0) {
      const size_t at = block * L * es;
      runLocal(op, OpKind::kAllreduce, rop, tail, 0,
               [&](const Op& o) { local_->allreduce(o, in + at, out + at); });
      runCross(op, OpKind::kAllreduce, rop, tail, 0,
               [&](const Op& o) { cross_->allreduce(o, out + at, out + at); });
      if (d.op == ReduceOp::kAvg) kernels::divide(out + at, tail, d.dtype, h_.size);
    }
  }

  // The first `count` elements (a multiple of the local size L) in segments
  // of about segmentBytes_: local reduce-scatter, cross allreduce of this
  // rank's block, local allgather. This rank's block of a segment lives in
  // its own place in `out` throughout (the reduce-scatter writes it there,
  // in place when in == out; the allgather then runs in place), so the
  // phases touch no memory of their own and run on any buffers the parts
  // take, device memory included. The cross phase of segment s runs on the
  // backend's phase worker (one long-lived thread) while this thread runs the local phases of
  // segments s-1 (allgather) and s+1 (reduce-scatter), so the network is busy while shared memory
  // works. Every member runs the local phases in the same order (RS0 RS1 AG0 RS2 AG1 ...) and the
  // cross phases in segment order.
  void allreduceBlocks(const Op& op, ReduceOp rop, const char* in, char* out, uint64_t count) {
    const OpDesc& d = op.desc;
    const size_t es = dataTypeSize(d.dtype);
    const uint64_t L = static_cast<uint64_t>(localRanks_.size());
    const uint64_t l = static_cast<uint64_t>(h_.localRank());
    uint64_t segElems = std::max<uint64_t>(segmentBytes_ / es / L, 1) * L;
    if (count / 2 < segElems) segElems = std::max<uint64_t>(count, L);
    struct Seg {
      uint64_t off, block;
      char* mine;  // this rank's block of the segment, in `out`
    };
    std::vector<Seg> segs;
    for (uint64_t off = 0; off < count || segs.empty(); off += segElems) {
      const uint64_t block = std::min(segElems, count - off) / L;
      segs.push_back({off, block, out + (off + block * l) * es});
    }
    auto localRs = [&](size_t s) {
      runLocal(op, OpKind::kReduceScatter, rop, segs[s].block, 0,
               [&](const Op& o) { local_->reduceScatter(o, in + segs[s].off * es, segs[s].mine); });
    };
    auto cross = [&](size_t s) {
      runCross(op, OpKind::kAllreduce, rop, segs[s].block, 0,
               [&](const Op& o) { cross_->allreduce(o, segs[s].mine, segs[s].mine); });
    };
    auto localAg = [&](size_t s) {
      if (d.op == ReduceOp::kAvg && segs[s].block > 0) {
        kernels::divide(segs[s].mine, segs[s].block, d.dtype, h_.size);
      }
      runLocal(op, OpKind::kAllgather, rop, segs[s].block, 0,
               [&](const Op& o) { local_->allgather(o, segs[s].mine, out + segs[s].off * es); });
    };
    if (segs.size() == 1) {
      localRs(0);
      cross(0);
      localAg(0);
      return;
    }
    try {
      localRs(0);
      crossWorker_.start([&] { cross(0); });
      for (size_t s = 1; s < segs.size(); ++s) {
        localRs(s);  // overlaps cross(s-1)
        crossWorker_.wait();
        crossWorker_.start([&cross, s] { cross(s); });
        localAg(s - 1);  // overlaps cross(s)
      }
      crossWorker_.wait();
      localAg(segs.size() - 1);
    } catch (...) {
      // The worker uses the blocks and the cross backend: stop its phase
      // before they go away (its own error is this one's consequence).
      if (crossWorker_.pending()) {
        cross_->abort(Error(ErrorCode::kAborted,
                            "a local phase of this hierarchical allreduce failed",
                            ErrorContext().withSeq(op.seq).withRank(h_.rank)));
        try {
          crossWorker_.wait();
        } catch (...) {
        }
      }
      throw;
    }
  }

  // Equal hosts only (the selector runs the flat ring otherwise). Blocks are
  // regrouped so that the blocks of the ranks with local rank l sit together,
  // ordered by host: local rank l's share of the local phase is then exactly
  // what the cross phase among the ranks with local rank l needs.
  void reduceScatter(const Op& op, const void* inp, void* outp) override {
    if (!h_.uniform) unsupported(op);
    const OpDesc& d = op.desc;
    const size_t es = dataTypeSize(d.dtype), blockBytes = d.count * es;
    const ReduceOp rop = d.op == ReduceOp::kAvg ? ReduceOp::kSum : d.op;
    const uint64_t H = static_cast<uint64_t>(h_.numHosts), L = localRanks_.size();
    char* grouped = scratch(2 * H * L * blockBytes);
    char* mine = grouped + H * L * blockBytes;
    const char* in = static_cast<const char*>(inp);
    for (uint64_t l = 0; l < L && blockBytes > 0; ++l) {
      for (uint64_t host = 0; host < H; ++host) {
        const int r = hostRanks_[host][l];
        std::memcpy(grouped + (l * H + host) * blockBytes, in + r * blockBytes, blockBytes);
      }
    }
    runLocal(op, OpKind::kReduceScatter, rop, H * d.count, 0,
             [&](const Op& o) { local_->reduceScatter(o, grouped, mine); });
    runCross(op, OpKind::kReduceScatter, rop, d.count, 0,
             [&](const Op& o) { cross_->reduceScatter(o, mine, outp); });
    if (d.op == ReduceOp::kAvg && d.count > 0) kernels::divide(outp, d.count, d.dtype, h_.size);
  }

  void allgather(const Op& op, const void* inp, void* outp) override {
    if (!h_.uniform) unsupported(op);
    const OpDesc& d = op.desc;
    const size_t es = dataTypeSize(d.dtype), blockBytes = d.count * es;
    const uint64_t H = static_cast<uint64_t>(h_.numHosts), L = localRanks_.size();
    char* byHost = scratch((H + H * L) * blockBytes);
    char* grouped = byHost + H * blockBytes;
    runCross(op, OpKind::kAllgather, d.op, d.count, 0,
             [&](const Op& o) { cross_->allgather(o, inp, byHost); });
    runLocal(op, OpKind::kAllgather, d.op, H * d.count, 0,
             [&](const Op& o) { local_->allgather(o, byHost, grouped); });
    char* out = static_cast<char*>(outp);
    for (uint64_t l = 0; l < L && blockBytes > 0; ++l) {
      for (uint64_t host = 0; host < H; ++host) {
        const int r = hostRanks_[host][l];
        std::memmove(out + r * blockBytes, grouped + (l * H + host) * blockBytes, blockBytes);
      }
    }
  }

  void broadcast(const Op& op, void* buf) override {
    const OpDesc& d = op.desc;
    const int rootHost = h_.hostOf[d.root];
    if (h_.host() == rootHost) {
      runLocal(op, OpKind::kBroadcast, ReduceOp::kSum, d.count, h_.localRankOf[d.root],
               [&](const Op& o) { local_->broadcast(o, buf); });
    }
    if (h_.localRank() == 0) {
      // The leaders' group is ordered by host index.
      const int root = crossIndex_.at(hostRanks_[rootHost][0]);
      runCross(op, OpKind::kBroadcast, ReduceOp::kSum, d.count, root,
               [&](const Op& o) { cross_->broadcast(o, buf); });
    }
    if (h_.host() != rootHost) {
      runLocal(op, OpKind::kBroadcast, ReduceOp::kSum, d.count, 0,
               [&](const Op& o) { local_->broadcast(o, buf); });
    }
  }

  void barrier(const Op& op) override {
    runLocal(op, OpKind::kBarrier, ReduceOp::kSum, 0, 0, [&](const Op& o) { local_->barrier(o); });
    if (h_.localRank() == 0) {
      runCross(op, OpKind::kBarrier, ReduceOp::kSum, 0, 0,
               [&](const Op& o) { cross_->barrier(o); });
    }
    runLocal(op, OpKind::kBarrier, ReduceOp::kSum, 0, 0, [&](const Op& o) { local_->barrier(o); });
  }

  // The rooted ops and all-to-all run flat across hosts (the selection's
  // choice), so this backend keeps Backend's defaults for them.
  const char* name() const override { return "hierarchical"; }

  void abort(const Error& error) override {
    local_->abort(error);
    cross_->abort(error);
  }
  void notifyPeers(const Error& error) override {
    local_->notifyPeers(error);
    cross_->notifyPeers(error);
  }
  std::vector<Error> awaitReports(Deadline until, int exclude) override {
    auto partIndex = [exclude](const std::map<int, int>& index) {
      auto it = index.find(exclude);
      return it == index.end() ? -1 : it->second;
    };
    // The reporters renumbered as the communicator's ranks (the culprits
    // in the reports are already).
    std::vector<Error> all;
    for (Error& e : local_->awaitReports(until, partIndex(localIndex_)))
      all.push_back(reporterRenumbered(e, localRanks_));
    for (Error& e : cross_->awaitReports(until, partIndex(crossIndex_)))
      all.push_back(reporterRenumbered(e, crossRanks_));
    return all;
  }
  // Each part's next sub-op number goes to the rejected op, on every rank
  // that rejects it, so the parts' numbering stays the same on every rank.
  bool reject(uint64_t seq, const std::string& why) override {
    (void)seq;
    bool ok = false;
    {
      const std::lock_guard<std::mutex> busy(localMu_);
      ok = local_->reject(++localSeq_, why);
    }
    const std::lock_guard<std::mutex> busy(crossMu_);
    return cross_->reject(++crossSeq_, why) && ok;
  }
  PeerStats peerStats(int peer) const override {
    PeerStats s;
    auto l = localIndex_.find(peer);
    if (l != localIndex_.end()) accumulate(s, local_->peerStats(l->second));
    auto c = crossIndex_.find(peer);
    if (c != crossIndex_.end()) accumulate(s, cross_->peerStats(c->second));
    return s;
  }
  void registerMemory(void* data, size_t bytes,
                      std::vector<std::unique_ptr<transport::MemoryRegion>>* out) override {
    local_->registerMemory(data, bytes, out);
    cross_->registerMemory(data, bytes, out);
  }

 private:
  [[noreturn]] void unsupported(const Op& op) {
    GFLOW_THROW(kInternal,
                ErrorContext::forOp(toString(op.desc.kind)).withSeq(op.seq).withRank(h_.rank))
        << "the hierarchical backend does not run " << toString(op.desc.kind)
        << " (a route policy bug: RoutePolicy::choose never routes it here)";
  }

  char* scratch(size_t bytes) {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return scratch_.data();
  }

  // A phase's description: `kind` over `count` elements (its route is the
  // caller's to set).
  static OpDesc subDesc(const Op& op, OpKind kind, ReduceOp rop, uint64_t count, int root) {
    OpDesc d = op.desc;
    d.parent = fingerprint(op.desc);
    d.kind = kind;
    d.op = rop;
    d.count = count;
    d.root = root;
    return d;
  }
  // Phase `d` of `op`, numbered `seq` among `ranks` ranks, routed by `route`.
  static Op phaseOp(uint64_t seq, const Op& op, OpDesc d, const RouteOf& route, size_t ranks) {
    d.route = route(d.kind, d.count * dataTypeSize(d.dtype), static_cast<int>(ranks));
    return Op{seq, d, op.deadline, op.buffers};
  }

  template <class F>
  void runLocal(const Op& op, OpKind kind, ReduceOp rop, uint64_t count, int root, F&& f) {
    const Op sub = phaseOp(++localSeq_, op, subDesc(op, kind, rop, count, root), routes_.local,
                           localRanks_.size());
    const std::lock_guard<std::mutex> busy(localMu_);
    run(sub, localRanks_, "on this host", f);
  }

  template <class F>
  void runCross(const Op& op, OpKind kind, ReduceOp rop, uint64_t count, int root, F&& f) {
    const Op sub = phaseOp(++crossSeq_, op, subDesc(op, kind, rop, count, root), routes_.cross,
                           crossRanks_.size());
    const std::lock_guard<std::mutex> busy(crossMu_);
    run(sub, crossRanks_, "across hosts", f);
  }

  // Liveness across the phases: while a wait of one part sleeps, the other
  // part answers its peers' probes, so a rank waiting on shared memory still
  // answers a PING from across hosts and the other way round (a waiter that
  // hears no answer blames this rank for the stall). Skipped while the part
  // runs a phase on the phase worker: its own waits answer then.
  static void answerFor(Backend& part, std::mutex& busy) {
    std::unique_lock<std::mutex> lock(busy, std::try_to_lock);
    if (!lock.owns_lock()) return;
    try {
      part.answerProbes();
    } catch (const Error&) {
      // The part's error is sticky: its next phase raises it, named as its own.
    }
  }

  // Runs a phase; its errors name the communicator's ranks, not the group's.
  template <class F>
  void run(const Op& sub, const std::vector<int>& ranks, const char* where, F&& f) {
    try {
      f(sub);
    } catch (const Error& e) {
      throw renumbered(e, ranks,
                       std::string("hierarchical phase ") + toString(sub.desc.kind) + " " + where);
    }
  }

  // `e` of a part as this communicator's error: its peer renumbered, its
  // text prefixed with `what` and the part's ranks (the text numbers from 0).
  Error renumbered(const Error& e, const std::vector<int>& ranks, const std::string& what) const {
    int peer = e.peer();
    std::string members;
    for (size_t i = 0; i < ranks.size(); ++i) {
      members += (i ? "," : "") + std::to_string(ranks[i]);
    }
    if (peer >= 0 && peer < static_cast<int>(ranks.size())) peer = ranks[peer];
    return Error(
        e.code(),
        what + " (group ranks " + members + ", numbered from 0 in what follows): " + e.detail(),
        ErrorContext().withRank(h_.rank).withPeer(peer).withCulprit(e.context().culprit,
                                                                    e.context().reportedSeq));
  }

  static Error reporterRenumbered(const Error& e, const std::vector<int>& ranks) {
    const int peer = e.peer();
    if (peer < 0 || peer >= static_cast<int>(ranks.size())) return e;
    const ErrorContext& c = e.context();
    return Error(e.code(), e.detail(),
                 ErrorContext::forOp(c.op)
                     .withSeq(c.seq)
                     .withRank(c.rank)
                     .withPeer(ranks[peer])
                     .withCulprit(c.culprit, c.reportedSeq));
  }

  Hierarchy h_;
  PhaseRoutes routes_;
  std::unique_ptr<Backend> local_;
  std::unique_ptr<Backend> cross_;
  std::vector<std::vector<int>> hostRanks_;  // ranks of every host
  std::vector<int> localRanks_;
  std::vector<int> crossRanks_;
  std::map<int, int> localIndex_;
  std::map<int, int> crossIndex_;
  uint64_t segmentBytes_;
  uint64_t localSeq_ = 0;
  uint64_t crossSeq_ = 0;  // touched by the phase worker while it runs
  // Held while a phase of the part runs (answerFor skips a busy part).
  std::mutex localMu_;
  std::mutex crossMu_;
  std::vector<char> scratch_;
  // Runs the cross phase of a segment beside the local phases; declared
  // last, so its thread ends before the parts it uses go.
  PhaseWorker crossWorker_;
};

}  // namespace

std::unique_ptr<Backend> createHierarchicalBackend(const Hierarchy& h,
                                                   std::unique_ptr<Backend> local,
                                                   std::unique_ptr<Backend> cross,
                                                   PhaseRoutes routes, uint64_t segmentBytes) {
  return std::make_unique<HierarchicalBackend>(h, std::move(local), std::move(cross),
                                               std::move(routes), segmentBytes);
}

}  // namespace gflow::backend
