// Recursive doubling allreduce for small messages: log2(N) exchanges of the
// whole buffer instead of the ring's 2(N-1) steps. For N not a power of two,
// the first 2*rem ranks pair up (even folds into odd) before and get the
// result back after.
//
// Determinism: at each step both partners compute lower-rank-data op
// higher-rank-data with the same operands, so all ranks end bitwise equal.
#include <cstring>

#include "backend/host/exchange.h"
#include "kernels/reduce.h"

namespace gflow::backend::host {

void allreduceRecursiveDoubling(Exchange& ex, Scratch& scratch, const void* in, void* outp) {
  const OpDesc& d = ex.desc();
  const int n = ex.size(), r = ex.rank();
  const size_t bytes = d.count * dataTypeSize(d.dtype);
  const auto fn = kernels::reduceFn(d.dtype, d.op);
  char* out = static_cast<char*>(outp);
  if (in != out && bytes > 0) std::memcpy(out, in, bytes);
  char* tmp = scratch.get(bytes > 0 ? bytes : 1);

  int p = 1, log2p = 0;
  while (p * 2 <= n) {
    p *= 2;
    ++log2p;
  }
  const int rem = n - p;
  uint64_t step = 0;

  // Fold: ranks [0, 2*rem): even r sends to r+1 and waits for the result.
  int vrank;  // rank within the power-of-two group, -1 if folded away
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      ex.send(r + 1, out, bytes, step);
      vrank = -1;
    } else {
      ex.wait(ex.recv(r - 1, tmp, bytes, step));
      if (d.count > 0) fn(out, tmp, out, d.count);  // lower rank's data first
      vrank = r / 2;
    }
  } else {
    vrank = r - rem;
  }
  ++step;
  auto realRank = [&](int v) { return v < rem ? 2 * v + 1 : v + rem; };

  if (vrank >= 0) {
    for (int mask = 1; mask < p; mask <<= 1, ++step) {
      const int vpeer = vrank ^ mask;
      const int peer = realRank(vpeer);
      auto rr = ex.recv(peer, tmp, bytes, step);
      ex.send(peer, out, bytes, step);
      ex.wait(rr);
      ex.waitSends();  // `out` is overwritten next
      if (d.count > 0) {
        if (vpeer < vrank) {
          fn(out, tmp, out, d.count);
        } else {
          fn(out, out, tmp, d.count);
        }
      }
    }
  }
  step = 1 + static_cast<uint64_t>(log2p);

  // The ranks of the power-of-two group hold the full result: divide once
  // there (before anything is sent from `out`), then return it to the folded
  // ranks.
  if (vrank >= 0 && d.op == ReduceOp::kAvg && d.count > 0) {
    kernels::divide(out, d.count, d.dtype, n);
  }
  if (r < 2 * rem) {
    if (r % 2 == 1) {
      ex.send(r - 1, out, bytes, step);
    } else {
      ex.waitSends();
      ex.wait(ex.recv(r + 1, out, bytes, step));
    }
  }
  ex.waitSends();
}

}  // namespace gflow::backend::host
