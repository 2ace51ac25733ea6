#include "core/compressed_allreduce.h"

#include "kernels/host_kernels.h"

namespace gflow::internal {

FusedSteps compressedSteps(CompressedAllreduce c) {
  // avg sums on the wire first and divides last, so a float16 sum of N
  // in-range values could overflow: the division moves into the prescale.
  if (!c.kernels) c.kernels = kernels::hostKernels();
  const WireOp wo = wireOp(c.op, c.format.prescale, c.worldSize);
  auto d = std::make_shared<const CompressedAllreduce>(std::move(c));
  FusedSteps s;
  s.buffer = Tensor(d->wire, d->count, d->format.wire, d->kernels->where(), d->kernels->stream());
  s.op = wo.op;
  s.before = [d, prescale = wo.prescale] {
    auto* wire = static_cast<uint16_t*>(d->wire);
    for (const WireSpan& w : d->spans) {
      d->kernels->narrow(wire + w.at, w.data, w.count, d->format.wire, prescale);
    }
  };
  s.after = [d] {
    const auto* wire = static_cast<const uint16_t*>(d->wire);
    // The reduced values, before postscale: every rank holds the same bits,
    // so every rank reports the same.
    if (d->nonFinite && d->kernels->nonFinite(wire, d->count, d->format.wire)) {
      d->nonFinite->store(true, std::memory_order_release);
    }
    for (const WireSpan& w : d->spans) {
      d->kernels->widen(w.data, wire + w.at, w.count, d->format.wire, d->format.postscale);
    }
  };
  return s;
}

}  // namespace gflow::internal
