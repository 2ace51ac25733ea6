// Reproducible mode's allreduce and reduce-scatter over the network
// transport (Algorithm::kFixedOrder): every element is reduced by one fixed
// tree over the ranks (kernels/ordered_reduce.h), whichever rank computes
// it. Which rank that is depends on how the buffer is cut; the arithmetic
// does not. So the bits of the result depend only on the inputs, the op,
// the dtype and N: not on the buckets or fusion that cut a gradient into
// ops, the algorithm the default mode would have chosen, the piece and
// segment sizes, the sockets per peer, or which ranks share a host
// (docs/algorithms.md, "Reproducible mode").
//
// Two algorithms give those bits:
// - Halving-doubling (halving_doubling.cc), whose tree is the fixed tree:
//   the allreduce of a power-of-two world of a type that does not widen
//   (float32, float64, complex). log2(N) pairwise swaps each way, the
//   default mode's choice at medium sizes.
// - Otherwise an owner-computes reduce-scatter, then (allreduce) an
//   allgather of the reduced blocks: block j of the buffer belongs to rank
//   j, every rank sends its block j to rank j, which once all N parts are
//   in reduces them (OrderedReduction::reduceAll, a cache-sized block at a
//   time), and sends the result to every rank.
//   Halving-doubling cannot serve the widening types (float16, bfloat16,
//   float8: its partial sums are rounded to the element type at every
//   level, where the fixed order accumulates in float32; sending them as
//   float32 instead measured slower than this exchange), nor the
//   reduce-scatter, whose blocks are owned in rank order; and on other
//   world sizes its fold sends whole buffers.
// The owner-computes exchange sends and receives (N-1)/N of the buffer per
// phase, as the ring does, in two steps of N-1 concurrent messages
// (staggered by rank, as the pairwise all-to-all) instead of 2(N-1) steps.
// Large buffers go in rounds of at most `segCap` elements per block, so
// staging stays bounded (two rounds of N slots); the next round's messages
// are posted before this round is reduced. Empty parts travel as empty
// messages, so every pair compares the op's description.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/host/exchange.h"
#include "kernels/ordered_reduce.h"

namespace gflow::backend::host {
namespace {

// The blocks of the reduced buffer (block j: rank j's) and their rounds.
struct Cut {
  std::vector<size_t> lo, len;  // per rank, in elements
  size_t segCap = 1;            // elements of a block per round
  size_t rounds = 1;

  // Block j's part in round k.
  size_t segLen(int j, size_t k) const {
    const size_t done = std::min(len[j], k * segCap);
    return std::min(segCap, len[j] - done);
  }
  size_t segAt(int j, size_t k) const { return lo[j] + k * segCap; }
};

Cut makeCut(const std::vector<size_t>& lo, const std::vector<size_t>& len, size_t es,
            const RingTuning& t, int n) {
  Cut c;
  c.lo = lo;
  c.len = len;
  const size_t longest = *std::max_element(len.begin(), len.end());
  // A round stages N parts of segCap: about the ring's 2 x piece x window
  // in all whatever N (at least 4 KiB a part), and no more than the op.
  const size_t capBytes = std::max<size_t>(t.pieceBytes * t.window / n, 4096);
  c.segCap = std::max<size_t>(1, std::min(capBytes / es, longest));
  // Round numbers fit the message index's 24 bits.
  c.segCap = std::max(c.segCap, (longest + (size_t(1) << 23) - 1) >> 23);
  c.rounds = longest == 0 ? 1 : (longest + c.segCap - 1) / c.segCap;
  return c;
}

class FixedOrder {
 public:
  // `in`: every block; `result`: where this rank's reduced block goes;
  // `out` (allreduce; null for reduce-scatter): the whole result, whose
  // block j arrives from rank j.
  FixedOrder(Exchange& ex, Scratch& scratch, const Cut& cut, const void* in, char* result,
             char* out)
      : ex_(ex),
        n_(ex.size()),
        me_(ex.rank()),
        c_(cut),
        dtype_(ex.desc().dtype),
        op_(ex.desc().op),
        es_(dataTypeSize(dtype_)),
        in_(static_cast<const char*>(in)),
        result_(result),
        out_(out) {
    // Two rounds of n slots (this rank's own unused) and the accumulators;
    // each 64-byte aligned.
    const size_t stage = align(n_ * c_.segCap * es_),
                 acc = align(kernels::OrderedReduction::blockScratchBytes(dtype_, n_, c_.segCap));
    char* s = scratch.get(2 * stage + acc + 64);
    s += (64 - reinterpret_cast<uintptr_t>(s) % 64) % 64;
    for (int b = 0; b < 2; ++b) {
      stage_[b] = s + b * stage;
      rsRecv_[b].resize(n_);
      rsSend_[b].resize(n_);
    }
    operands_.resize(n_);
    acc_ = s + 2 * stage;
  }

