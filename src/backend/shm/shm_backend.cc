// The shared-memory backend: collectives among the ranks of one host, each
// rank reading its peers' data straight out of their segments (no messages,
// no per-pair queues). See backend/shm/group.h for the slot and sync rules.
//
// Per chunk of GFLOW_SHM_CHUNK bytes, every rank copies its input into its
// own slot once, then:
//   allreduce, 2 ranks or small: one sync; every rank reduces the whole chunk
//     from all slots in rank order (the same bits everywhere);
//   allreduce, larger groups: two syncs; rank r reduces slice r of the chunk
//     into its own slot (its own data first, then the others in rank order),
//     then everyone copies every slice out. Each slice is reduced once.
//   reduce-scatter: one sync; rank r reduces block r's part from all slots.
//   allgather / broadcast: one sync; everyone copies the slots out.
// Reproducible mode (Algorithm::kFixedOrder) takes the same paths, and
// every reduction there hands the members' data in rank order to
// kernels::OrderedReduction, which reduces it by its fixed tree (the same
// bits as the host backend's fixed order).
// The user's buffers are read once and written once per rank; the slots stay
// in the cache (2 x chunk per rank), which is what the bandwidth bound in
// docs/performance.md assumes.
//
// Allreduces routed to single copy (Algorithm::kSingleCopy: the sizes in
// GFLOW_SHM_SINGLE_COPY's range, where the group can read its members'
// memory, group.h) skip the copy into the slots: rank r
// reduces slice r from every member's input read straight from its buffer
// (through its own slot, a chunk at a time), then reads the other slices
// from their owners' outputs straight into its own (allreduceSingleCopy).
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "backend/shm/shm_backend.h"
#include "kernels/ordered_reduce.h"
#include "kernels/reduce.h"

namespace gflow::backend {
namespace {

using backend::shm::Group;

// At or below this many bytes per rank an allreduce takes the one-sync path
// whatever the group size: it is latency-bound.
constexpr size_t kOneSyncBytes = 32 * 1024;

// One op on the group: brackets its record (failures reported after it ends
// concern the next op) and holds what every algorithm needs.
class OpScope {
 public:
  OpScope(Group& g, const Op& op)
      : es(dataTypeSize(op.desc.dtype)), n(g.size()), r(g.rank()), g_(g) {
    g_.beginOp(op.seq, encode(op.desc), op.deadline);
  }
  ~OpScope() { g_.endOp(); }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

  // True, after the op's one sync (which still compares the op records),
  // when there is nothing to move.
  bool empty(uint64_t count) {
    if (count > 0) return false;
    g_.sync();
    return true;
  }

  const size_t es;  // element size
  const int n;      // members
  const int r;      // this member

 private:
  Group& g_;
};

class ShmBackend final : public Backend {
 public:
  explicit ShmBackend(std::unique_ptr<Group> group) : g_(std::move(group)) {}

  void allreduce(const Op& op, const void* inp, void* outp) override {
    const OpDesc& d = op.desc;
    OpScope scope(*g_, op);
    const auto fn = kernels::reduceFn(d.dtype, d.op);
    const char* in = static_cast<const char*>(inp);
    char* out = static_cast<char*>(outp);
    if (scope.empty(d.count)) return;
    if (d.route.algo == Algorithm::kSingleCopy && g_->singleCopy()) {
      const size_t total = d.count * scope.es;
      g_->publishBuffers(in, total, out, total);
      g_->sync();
      // Buffers that cannot be read by single copy on any member: this op
      // goes through the slots (the outcome is the same on every member).
      if (g_->publishedReadable()) return allreduceSingleCopy(scope, d, fn, in, out);
    }
    reduceThroughSlots(scope, d, fn, in, out, -1);
  }

  void reduce(const Op& op, const void* in, void* out) override {
    const OpDesc& d = op.desc;
    OpScope scope(*g_, op);
    if (scope.empty(d.count)) return;
    reduceThroughSlots(scope, d, kernels::reduceFn(d.dtype, d.op), static_cast<const char*>(in),
                       static_cast<char*>(out), d.root);
  }

  // Per iteration every member puts a column of every block in its slot;
  // member r reduces block r's column from every slot.
  void reduceScatter(const Op& op, const void* inp, void* outp) override {
    const OpDesc& d = op.desc;
    OpScope scope(*g_, op);
    const auto fn = kernels::reduceFn(d.dtype, d.op);
    const char* in = static_cast<const char*>(inp);
    char* out = static_cast<char*>(outp);
    if (scope.empty(d.count)) return;
    eachColumn(scope, d.count, [&](size_t off, size_t bytes) {
      putColumns(scope, in, d.count, off, bytes);
      g_->sync();
      reduceSlots(scope, d, fn, out + off * scope.es, scope.r * bytes, bytes / scope.es);
    });
  }

