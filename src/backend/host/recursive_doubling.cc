// Recursive doubling allreduce for small and medium messages: log2(N)
// exchanges of the whole buffer instead of the ring's 2(N-1) steps. For N
// not a power of two, the first 2*rem ranks pair up (even folds into odd)
// before and get the result back after.
//
// The first reduction reads `in` and the peer's data and writes `out` (no
// copy of the input first). Each exchange is one message: cut into pieces
// so that reduction overlaps the transfer, it measured slower over TCP
// (docs/performance.md).
//
// Determinism: at each step both partners compute lower-rank-data op
// higher-rank-data with the same operands, so all ranks end bitwise equal.
#include <algorithm>
#include <cstring>

#include "backend/host/exchange.h"
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
    const int n = ex_.size(), r = ex_.rank();
    int p = 1, log2p = 0;
    while (p * 2 <= n) {
      p *= 2;
      ++log2p;
    }
    const int rem = n - p;
    // Fold: ranks [0, 2*rem): even r hands its data to r+1 and waits.
    int vrank = r - rem;  // rank within the power-of-two group, -1 if folded away
    if (r < 2 * rem) {
      vrank = r % 2 == 0 ? -1 : r / 2;
      if (r % 2 == 0) {
        ex_.send(r + 1, cur_, bytes(), 0);
      } else {
        reduceFrom(r - 1, /*peerFirst=*/true, 0, /*exchange=*/false);
      }
    }
    auto realRank = [&](int v) { return v < rem ? 2 * v + 1 : v + rem; };
    uint64_t step = 1;
    if (vrank >= 0) {
      for (int mask = 1; mask < p; mask <<= 1, ++step) {
        const int vpeer = vrank ^ mask;
        reduceFrom(realRank(vpeer), vpeer < vrank, step, /*exchange=*/true);
      }
      if (cur_ != out_ && d_.count > 0) std::memcpy(out_, cur_, d_.count * es_);  // n == 1
      // Divide once, before anything is sent from `out` to a folded rank.
      if (d_.op == ReduceOp::kAvg && d_.count > 0) {
        kernels::divide(out_, d_.count, d_.dtype, n);
      }
    }
    step = 1 + static_cast<uint64_t>(log2p);
    if (r < 2 * rem) {
      if (r % 2 == 1) {
        ex_.send(r - 1, out_, bytes(), step);
      } else {
        ex_.waitSends();  // `in` may be `out`, which the result overwrites
        ex_.wait(ex_.recv(r + 1, out_, bytes(), step));
      }
    }
    ex_.waitSends();
  }

 private:
  size_t bytes() const { return d_.count * es_; }

  // One step with `peer`: its data arrives in scratch and is reduced into
  // `out` with the current data (the lower rank's operand first). With
  // `exchange`, this rank's current data goes to the peer at the same time;
  // `out` is overwritten only once that send is done.
  void reduceFrom(int peer, bool peerFirst, uint64_t step, bool exchange) {
    transport::RequestPtr recv = ex_.recv(peer, tmp_, bytes(), step);
    if (exchange) ex_.send(peer, cur_, bytes(), step);
    ex_.wait(recv);
    if (exchange && cur_ == out_) ex_.waitSends();
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
