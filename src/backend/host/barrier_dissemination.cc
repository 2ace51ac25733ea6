// Dissemination barrier: in round k every rank signals rank+2^k and waits for
// rank-2^k; after ceil(log2 N) rounds every rank has heard from all others.
#include "backend/host/exchange.h"

namespace gflow::backend::host {

void barrierDissemination(Exchange& ex) {
  const int n = ex.size(), r = ex.rank();
  char dummy;
  uint64_t round = 0;
  for (int dist = 1; dist < n; dist <<= 1, ++round) {
    auto rr = ex.recv((r - dist + n) % n, &dummy, 0, round);
    ex.send((r + dist) % n, nullptr, 0, round);
    ex.wait(rr);
  }
  ex.waitSends();
}

}  // namespace gflow::backend::host