  void run() {
    ex_.receivesPostedFirst();
    post(0);
    for (size_t k = 0; k < c_.rounds; ++k) {
      if (k + 1 < c_.rounds) post(k + 1);
      reduce(k);
      if (out_) allgather(k);
    }
    for (auto& r : agRecv_) ex_.wait(r);
    ex_.waitSends();
  }

 private:
  static size_t align(size_t bytes) { return (bytes + 63) / 64 * 64; }
  char* slot(size_t k, int from) const { return stage_[k % 2] + from * c_.segCap * es_; }

  // Round k's reduce-scatter: receives for this rank's block, then this
  // rank's part of every other block to its owner. Empty parts travel too
  // (0 bytes), so every pair compares the op's description.
  void post(size_t k) {
    const size_t mine = c_.segLen(me_, k) * es_;
    for (int s = 1; s < n_; ++s) {
      const int from = (me_ - s + n_) % n_;
      rsRecv_[k % 2][from] = ex_.recv(from, slot(k, from), mine, messageIndex(k, 0, 0));
    }
    for (int s = 1; s < n_; ++s) {
      const int to = (me_ + s) % n_;
      rsSend_[k % 2][to] =
          ex_.send(to, in_ + c_.segAt(to, k) * es_, c_.segLen(to, k) * es_, messageIndex(k, 0, 0));
    }
  }

  // This rank's block of round k, once all its parts are in, reduced in
  // the fixed order into result_ (which may be this rank's own input: in
  // place).
  void reduce(size_t k) {
    for (int r = 0; r < n_; ++r) {
      operands_[r] = r == me_ ? in_ + c_.segAt(me_, k) * es_ : slot(k, r);
      if (r != me_) ex_.wait(rsRecv_[k % 2][r]);
    }
    kernels::OrderedReduction::reduceAll(dtype_, op_, operands_, c_.segLen(me_, k),
                                         result_ + k * c_.segCap * es_, acc_);
  }

  // Round k's allgather: every other block's part straight into out_, once
  // this rank's own part of that block has left (in place, in_ is out_).
  void allgather(size_t k) {
    for (int s = 1; s < n_; ++s) {
      const int from = (me_ - s + n_) % n_;
      ex_.wait(rsSend_[k % 2][from]);
      agRecv_.push_back(ex_.recv(from, out_ + c_.segAt(from, k) * es_, c_.segLen(from, k) * es_,
                                 messageIndex(k, 1, 0)));
    }
    const size_t mine = c_.segLen(me_, k) * es_;
    for (int s = 1; s < n_; ++s) {
      ex_.send((me_ + s) % n_, out_ + c_.segAt(me_, k) * es_, mine, messageIndex(k, 1, 0));
    }
  }

  Exchange& ex_;
  const int n_, me_;
  const Cut& c_;
  const DataType dtype_;
  const ReduceOp op_;
  const size_t es_;
  const char* in_;
  char* result_;
  char* out_;
  char* stage_[2];
  char* acc_;
  std::vector<transport::RequestPtr> rsRecv_[2], rsSend_[2], agRecv_;
  std::vector<const void*> operands_;  // a round's parts, in rank order
};

}  // namespace

void allreduceFixedOrder(Exchange& ex, Scratch& scratch, const void* in, void* out) {
  const int n = ex.size();
  if ((n & (n - 1)) == 0 && !kernels::OrderedReduction::widens(ex.desc().dtype)) {
    allreduceHalvingDoubling(ex, scratch, in, out);
    return;
  }
  const size_t count = ex.desc().count, es = dataTypeSize(ex.desc().dtype);
  std::vector<size_t> lo(n), len(n);
  for (int j = 0; j < n; ++j) {
    len[j] = count / n + (static_cast<size_t>(j) < count % n ? 1 : 0);
    lo[j] = j == 0 ? 0 : lo[j - 1] + len[j - 1];
  }
  const Cut cut = makeCut(lo, len, es, ex.tuning(), n);
  char* o = static_cast<char*>(out);
  FixedOrder(ex, scratch, cut, in, o + lo[ex.rank()] * es, o).run();
}

void reduceScatterFixedOrder(Exchange& ex, Scratch& scratch, const void* in, void* out) {
  const int n = ex.size();
  const size_t count = ex.desc().count, es = dataTypeSize(ex.desc().dtype);
  std::vector<size_t> lo(n), len(n, count);
  for (int j = 0; j < n; ++j) lo[j] = j * count;
  const Cut cut = makeCut(lo, len, es, ex.tuning(), n);
  FixedOrder(ex, scratch, cut, in, static_cast<char*>(out), nullptr).run();
}

}  // namespace gflow::backend::host
