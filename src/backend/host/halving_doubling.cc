// Halving-doubling allreduce (Rabenseifner's): a reduce-scatter by recursive
// halving, then an allgather by recursive doubling, over p = 2^k ranks (other
// world sizes fold first, fold.h). Each rank moves the ring's 2(p-1)/p of
// the buffer, but in 2 log2(p) pairwise exchanges instead of 2(p-1) steps
// around the ring: fewer latencies for medium buffers, and each step is a
// swap between two ranks, which needs only those two to run (on a host with
// more ranks than cores, a ring step waits for a neighbour that may not be
// scheduled).
//
// Reduce-scatter step s (mask 1, 2, 4, ...): partners vrank and vrank^mask
// split their current range in two; the lower keeps the lower half, sends
// the other half and reduces what it receives into its half of `out`. After
// log2(p) steps every rank owns a fully reduced block, which the allgather
// sends back up the same tree, received straight into `out`.
//
// Determinism: every element is reduced by one fixed tree (the lower rank's
// operand first at each level) on the one rank that owns it, then copied, so
// all ranks end bitwise equal. That tree does not depend on the count or
// the owner, so it is reproducible mode's fixed order (fixed_order.cc).
#include <algorithm>

#include "backend/host/exchange.h"
#include "backend/host/fold.h"
#include "kernels/reduce.h"

namespace gflow::backend::host {
namespace {

class HalvingDoubling {
 public:
  HalvingDoubling(Exchange& ex, Scratch& scratch, const void* in, void* out)
      : ex_(ex),
        d_(ex.desc()),
        es_(dataTypeSize(d_.dtype)),
        fn_(kernels::reduceFn(d_.dtype, d_.op)),
        fold_(ex.size(), ex.rank()),
        in_(static_cast<const char*>(in)),
        out_(static_cast<char*>(out)),
        // The fold receives a whole buffer; the halving at most half of one.
        tmp_(
            scratch.get(std::max<size_t>((fold_.rem > 0 ? d_.count : d_.count / 2 + 1) * es_, 1))) {
  }

  void run() {
    const char* cur = fold_.foldIn(ex_, fn_, in_, out_, tmp_);
    if (fold_.vrank >= 0) {
      reduceScatter(cur);
      if (d_.op == ReduceOp::kAvg && hi_ > lo_) {
        kernels::divide(out_ + lo_ * es_, hi_ - lo_, d_.dtype, ex_.size());
      }
      // The halving sent from `out`, where the allgather now receives.
      ex_.waitSends();
      allgather();
    }
    fold_.foldOut(ex_, out_, messageIndex(0, 1 + 2 * static_cast<uint64_t>(fold_.log2p), 0));
    ex_.waitSends();
  }

 private:
  // One level of the tree: the range [lo, hi) both partners held, cut at mid.
  struct Split {
    size_t lo, mid, hi;
  };
  // One halving step's two halves of a level: the one kept and the one sent.
  struct Halves {
    size_t keepLo, keepN;
    size_t sendLo, sendN;
  };

  void reduceScatter(const char* cur) {
    lo_ = 0;
    hi_ = d_.count;
    uint64_t step = 1;
    for (int mask = 1; mask < fold_.p; mask <<= 1, ++step) {
      const int peer = fold_.real(fold_.vrank ^ mask);
      const bool lower = (fold_.vrank & mask) == 0;
      const Split s{lo_, lo_ + (hi_ - lo_) / 2, hi_};
      splits_[levels_++] = s;
      const size_t keepLo = lower ? s.lo : s.mid, keepHi = lower ? s.mid : s.hi;
      const size_t sendLo = lower ? s.mid : s.lo, sendHi = lower ? s.hi : s.mid;
      exchangeAndReduce(peer, lower, step, cur,
                        Halves{keepLo, keepHi - keepLo, sendLo, sendHi - sendLo});
      cur = out_;  // only [keepLo, keepHi) of it is read from here on
      lo_ = keepLo;
      hi_ = keepHi;
    }
    if (fold_.p == 1 && cur != out_ && d_.count > 0) {
      std::copy(cur, cur + d_.count * es_, out_);  // a world of one
    }
  }

  // One halving step: this rank's n-element half arrives from the partner
  // and is reduced into `out` while the other half goes to it. One message
  // each way: cut into pieces so that reducing overlaps receiving, it
  // measured no faster on loopback.
  void exchangeAndReduce(int peer, bool lower, uint64_t step, const char* cur, const Halves& h) {
    const size_t keepLo = h.keepLo, n = h.keepN;
    const uint64_t index = messageIndex(0, step, 0);
    transport::RequestPtr recv = ex_.recv(peer, tmp_, n * es_, index);
    ex_.send(peer, cur + h.sendLo * es_, h.sendN * es_, index);
    ex_.wait(recv);
    if (n == 0) return;
    char* dst = out_ + keepLo * es_;
    const char* mine = cur + keepLo * es_;
    if (lower) {
      fn_(dst, mine, tmp_, n);
    } else {
      fn_(dst, tmp_, mine, n);
    }
  }

  // The halving's levels in reverse: this rank's block goes to the partner
  // and the partner's half of the level arrives in place.
  void allgather() {
    uint64_t step = 1 + static_cast<uint64_t>(fold_.log2p);
    for (int level = levels_ - 1; level >= 0; --level, ++step) {
      const Split& s = splits_[level];
      const int mask = 1 << level;
      const int peer = fold_.real(fold_.vrank ^ mask);
      const bool lower = (fold_.vrank & mask) == 0;
      const size_t recvLo = lower ? s.mid : s.lo, recvHi = lower ? s.hi : s.mid;
      transport::RequestPtr recv =
          ex_.recv(peer, out_ + recvLo * es_, (recvHi - recvLo) * es_, messageIndex(0, step, 0));
      ex_.send(peer, out_ + lo_ * es_, (hi_ - lo_) * es_, messageIndex(0, step, 0));
      ex_.wait(recv);
      lo_ = s.lo;
      hi_ = s.hi;
    }
  }

  Exchange& ex_;
  const OpDesc& d_;
  const size_t es_;
  const kernels::ReduceFn fn_;
  const Fold fold_;
  const char* const in_;
  char* const out_;
  char* const tmp_;
  size_t lo_ = 0, hi_ = 0;  // the block this rank holds
  Split splits_[31];        // the halving's levels (log2 of an int world size)
  int levels_ = 0;
};

}  // namespace

void allreduceHalvingDoubling(Exchange& ex, Scratch& scratch, const void* in, void* out) {
  HalvingDoubling(ex, scratch, in, out).run();
}

}  // namespace gflow::backend::host
