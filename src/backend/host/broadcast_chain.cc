// Pipelined chain broadcast: root -> root+1 -> ... -> root-1, piece by piece,
// so every link carries the whole buffer once and pieces overlap along the
// chain. The last rank acknowledges to the root, so the root's call (like
// everyone's) returns only once the data has arrived everywhere, and a
// mismatch is seen by every rank, root included.
#include <algorithm>

#include "backend/host/exchange.h"

namespace gflow::backend::host {

void broadcastChain(Exchange& ex, void* bufp) {
  const OpDesc& d = ex.desc();
  const int n = ex.size(), r = ex.rank();
  if (n == 1) return;
  char* buf = static_cast<char*>(bufp);
  const size_t bytes = d.count * dataTypeSize(d.dtype);
  const int v = (r - d.root + n) % n;  // position along the chain
  const int next = (r + 1) % n, prev = (r - 1 + n) % n;
  const size_t piece =
      std::max<size_t>(ex.tuning().pieceBytes, (bytes + (size_t(1) << 20) - 1) >> 20);
  const size_t np = bytes == 0 ? 1 : (bytes + piece - 1) / piece;
  auto len = [&](size_t k) { return std::min(piece, bytes - std::min(bytes, k * piece)); };
  const uint64_t kAck = uint64_t(1) << 62;

  if (v == 0) {
    for (size_t k = 0; k < np; ++k) ex.send(next, buf + k * piece, len(k), k);
    char dummy;
    ex.wait(ex.recv(prev, &dummy, 0, kAck));
  } else {
    std::vector<transport::RequestPtr> reqs;
    reqs.reserve(np);
    for (size_t k = 0; k < np; ++k) reqs.push_back(ex.recv(prev, buf + k * piece, len(k), k));
    for (size_t k = 0; k < np; ++k) {
      ex.wait(reqs[k]);
      if (v < n - 1) ex.send(next, buf + k * piece, len(k), k);
    }
    if (v == n - 1) ex.send(next, nullptr, 0, kAck);
  }
  ex.waitSends();
}

}  // namespace gflow::backend::host