  void allgather(const Op& op, const void* in, void* out) override {
    OpScope scope(*g_, op);
    if (scope.empty(op.desc.count)) return;
    gatherThroughSlots(scope, op.desc, static_cast<const char*>(in), static_cast<char*>(out), -1);
  }

  void gather(const Op& op, const void* in, void* out) override {
    OpScope scope(*g_, op);
    if (scope.empty(op.desc.count)) return;
    gatherThroughSlots(scope, op.desc, static_cast<const char*>(in), static_cast<char*>(out),
                       op.desc.root);
  }

  // Per iteration the root puts a column of every block in its slot; each
  // member copies its own block's column out.
  void scatter(const Op& op, const void* inp, void* outp) override {
    const OpDesc& d = op.desc;
    OpScope scope(*g_, op);
    if (scope.empty(d.count)) return;
    const char* in = static_cast<const char*>(inp);
    char* out = static_cast<char*>(outp);
    eachColumn(scope, d.count, [&](size_t off, size_t bytes) {
      if (scope.r == d.root) putColumns(scope, in, d.count, off, bytes);
      g_->sync();
      std::memcpy(out + off * scope.es, g_->slot(d.root) + scope.r * bytes, bytes);
      if (scope.r != d.root) g_->countRead(d.root, bytes);
    });
  }

  // Per iteration every member puts a column of every block in its slot;
  // member r copies block r's column out of every slot.
  void alltoall(const Op& op, const void* inp, void* outp) override {
    const OpDesc& d = op.desc;
    OpScope scope(*g_, op);
    if (scope.empty(d.count)) return;
    const char* in = static_cast<const char*>(inp);
    char* out = static_cast<char*>(outp);
    eachColumn(scope, d.count, [&](size_t off, size_t bytes) {
      putColumns(scope, in, d.count, off, bytes);
      g_->sync();
      for (int m = 0; m < scope.n; ++m) {
        std::memcpy(out + (m * d.count + off) * scope.es, g_->slot(m) + scope.r * bytes, bytes);
        if (m != scope.r) g_->countRead(m, bytes);
      }
    });
  }

  void broadcast(const Op& op, void* bufp) override {
    const OpDesc& d = op.desc;
    OpScope scope(*g_, op);
    const size_t es = scope.es;
    const int r = scope.r;
    char* buf = static_cast<char*>(bufp);
    if (scope.empty(d.count)) return;
    const size_t per = g_->slotBytes() / es;
    for (size_t off = 0; off < d.count; off += per) {
      const size_t bytes = std::min(per, d.count - off) * es;
      if (r == d.root) std::memcpy(g_->slot(r), buf + off * es, bytes);
      g_->sync();
      if (r != d.root) {
        std::memcpy(buf + off * es, g_->slot(d.root), bytes);
        g_->countRead(d.root, bytes);
      }
      g_->nextIteration();
    }
  }

  void barrier(const Op& op) override {
    OpScope scope(*g_, op);
    scope.empty(0);
  }

  const char* name() const override { return "shared-memory"; }
  void abort(const Error& error) override { g_->abort(error); }
  void notifyPeers(const Error& error) override { g_->notifyPeers(error); }
  std::vector<Error> awaitReports(Deadline until, int exclude) override {
    return g_->awaitReports(until, exclude);
  }
  bool reject(uint64_t seq, const std::string& why) override {
    g_->reject(seq, why);
    return true;
  }
  PeerStats peerStats(int peer) const override { return g_->peerStats(peer); }
  void answerProbes() override { g_->answerProbes(); }
  void setWhileWaiting(std::function<void()> hook) override {
    g_->setWhileWaiting(std::move(hook));
  }
  // Shared memory copies through its own segments: nothing to register.
  void registerMemory(void*, size_t,
                      std::vector<std::unique_ptr<transport::MemoryRegion>>*) override {}

