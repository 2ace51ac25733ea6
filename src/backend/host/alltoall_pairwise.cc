// Pairwise all-to-all: every receive is posted first, straight into its
// block of `out` (nothing arrives unexpected, nothing is staged), then at
// step s = 1..N-1 this rank sends block r+s to rank r+s. The stagger means
// that at each step every rank sends to a different peer and receives from
// a different one, so no rank's link is the target of several senders at
// once while others idle.
#include <cstring>
#include <vector>

#include "backend/host/exchange.h"

namespace gflow::backend::host {

void alltoallPairwise(Exchange& ex, const void* inp, void* outp) {
  const OpDesc& d = ex.desc();
  const int n = ex.size(), r = ex.rank();
  const size_t block = d.count * dataTypeSize(d.dtype);
  const char* in = static_cast<const char*>(inp);
  char* out = static_cast<char*>(outp);
  std::vector<transport::RequestPtr> reqs;
  for (int s = 1; s < n; ++s) {
    const int from = (r - s + n) % n;
    reqs.push_back(ex.recv(from, out + static_cast<size_t>(from) * block, block, 0));
  }
  for (int s = 1; s < n; ++s) {
    const int to = (r + s) % n;
    ex.send(to, in + static_cast<size_t>(to) * block, block, 0);
  }
  if (block > 0)
    std::memcpy(out + static_cast<size_t>(r) * block, in + static_cast<size_t>(r) * block, block);
  for (auto& q : reqs) ex.wait(q);
  ex.waitSends();
}

}  // namespace gflow::backend::host
