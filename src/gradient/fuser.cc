#include "gradient/fuser.h"

#include <algorithm>
#include <array>

#include "common/tick_clock.h"
#include "gradient/csc.h"
#include "gradient/fusion.h"
#include "kernels/host_kernels.h"

namespace gflow::gradient {

using internal::CommunicatorAccess;

std::string bucketLabel(const Bucket& b, const std::vector<std::string>& names) {
  if (b.direct) {
    return names.size() > b.tensors[0] ? names[b.tensors[0]]
                                       : "tensor " + std::to_string(b.tensors[0]);
  }
  return "bucket of " + std::to_string(b.tensors.size()) + (b.inPlace ? " (in place)" : "");
}

Fuser::Fuser(FuserConfig config) : c_(std::move(config)) {
  if (!c_.kernels) c_.kernels = kernels::hostKernels();
  if (c_.wires.empty()) c_.wires = {c_.wire.wire};
}

bool Fuser::packsOn(const Bucket& b, DataType wire) const {
  if (isFloat32(b) && c_.csc != nullptr) return false;  // CSC works in the residual
  return !b.inPlace || (isFloat32(b) && wire != DataType::kFloat32);
}

bool Fuser::packs(const Bucket& b) const {
  return std::any_of(c_.wires.begin(), c_.wires.end(), [&](DataType w) { return packsOn(b, w); });
}

uint64_t Fuser::slack() const {
  uint64_t most = 0;
  for (DataType w : c_.wires) {
    if (isQuantized(w)) most = std::max<uint64_t>(most, dataTypeSize(w));
  }
  return most;
}

internal::FusedSteps Fuser::compressedSteps(const Bucket& b, char* region, DataType wire,
                                            std::shared_ptr<std::atomic<bool>> nonFinite) const {
  internal::CompressedAllreduce c;
  c.kernels = c_.kernels;
  c.format = c_.wire;
  c.format.wire = wire;
  c.op = c_.op;
  c.worldSize = c_.comm->size();
  c.wire = region;
  c.count = b.bytes / sizeof(float);
  for (size_t k = 0; k < b.tensors.size(); ++k) {
    const Tensor& t = (*c_.tensors)[b.tensors[k]];
    float* residual = c_.residuals && isQuantized(wire) ? (*c_.residuals)[b.tensors[k]] : nullptr;
    c.spans.push_back(
        {static_cast<float*>(t.data), t.count, b.offsets[k] / sizeof(float), residual});
  }
  c.nonFinite = std::move(nonFinite);
  return internal::compressedSteps(std::move(c));
}

internal::FusedSteps Fuser::denseSteps(const Bucket& b, char* region) const {
  internal::FusedSteps s;
  const bool pack = packsOn(b, DataType::kFloat32);
  s.buffer = Tensor(pack ? static_cast<void*>(region) : b.start, b.bytes / dataTypeSize(b.dtype),
                    b.dtype, c_.kernels->where(), c_.kernels->stream());
  s.op = c_.op;
  if (!pack) return s;
  auto k = c_.kernels;
  s.before = [k, copies = packCopies(b, *c_.tensors, region)] { k->copy(copies); };
  s.after = [k, copies = unpackCopies(b, region, *c_.tensors)] { k->copy(copies); };
  return s;
}

Fired Fuser::fire(const Bucket& b, char* region, FireOptions o) {
  Fired fired;
  const std::string label = c_.timeline ? bucketLabel(b, *c_.names) : std::string();
  if (c_.csc && isFloat32(b)) {
    fired.works = c_.csc->fire(*c_.comm, b,
                               Csc::Fire{c_.op, c_.wire, o.step, o.stats, c_.timeline, label,
                                         std::move(o.owner), std::move(o.nonFinite)});
    return fired;
  }
  const DataType wire = isFloat32(b) ? o.wire.value_or(c_.wire.wire) : b.dtype;
  const bool pack = packsOn(b, wire);
  if (o.stats) {
    ++o.stats->fusedOps;
    (pack ? o.stats->packedBytes : o.stats->inPlaceBytes) += b.bytes;
  }
  const internal::FusedSteps steps = isFloat32(b) && wire != DataType::kFloat32
                                         ? compressedSteps(b, region, wire, std::move(o.nonFinite))
                                         : denseSteps(b, region);
  const uint64_t step = o.step;
  auto spans = std::make_shared<const OpSpans>(c_.timeline, label,
                                               SpanArgs{{"step", step},
                                                        {"bytes", b.bytes},
                                                        {"tensors", b.tensors.size()},
                                                        {"first", b.tensors[0]}});
  // Phase boundaries for the timeline: queued, packed; and the op's start
  // for `timed`.
  auto times = std::make_shared<std::array<int64_t, 3>>();
  (*times)[0] = spans->now();
  auto owner = std::move(o.owner);
  auto before = [owner, spans, times, pack, run = steps.before] {
    (void)owner;
    (*times)[2] = TickClock::now();
    const int64_t start = spans->now();
    spans->span("queued", "queue", Timeline::kQueue, (*times)[0], start);
    if (run) run();
    if (pack) spans->span("pack", "pack", Timeline::kComm, start, spans->now());
    (*times)[1] = spans->now();
  };
  auto after = [owner, spans, times, pack, run = steps.after, k = c_.kernels, comm = c_.comm,
                timed = std::move(o.timed)] {
    (void)owner;
    const int64_t reduced = spans->now();
    // The rank that reached this allreduce last, as this rank saw it.
    const ArrivalVerdict v =
        spans->on() ? CommunicatorAccess::currentArrival(*comm) : ArrivalVerdict{};
    if (v.last >= 0) {
      spans->span("allreduce", "allreduce", Timeline::kComm, (*times)[1], reduced,
                  {{"last_rank", static_cast<uint64_t>(v.last)},
                   {"skew_us", static_cast<uint64_t>(v.skewNs / 1000)}});
    } else {
      spans->span("allreduce", "allreduce", Timeline::kComm, (*times)[1], reduced);
    }
    if (run) run();
    // The op (and the step) completes with the results in the tensors.
    k->synchronize();
    if (pack) spans->span("unpack", "unpack", Timeline::kComm, reduced, spans->now());
    if (timed) timed((*times)[2], TickClock::now());
  };
  fired.works.push_back(
      CommunicatorAccess::fusedAllreduce(*c_.comm, steps.buffer, steps.op, before, after));
  return fired;
}

}  // namespace gflow::gradient