 private:
  // The slot path of allreduce (dest < 0: every member gets the result) and
  // reduce (only member `dest` writes `out`). Per chunk every member copies
  // its input into its slot; then, for 2 members or a small chunk, one sync
  // and the readers reduce the whole chunk from all slots in rank order;
  // otherwise two syncs: member r reduces slice r into its own slot (its
  // own data first), and the readers copy every slice out.
  void reduceThroughSlots(const OpScope& s, const OpDesc& d, kernels::ReduceFn fn, const char* in,
                          char* out, int dest) {
    const size_t es = s.es;
    const int n = s.n, r = s.r;
    const bool reader = dest < 0 || dest == r;
    const size_t chunkElems = g_->slotBytes() / es;
    const bool oneSync = n == 2 || d.count * es <= kOneSyncBytes;
    for (size_t off = 0; off < d.count; off += chunkElems) {
      const size_t cnt = std::min(chunkElems, d.count - off);
      const size_t bytes = cnt * es;
      std::memcpy(g_->slot(r), in + off * es, bytes);
      g_->sync();
      char* dst = reader ? out + off * es : nullptr;  // `out` is null off a reduce's root
      if (oneSync) {
        if (reader) reduceSlots(s, d, fn, dst, 0, cnt);
      } else {
        const size_t b = cnt * r / n, e = cnt * (r + 1) / n;
        char* mine = g_->slot(r) + b * es;
        if (fixedOrder(d)) {
          reduceSlots(s, d, fn, mine, b * es, e - b);
        } else {
          for (int m = 0; m < n; ++m) {
            if (m == r || e == b) continue;
            fn(mine, mine, g_->slot(m) + b * es, e - b);
            g_->countRead(m, (e - b) * es);
          }
          if (d.op == ReduceOp::kAvg && e > b) kernels::divide(mine, e - b, d.dtype, n);
        }
        g_->sync();
        for (int m = 0; m < n && reader; ++m) {
          const size_t mb = cnt * m / n, me = cnt * (m + 1) / n;
          std::memcpy(dst + mb * es, g_->slot(m) + mb * es, (me - mb) * es);
          if (m != r) g_->countRead(m, (me - mb) * es);
        }
      }
      g_->nextIteration();
    }
  }

  // Reproducible mode: reductions go through kernels::OrderedReduction.
  static bool fixedOrder(const OpDesc& d) { return d.route.algo == Algorithm::kFixedOrder; }

  // dst = the `cnt` elements at byte `at` of every slot, reduced in rank
  // order (divided for kAvg). In reproducible mode dst may be this member's
  // own slot at `at`.
  void reduceSlots(const OpScope& s, const OpDesc& d, kernels::ReduceFn fn, char* dst, size_t at,
                   size_t cnt) {
    if (fixedOrder(d)) {
      const size_t accBytes = kernels::OrderedReduction::blockScratchBytes(d.dtype, s.n, cnt);
      if (acc_.size() < accBytes) acc_.resize(accBytes);
      operands_.resize(s.n);
      for (int m = 0; m < s.n; ++m) operands_[m] = g_->slot(m) + at;
      kernels::OrderedReduction::reduceAll(d.dtype, d.op, operands_, cnt, dst, acc_.data());
    } else if (s.n == 1) {
      std::memcpy(dst, g_->slot(0) + at, cnt * s.es);
    } else {
      fn(dst, g_->slot(0) + at, g_->slot(1) + at, cnt);
      for (int m = 2; m < s.n; ++m) fn(dst, dst, g_->slot(m) + at, cnt);
    }
    if (d.op == ReduceOp::kAvg && !fixedOrder(d)) kernels::divide(dst, cnt, d.dtype, s.n);
    for (int m = 0; m < s.n; ++m) {
      if (m != s.r) g_->countRead(m, cnt * s.es);
    }
  }

  // allgather (dest < 0) and gather (only member `dest` writes `out`): per
  // chunk every member copies its input into its slot; after one sync the
  // readers copy every slot out.
  void gatherThroughSlots(const OpScope& s, const OpDesc& d, const char* in, char* out, int dest) {
    const size_t es = s.es;
    const size_t per = g_->slotBytes() / es;
    for (size_t off = 0; off < d.count; off += per) {
      const size_t bytes = std::min(per, d.count - off) * es;
      std::memcpy(g_->slot(s.r), in + off * es, bytes);
      g_->sync();
      for (int m = 0; m < s.n && (dest < 0 || dest == s.r); ++m) {
        char* dst = out + (m * d.count + off) * es;
        if (m == s.r && dst == in + off * es) continue;  // in is this rank's block of out
        std::memcpy(dst, g_->slot(m), bytes);
        if (m != s.r) g_->countRead(m, bytes);
      }
      g_->nextIteration();
    }
  }

