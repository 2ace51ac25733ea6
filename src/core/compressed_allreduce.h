// The one compressed allreduce: float32 data narrowed to a float16/bfloat16
// or quantized (qint8/qint4) wire buffer (with the prescale) just before the
// collective, the collective on the wire type, the reduced wire values
// scanned for inf/NaN and widened back (with the postscale) just after it. Used by
// allreduce(AllreduceOptions) and by the gradient layer's fusion and CSC;
// the element work goes through kernels::GradientKernels, so host and
// device data share it.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "gflow/types.h"
#include "kernels/gradient_kernels.h"

namespace gflow::internal {

// The op and prescale a compressed (float16/bfloat16) allreduce runs with:
// avg becomes sum with the 1/N folded into the prescale, so the wire carries
// the average's magnitude, not N times it (no overflow of an in-range avg).
struct WireOp {
  ReduceOp op;
  float prescale;
};
inline WireOp wireOp(ReduceOp op, float prescale, int size) {
  if (op == ReduceOp::kAvg) return {ReduceOp::kSum, prescale / static_cast<float>(size)};
  return {op, prescale};
}

// How float32 data travels.
struct WireFormat {
  DataType wire = DataType::kFloat32;  // kFloat16 / kBFloat16 / kQInt8 / kQInt4: compressed
  float prescale = 1.0f;
  float postscale = 1.0f;
  bool compressed() const { return wire != DataType::kFloat32; }
  // Bytes of the wire buffer for `count` float32 values.
  size_t wireBytes(size_t count) const { return wireElements(wire, count) * dataTypeSize(wire); }
};

// `count` float32 elements at `data` that travel at element `at` of the
// wire buffer.
// Error feedback (quantized wires): `residual`, `count` floats, is added to
// the prescaled data before quantizing and set to what that lost
// (kernels::narrow); null: none.
struct WireSpan {
  float* data;
  size_t count;
  size_t at;
  float* residual = nullptr;
};

// One compressed allreduce, described by name.
struct CompressedAllreduce {
  // Where the data and the wire live; null: host memory (kernels::hostKernels()).
  std::shared_ptr<kernels::GradientKernels> kernels;
  WireFormat format;  // format.compressed()
  ReduceOp op = ReduceOp::kSum;
  int worldSize = 1;
  void* wire = nullptr;                          // format.wireBytes(count) bytes
  size_t count = 0;                              // float32 values
  std::vector<WireSpan> spans;                   // the float32 data, inside [0, count)
  std::shared_ptr<std::atomic<bool>> nonFinite;  // set on inf/NaN (may be null)
  std::shared_ptr<const void> owner;             // kept alive by the steps
};

// What a caller submits as one fused allreduce: `op` on `buffer` in place,
// with `before` run just before the collective and `after` just after it
// (both on the executing thread).
struct FusedSteps {
  Tensor buffer;
  ReduceOp op = ReduceOp::kSum;
  std::function<void()> before;
  std::function<void()> after;
};
// The steps of `c`: the buffer is the wire, before() narrows, after() scans
// and widens. They share c's kernels, spans and owner. A quantized wire's
// blocks may straddle spans: unless one span covers the whole range, the
// data (and the residuals) pass through float32 scratch of `count` values
// (the kernels' acquire(), held from before() to after()).
FusedSteps compressedSteps(CompressedAllreduce c);

// Where a compressed allreduce of `count` float32 values is cut into
// consecutive pieces of about `pieceBytes` float32 bytes, each its own
// collective, so that one piece's narrowing and widening run beside
// another piece's wire time (the host lane, core/executor.h): the first
// element of every piece, then `count`. Pieces are equal to within a
// quantization block and start on block boundaries (kQuantBlock values);
// one piece when `pieceBytes` is 0 or `count` is under 1.5 pieces. Every
// rank cuts an op alike, since count and pieceBytes agree.
std::vector<size_t> codecPieces(size_t count, uint64_t pieceBytes);

}  // namespace gflow::internal
