// Recursive doubling allreduce for small and medium messages: log2(N)
// exchanges of the whole buffer instead of the ring's 2(N-1) steps. For N
// not a power of two, the first 2*rem ranks pair up (fold.h).
//
// The first reduction reads `in` and the peer's data and writes `out` (no
// copy of the input first). Each exchange is one message: cut into pieces
// so that reduction overlaps the transfer, it measured slower over TCP.
//
// Determinism: at each step both partners compute lower-rank-data op
// higher-rank-data with the same operands, so all ranks end bitwise equal.
#include <algorithm>
#include <cstring>

#include "backend/host/exchange.h"
#include "backend/host/fold.h"
#include "kernels/reduce.h"

namespace gflow::backend::host {
namespace {

class RecursiveDoubling {
 public:
  RecursiveDoubling(Exchange& ex, Scratch& scratch, const void* in, void* out)
      : ex_(ex),
        d_(ex.desc()),
        es_(dataTypeSize(d_.dtype)),
        fn_(kernels::reduceFn(d_.dtype, d_.op)),
        cur_(static_cast<const char*>(in)),
        out_(static_cast<char*>(out)),
        tmp_(scratch.get(std::max<size_t>(d_.count * es_, 1))) {}

  void run() {
    const Fold fold(ex_.size(), ex_.rank());
    cur_ = fold.foldIn(ex_, fn_, cur_, out_, tmp_);
    if (fold.vrank >= 0) {
      uint64_t step = 1;
      for (int mask = 1; mask < fold.p; mask <<= 1, ++step) {
        const int vpeer = fold.vrank ^ mask;
        reduceFrom(fold.real(vpeer), vpeer < fold.vrank, step);
      }
      if (cur_ != out_ && d_.count > 0) std::memcpy(out_, cur_, d_.count * es_);  // n == 1
      // Divide once, before anything is sent from `out` to a folded rank.
      if (d_.op == ReduceOp::kAvg && d_.count > 0) {
        kernels::divide(out_, d_.count, d_.dtype, ex_.size());
      }
    }
    fold.foldOut(ex_, out_, 1 + static_cast<uint64_t>(fold.log2p));
    ex_.waitSends();
  }

 private:
  size_t bytes() const { return d_.count * es_; }

  // One exchange with `peer`: its data arrives in scratch and is reduced
  // into `out` with the current data (the lower rank's operand first), while
  // this rank's current data goes to the peer; `out` is overwritten only once
  // that send is done.
  void reduceFrom(int peer, bool peerFirst, uint64_t step) {
    transport::RequestPtr recv = ex_.recv(peer, tmp_, bytes(), step);
    ex_.send(peer, cur_, bytes(), step);
    ex_.wait(recv);
    if (cur_ == out_) ex_.waitSends();
    if (d_.count > 0) {
      if (peerFirst) {
        fn_(out_, tmp_, cur_, d_.count);
      } else {
        fn_(out_, cur_, tmp_, d_.count);
      }
    }
    cur_ = out_;
  }

  Exchange& ex_;
  const OpDesc& d_;
  const size_t es_;
  const kernels::ReduceFn fn_;
  const char* cur_;  // the data so far: `in` until the first reduction
  char* const out_;
  char* const tmp_;
};

}  // namespace

void allreduceRecursiveDoubling(Exchange& ex, Scratch& scratch, const void* in, void* out) {
  RecursiveDoubling(ex, scratch, in, out).run();
}

}  // namespace gflow::backend::host
