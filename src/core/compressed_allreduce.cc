#include "core/compressed_allreduce.h"

#include <algorithm>

#include "kernels/host_kernels.h"

namespace gflow::internal {

namespace {

// Whether the float32 data must be gathered into contiguous scratch before
// narrowing (and scattered after widening): a quantized wire's blocks may
// cross span boundaries, so it narrows the whole range at once.
bool stages(const CompressedAllreduce& c) {
  if (!isQuantized(c.format.wire)) return false;
  return !(c.spans.size() == 1 && c.spans[0].at == 0 && c.spans[0].count == c.count);
}

// The steps' shared state: the description and (staged) the scratch.
struct Compressed {
  CompressedAllreduce c;
  void* staging = nullptr;
  ~Compressed() {
    if (staging) c.kernels->release(staging);
  }
};

bool anyResidual(const CompressedAllreduce& c) {
  for (const WireSpan& w : c.spans) {
    if (w.residual) return true;
  }
  return false;
}

using Copies = std::vector<kernels::GradientKernels::Copy>;

void narrowAll(Compressed& d, float prescale) {
  const CompressedAllreduce& c = d.c;
  if (!stages(c)) {
    const size_t es = dataTypeSize(c.format.wire);
    for (const WireSpan& w : c.spans) {
      c.kernels->narrow(static_cast<char*>(c.wire) + w.at * es, w.data, w.count, c.format.wire,
                        prescale, w.residual);
    }
    return;
  }
  // Staged: the data at [0, count), the residuals (if any) at [count, 2 count).
  const bool feedback = anyResidual(c);
  const size_t bytes = c.count * sizeof(float);
  if (!d.staging) d.staging = c.kernels->acquire(feedback ? 2 * bytes : bytes);
  auto* staged = static_cast<float*>(d.staging);
  float* residual = feedback ? staged + c.count : nullptr;
  Copies in, out;
  for (const WireSpan& w : c.spans) {
    in.push_back({w.data, staged + w.at, w.count * sizeof(float)});
    if (!feedback) continue;
    if (w.residual) {
      in.push_back({w.residual, residual + w.at, w.count * sizeof(float)});
      out.push_back({residual + w.at, w.residual, w.count * sizeof(float)});
    } else {
      c.kernels->zero(residual + w.at, w.count * sizeof(float));
    }
  }
  c.kernels->copy(in);
  c.kernels->narrow(c.wire, staged, c.count, c.format.wire, prescale, residual);
  if (feedback) c.kernels->copy(out);
}

void widenAll(Compressed& d) {
  const CompressedAllreduce& c = d.c;
  const float post = c.format.postscale;
  if (!stages(c)) {
    const size_t es = dataTypeSize(c.format.wire);
    for (const WireSpan& w : c.spans) {
      c.kernels->widen(w.data, static_cast<const char*>(c.wire) + w.at * es, w.count, c.format.wire,
                       post);
    }
    return;
  }
  auto* staged = static_cast<float*>(d.staging);
  c.kernels->widen(staged, c.wire, c.count, c.format.wire, post);
  Copies copies;
  for (const WireSpan& w : c.spans)
    copies.push_back({staged + w.at, w.data, w.count * sizeof(float)});
  c.kernels->copy(copies);
}

}  // namespace

FusedSteps compressedSteps(CompressedAllreduce c) {
  // avg sums on the wire first and divides last, so a float16 sum of N
  // in-range values could overflow: the division moves into the prescale.
  if (!c.kernels) c.kernels = kernels::hostKernels();
  const WireOp wo = wireOp(c.op, c.format.prescale, c.worldSize);
  auto d = std::make_shared<Compressed>();
  d->c = std::move(c);
  const CompressedAllreduce& cc = d->c;
  FusedSteps s;
  s.buffer = Tensor(cc.wire, wireElements(cc.format.wire, cc.count), cc.format.wire,
                    cc.kernels->where(), cc.kernels->stream());
  s.op = wo.op;
  s.before = [d, prescale = wo.prescale] { narrowAll(*d, prescale); };
  s.after = [d, elements = s.buffer.count] {
    // The reduced values, before postscale: every rank holds the same bits,
    // so every rank reports the same.
    if (d->c.nonFinite && d->c.kernels->nonFinite(d->c.wire, elements, d->c.format.wire)) {
      d->c.nonFinite->store(true, std::memory_order_release);
    }
    widenAll(*d);
  };
  return s;
}

std::vector<size_t> codecPieces(size_t count, uint64_t pieceBytes) {
  const uint64_t bytes = static_cast<uint64_t>(count) * sizeof(float);
  // Rounded to the nearest whole number of pieces, at least one.
  const uint64_t n = pieceBytes == 0 ? 1 : (2 * bytes + pieceBytes) / (2 * pieceBytes);
  const size_t blocks = (count + kQuantBlock - 1) / kQuantBlock;
  const size_t pieces = static_cast<size_t>(std::max<uint64_t>(1, std::min<uint64_t>(n, blocks)));
  // Piece i starts at block floor(blocks * i / pieces), computed without
  // the product, which overflows for counts near the 2^46-byte limit.
  const size_t whole = blocks / pieces, rest = blocks % pieces;
  std::vector<size_t> starts;
  for (size_t i = 0; i < pieces; ++i)
    starts.push_back((whole * i + rest * i / pieces) * kQuantBlock);
  starts.push_back(count);
  return starts;
}

}  // namespace gflow::internal