  // Ops on N blocks of `count` elements (reduce-scatter, scatter,
  // all-to-all): each iteration carries a column [off, off + bytes/es) of
  // every block, which fills a slot; `f(off, bytes)` runs it.
  template <typename F>
  void eachColumn(const OpScope& s, uint64_t count, F&& f) {
    const size_t per = std::max<size_t>(1, g_->slotBytes() / s.es / s.n);
    for (size_t off = 0; off < count; off += per) {
      f(off, std::min<size_t>(per, count - off) * s.es);
      g_->nextIteration();
    }
  }
  // This member's slot gets the column [off, off + bytes) of each of `in`'s
  // blocks, block j at j * bytes.
  void putColumns(const OpScope& s, const char* in, uint64_t count, size_t off, size_t bytes) {
    for (int j = 0; j < s.n; ++j) {
      std::memcpy(g_->slot(s.r) + j * bytes, in + (j * count + off) * s.es, bytes);
    }
  }

  // After the sync that published every member's buffers (the caller's),
  // two more: every slice is reduced; every member has read what it needs
  // (so none returns, and reuses its buffers, while another still reads
  // them). In place is safe:
  // before the second sync a member writes only its own slice of its
  // output, which nobody reads then, and reads only other slices of the
  // inputs; after it, it writes only the other slices, whose inputs were
  // read before it. Each slice is reduced once (own input first, then the
  // others in rank order), so every rank gets the same bits.
  void allreduceSingleCopy(const OpScope& s, const OpDesc& d, kernels::ReduceFn fn, const char* in,
                           char* out) {
    const size_t es = s.es;
    const size_t b = d.count * s.r / s.n, e = d.count * (s.r + 1) / s.n;
    const size_t step = g_->slotBytes() / es;
    char* tmp = g_->slot(s.r);  // nobody reads our slots in this op
    for (size_t lo = b; lo < e; lo += step) {
      const size_t cnt = std::min(step, e - lo);
      char* dst = out + lo * es;
      if (fixedOrder(d)) {
        reducePeersInOrder(s, d, in + lo * es, lo * es, dst, cnt);
        continue;
      }
      const char* acc = in + lo * es;
      for (int m = 0; m < s.n; ++m) {
        if (m == s.r) continue;
        g_->readPeer(m, Group::Buffer::kIn, lo * es, tmp, cnt * es);
        fn(dst, acc, tmp, cnt);
        acc = dst;
      }
      if (d.op == ReduceOp::kAvg) kernels::divide(dst, cnt, d.dtype, s.n);
    }
    g_->sync();
    for (int m = 0; m < s.n; ++m) {
      const size_t mb = d.count * m / s.n, me = d.count * (m + 1) / s.n;
      if (m != s.r) g_->readPeer(m, Group::Buffer::kOut, mb * es, out + mb * es, (me - mb) * es);
    }
    g_->sync();
  }

  // Reproducible mode on the single-copy path: dst = the `cnt` elements at
  // byte `at` of every member's input (this member's is `mine`), in rank
  // order. A peer's part is read into one of two buffers in turn: an
  // OrderedReduction reads an operand no later than the next add().
  void reducePeersInOrder(const OpScope& s, const OpDesc& d, const char* mine, size_t at, char* dst,
                          size_t cnt) {
    prepareOrdered(d, s.n, cnt);
    if (second_.size() < cnt * s.es) second_.resize(cnt * s.es);
    char* bufs[2] = {g_->slot(s.r), second_.data()};
    kernels::OrderedReduction red(d.dtype, d.op, s.n, cnt, dst, acc_.data());
    for (int m = 0; m < s.n; ++m) {
      if (m == s.r) {
        red.add(mine);
        continue;
      }
      g_->readPeer(m, Group::Buffer::kIn, at, bufs[m % 2], cnt * s.es);
      red.add(bufs[m % 2]);
    }
  }
  // acc_ for an OrderedReduction of `cnt` elements of `n` members.
  void prepareOrdered(const OpDesc& d, int n, size_t cnt) {
    const size_t accBytes = cnt * kernels::OrderedReduction::accumulatorBytes(d.dtype, n);
    if (acc_.size() < accBytes) acc_.resize(accBytes);
  }

  std::unique_ptr<Group> g_;
  // Reproducible mode's accumulators (OrderedReduction), the slots of a
  // reduceSlots and second peer buffer (reducePeersInOrder).
  std::vector<char> acc_;
  std::vector<const void*> operands_;
  std::vector<char> second_;
};

}  // namespace

std::unique_ptr<Backend> createShmBackend(std::unique_ptr<backend::shm::Group> group) {
  return std::make_unique<ShmBackend>(std::move(group));
}

}  // namespace gflow::backend
