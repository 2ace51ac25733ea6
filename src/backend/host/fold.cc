#include "backend/host/fold.h"

namespace gflow::backend::host {

Fold::Fold(int n, int r) : r_(r) {
  while (p * 2 <= n) {
    p *= 2;
    ++log2p;
  }
  rem = n - p;
  vrank = r - rem;
  if (r < 2 * rem) vrank = r % 2 == 0 ? -1 : r / 2;
}

const char* Fold::foldIn(Exchange& ex, kernels::ReduceFn fn, const char* in, char* out,
                         char* tmp) const {
  if (r_ >= 2 * rem) return in;
  const OpDesc& d = ex.desc();
  const size_t bytes = d.count * dataTypeSize(d.dtype);
  if (r_ % 2 == 0) {
    ex.send(r_ + 1, in, bytes, 0);
    return nullptr;
  }
  ex.wait(ex.recv(r_ - 1, tmp, bytes, 0));
  if (d.count > 0) fn(out, tmp, in, d.count);
  return out;
}

void Fold::foldOut(Exchange& ex, char* out, uint64_t index) const {
  if (r_ >= 2 * rem) return;
  const OpDesc& d = ex.desc();
  const size_t bytes = d.count * dataTypeSize(d.dtype);
  if (r_ % 2 == 1) {
    ex.send(r_ - 1, out, bytes, index);
  } else {
    ex.waitSends();  // `in` may be `out`, which the result overwrites
    ex.wait(ex.recv(r_ + 1, out, bytes, index));
  }
}

}  // namespace gflow::backend::host
