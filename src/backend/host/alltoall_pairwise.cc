// Pairwise all-to-all, for equal blocks and uneven ones (alltoallv,
// allgatherv): every receive is posted first, straight into its block of
// `out` (nothing arrives unexpected, nothing is staged), then at step
// s = 1..N-1 this rank sends its block for rank r+s. The stagger means that
// at each step every rank sends to a different peer and receives from a
// different one, so no rank's link is the target of several senders at once
// while others idle. A block whose size differs from what its receiver
// expects is a mismatch there (the transport compares sizes).
#include <cstring>
#include <vector>

#include "backend/host/exchange.h"

namespace gflow::backend::host {

void alltoallPairwise(Exchange& ex, const void* in, void* out) {
  const Blocks b = Blocks::equal(ex.size(), ex.desc().count);
  alltoallvPairwise(ex, in, b, out, b);
}

void alltoallvPairwise(Exchange& ex, const void* inp, const Blocks& inBlocks, void* outp,
                       const Blocks& outBlocks) {
  const int n = ex.size(), r = ex.rank();
  const size_t es = dataTypeSize(ex.desc().dtype);
  const char* in = static_cast<const char*>(inp);
  char* out = static_cast<char*>(outp);
  std::vector<transport::RequestPtr> reqs;
  ex.receivesPostedFirst();
  for (int s = 1; s < n; ++s) {
    const int from = (r - s + n) % n;
    reqs.push_back(
        ex.recv(from, out + outBlocks.offsets[from] * es, outBlocks.counts[from] * es, 0));
  }
  for (int s = 1; s < n; ++s) {
    const int to = (r + s) % n;
    ex.send(to, in + inBlocks.offsets[to] * es, inBlocks.counts[to] * es, 0);
  }
  const size_t own = inBlocks.counts[r] * es;  // == outBlocks.counts[r] (checked by core)
  char* dst = out + outBlocks.offsets[r] * es;
  const char* src = in + inBlocks.offsets[r] * es;
  if (own > 0 && dst != src) std::memmove(dst, src, own);
  for (auto& q : reqs) ex.wait(q);
  ex.waitSends();
}

}  // namespace gflow::backend::host
