// Pipelined chain reduce for large buffers: root+N-1 -> ... -> root+1 ->
// root, piece by piece. Each rank receives piece k's partial result from
// the rank behind it, reduces it with its own input and forwards it, so
// every link carries the buffer once and the reductions overlap along the
// chain; the root receives the buffer once, where reduce-scatter + gather
// takes 2(N-1)/N of it through the root's link. The root's call returns
// once the last piece is reduced; the others' once their sends are done.
//
// Staging is bounded: `window` pieces in flight per rank, each with a
// receive slot and a partial-result slot, reused in turn.
//
// Determinism: piece k is reduced along the same chain every time (own
// input first, then the partial from behind), so the bits are fixed.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/host/exchange.h"
#include "kernels/reduce.h"

namespace gflow::backend::host {

void reduceChain(Exchange& ex, Scratch& scratch, const void* inp, void* outp) {
  const OpDesc& d = ex.desc();
  const int n = ex.size(), r = ex.rank();
  const size_t es = dataTypeSize(d.dtype);
  const int v = (r - d.root + n) % n;  // 0 is the root, n-1 the chain's head
  const int toward = (r - 1 + n) % n, behind = (r + 1) % n;
  const auto fn = kernels::reduceFn(d.dtype, d.op);
  const char* in = static_cast<const char*>(inp);
  char* out = static_cast<char*>(outp);
  const size_t pieceElems =
      std::max<size_t>({ex.tuning().pieceBytes / es, 1, (d.count + kMaxPieces - 1) / kMaxPieces});
  const size_t np = d.count == 0 ? 1 : (d.count + pieceElems - 1) / pieceElems;
  const size_t W = std::min(np, ex.tuning().window);
  auto len = [&](size_t k) {
    return std::min(pieceElems, d.count - std::min(d.count, k * pieceElems));
  };
  if (n == 1) {
    if (in != out && d.count > 0) std::memcpy(out, in, d.count * es);
    return;
  }
  if (v == n - 1) {  // the head sends its input as it is
    for (size_t k = 0; k < np; ++k) ex.send(toward, in + k * pieceElems * es, len(k) * es, k);
    ex.waitSends();
    return;
  }
  char* mem = scratch.get(std::max<size_t>(2 * W * pieceElems * es, 1));
  auto stage = [&](size_t k) { return mem + (k % W) * pieceElems * es; };
  auto partial = [&](size_t k) { return mem + (W + k % W) * pieceElems * es; };
  std::vector<transport::RequestPtr> recvs(W), sends(W);
  for (size_t k = 0; k < W; ++k) recvs[k] = ex.recv(behind, stage(k), len(k) * es, k);
  for (size_t k = 0; k < np; ++k) {
    const size_t slot = k % W;
    ex.wait(recvs[slot]);
    char* dst = v == 0 ? out + k * pieceElems * es : partial(k);
    if (v != 0 && sends[slot]) ex.wait(sends[slot]);  // piece k-W left this slot
    if (len(k) > 0) fn(dst, in + k * pieceElems * es, stage(k), len(k));
    if (k + W < np) recvs[slot] = ex.recv(behind, stage(k + W), len(k + W) * es, k + W);
    if (v != 0) {
      sends[slot] = ex.send(toward, dst, len(k) * es, k);
    } else if (d.op == ReduceOp::kAvg && len(k) > 0) {
      kernels::divide(dst, len(k), d.dtype, n);
    }
  }
  ex.waitSends();
}

}  // namespace gflow::backend::host
