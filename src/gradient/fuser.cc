#include "gradient/fuser.h"

#include <array>

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
}

bool Fuser::packs(const Bucket& b) const {
  if (isFloat32(b) && c_.csc != nullptr) return false;  // CSC works in the residual
  return !b.inPlace || (isFloat32(b) && c_.wire.compressed());
}

uint64_t Fuser::slack() const {
  return isQuantized(c_.wire.wire) ? dataTypeSize(c_.wire.wire) : 0;
}

internal::FusedSteps Fuser::compressedSteps(const Bucket& b, char* region,
                                            std::shared_ptr<std::atomic<bool>> nonFinite) const {
  internal::CompressedAllreduce c;
  c.kernels = c_.kernels;
  c.format = c_.wire;
  c.op = c_.op;
  c.worldSize = c_.comm->size();
  c.wire = region;
  c.count = b.bytes / sizeof(float);
  for (size_t k = 0; k < b.tensors.size(); ++k) {
    const Tensor& t = (*c_.tensors)[b.tensors[k]];
    float* residual = c_.residuals ? (*c_.residuals)[b.tensors[k]] : nullptr;
    c.spans.push_back(
        {static_cast<float*>(t.data), t.count, b.offsets[k] / sizeof(float), residual});
  }
  c.nonFinite = std::move(nonFinite);
  return internal::compressedSteps(std::move(c));
}

internal::FusedSteps Fuser::denseSteps(const Bucket& b, char* region) const {
  internal::FusedSteps s;
  const bool pack = packs(b);
  s.buffer = Tensor(pack ? static_cast<void*>(region) : b.start, b.bytes / dataTypeSize(b.dtype),
                    b.dtype, c_.kernels->where(), c_.kernels->stream());
  s.op = c_.op;
  if (!pack) return s;
  auto k = c_.kernels;
  s.before = [k, copies = packCopies(b, *c_.tensors, region)] { k->copy(copies); };
  s.after = [k, copies = unpackCopies(b, region, *c_.tensors)] { k->copy(copies); };
  return s;
}

Fired Fuser::fire(const Bucket& b, char* region, uint64_t step, ReducerStats* stats,
                  std::shared_ptr<const void> owner, std::shared_ptr<std::atomic<bool>> nonFinite) {
  Fired fired;
  const std::string label = c_.timeline ? bucketLabel(b, *c_.names) : std::string();
  if (c_.csc && isFloat32(b)) {
    fired.works = c_.csc->fire(*c_.comm, b, c_.op, c_.wire, step, stats, c_.timeline, label,
                               std::move(owner), std::move(nonFinite));
    return fired;
  }
  const bool pack = packs(b);
  if (stats) {
    ++stats->fusedOps;
    (pack ? stats->packedBytes : stats->inPlaceBytes) += b.bytes;
  }
  const internal::FusedSteps steps = isFloat32(b) && c_.wire.compressed()
                                         ? compressedSteps(b, region, std::move(nonFinite))
                                         : denseSteps(b, region);
  auto spans = std::make_shared<const OpSpans>(c_.timeline, label,
                                               SpanArgs{{"step", step},
                                                        {"bytes", b.bytes},
                                                        {"tensors", b.tensors.size()},
                                                        {"first", b.tensors[0]}});
  // Phase boundaries for the timeline: queued, packed.
  auto times = std::make_shared<std::array<int64_t, 2>>();
  (*times)[0] = spans->now();
  auto before = [owner, spans, times, pack, run = steps.before] {
    (void)owner;
    const int64_t start = spans->now();
    spans->span("queued", "queue", Timeline::kQueue, (*times)[0], start);
    if (run) run();
    if (pack) spans->span("pack", "pack", Timeline::kComm, start, spans->now());
    (*times)[1] = spans->now();
  };
  auto after = [owner, spans, times, pack, run = steps.after, k = c_.kernels, comm = c_.comm] {
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
  };
  fired.works.push_back(
      CommunicatorAccess::fusedAllreduce(*c_.comm, steps.buffer, steps.op, before, after));
  return fired;
}

}  // namespace gflow::gradient
