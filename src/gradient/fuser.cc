#include "gradient/fuser.h"

#include <array>

#include "core/internal.h"
#include "gradient/csc.h"
#include "gradient/device_ops.h"
#include "gradient/fusion.h"
#include "kernels/convert.h"

namespace gflow::gradient {

using internal::CommunicatorAccess;

std::string bucketLabel(const Bucket& b, const std::vector<std::string>& names) {
  if (b.direct) {
    return names.size() > b.tensors[0] ? names[b.tensors[0]]
                                       : "tensor " + std::to_string(b.tensors[0]);
  }
  return "bucket of " + std::to_string(b.tensors.size()) + (b.inPlace ? " (in place)" : "");
}

Fuser::Fuser(Communicator& comm, const std::vector<Tensor>& tensors,
             const std::vector<std::string>& names, ReduceOp op, Timeline* timeline,
             WireOptions wire, Csc* csc, DeviceOps* device)
    : comm_(comm),
      tensors_(tensors),
      names_(names),
      op_(op),
      timeline_(timeline),
      wire_(wire),
      csc_(csc),
      device_(device) {}

bool Fuser::packs(const Bucket& b) const {
  if (isFloat32(b) && csc_ != nullptr) return false;  // CSC works in the residual
  return !b.inPlace || (isFloat32(b) && wire_.compressed());
}

Fired Fuser::fire(const Bucket& b, char* region, uint64_t step, ReducerStats* stats,
                  std::shared_ptr<const void> owner, std::shared_ptr<std::atomic<bool>> nonFinite) {
  Fired fired;
  const bool pack = packs(b);
  if (csc_ && isFloat32(b)) {
    fired.works = csc_->fire(comm_, b, op_, wire_, step, stats, timeline_, bucketLabel(b, names_),
                             std::move(owner), std::move(nonFinite));
    return fired;
  }
  if (stats) {
    ++stats->fusedOps;
    (pack ? stats->packedBytes : stats->inPlaceBytes) += b.bytes;
  }
  auto bucket = std::make_shared<const Bucket>(b);
  const bool compress = isFloat32(b) && wire_.compressed();
  const size_t count = b.bytes / dataTypeSize(b.dtype);
  DeviceOps* dev = device_;
  const Tensor buffer(pack ? static_cast<void*>(region) : b.start, count,
                      compress ? wire_.wire : b.dtype, dev ? dev->where() : Device{},
                      dev ? dev->stream() : nullptr);
  const std::vector<Tensor>* tensors = &tensors_;
  WireOptions w = wire_;
  ReduceOp op = op_;
  if (compress) {  // avg: sum on the wire with 1/N in the prescale
    const internal::WireOp wo = internal::wireOp(op_, w.prescale, comm_.size());
    op = wo.op;
    w.prescale = wo.prescale;
  }
  Timeline* tl = timeline_;
  std::string label, args;
  if (tl) {
    label = bucketLabel(b, names_);
    args = "\"step\": " + std::to_string(step) + ", \"bytes\": " + std::to_string(b.bytes) +
           ", \"tensors\": " + std::to_string(b.tensors.size()) +
           ", \"first\": " + std::to_string(b.tensors[0]);
  }
  // Phase boundaries for the timeline: queued, packed.
  auto times = std::make_shared<std::array<int64_t, 2>>();
  if (tl) (*times)[0] = Timeline::nowUs();
  auto before = [=] {
    (void)owner;
    const int64_t start = tl ? Timeline::nowUs() : 0;
    if (tl) tl->span("queued: " + label, "queue", Timeline::kQueue, (*times)[0], start, args);
    if (compress) {
      auto* wire = reinterpret_cast<uint16_t*>(region);
      for (size_t k = 0; k < bucket->tensors.size(); ++k) {
        const Tensor& t = (*tensors)[bucket->tensors[k]];
        uint16_t* to = wire + bucket->offsets[k] / sizeof(float);
        const auto* from = static_cast<const float*>(t.data);
        if (dev) {
          dev->narrow(to, from, t.count, w.wire, w.prescale);
        } else {
          kernels::narrow(to, from, t.count, w.wire, w.prescale);
        }
      }
    } else if (pack) {
      if (dev) {
        dev->pack(*bucket, *tensors, region);
      } else {
        gradient::pack(*bucket, *tensors, region);
      }
    }
    if (tl && pack)
      tl->span("pack: " + label, "pack", Timeline::kComm, start, Timeline::nowUs(), args);
    if (tl) (*times)[1] = Timeline::nowUs();
  };
  auto after = [=] {
    (void)owner;
    const int64_t reduced = tl ? Timeline::nowUs() : 0;
    if (tl)
      tl->span("allreduce: " + label, "allreduce", Timeline::kComm, (*times)[1], reduced, args);
    if (compress) {
      const auto* wire = reinterpret_cast<const uint16_t*>(region);
      if (nonFinite && (dev ? dev->nonFinite(wire, count, w.wire)
                            : kernels::anyNonFinite(wire, count, w.wire))) {
        nonFinite->store(true);
      }
      for (size_t k = 0; k < bucket->tensors.size(); ++k) {
        const Tensor& t = (*tensors)[bucket->tensors[k]];
        auto* to = static_cast<float*>(t.data);
        const uint16_t* from = wire + bucket->offsets[k] / sizeof(float);
        if (dev) {
          dev->widen(to, from, t.count, w.wire, w.postscale);
        } else {
          kernels::widen(to, from, t.count, w.wire, w.postscale);
        }
      }
    } else if (pack) {
      if (dev) {
        dev->unpack(*bucket, region, *tensors);
      } else {
        gradient::unpack(*bucket, region, *tensors);
      }
    }
    // The op (and the step) completes with the results in the tensors.
    if (dev) dev->synchronize();
    if (tl && pack) {
      tl->span("unpack: " + label, "unpack", Timeline::kComm, reduced, Timeline::nowUs(), args);
    }
  };
  fired.works.push_back(CommunicatorAccess::fusedAllreduce(comm_, buffer, op, before, after));
  return fired;
}

}  // namespace gflow::gradient
