// Worlds whose size is not a power of two, for the log-step allreduces
// (recursive doubling, halving-doubling): the first 2*rem ranks pair up,
// the even rank of each pair hands its whole input to the odd one before the
// algorithm (message index 0) and gets the result back after it, so the
// algorithm itself runs on p = 2^floor(log2 N) ranks.
#pragma once

#include "backend/host/exchange.h"
#include "kernels/reduce.h"

namespace gflow::backend::host {

struct Fold {
  Fold(int n, int r);

  int p = 1, log2p = 0, rem = 0;
  int vrank;  // this rank among the p that run the algorithm; -1: folded away

  // The real rank of virtual rank v.
  int real(int v) const { return v < rem ? 2 * v + 1 : v + rem; }

  // Before the algorithm: the even rank of a pair sends `in` to its partner
  // and returns nullptr; the odd one reduces the partner's data (first
  // operand) with `in` into `out` through `tmp` (the whole buffer) and
  // returns `out`; every other rank returns `in`.
  const char* foldIn(Exchange& ex, kernels::ReduceFn fn, const char* in, char* out,
                     char* tmp) const;

  // After it: the odd rank of a pair sends `out` to its partner, which
  // receives it into `out` (message index `index`).
  void foldOut(Exchange& ex, char* out, uint64_t index) const;

 private:
  int r_;
};

}  // namespace gflow::backend::host
