// CSC on cuda tensors: the steps of csc.cc as CUDA kernels on the
// gradients' stream. The bucket's gradients, residual and velocity are
// copied into contiguous bucket order (one batched copy), where the kernels
// work chunk by chunk, and copied back at the end:
//   1. v += g (or u = m u + g, v += u) with each chunk's L1 norm -> the
//      norms are allreduced (sum);
//   2. the top k chunks of the reduced norms (the same on every rank: the
//      norms are the same bits) gathered, narrowed on a compressed wire ->
//      allreduced;
//   3. widened, scattered into the gradient (zeros elsewhere), the picked
//      chunks cleared from the residual (and velocity), copied back.
#include <algorithm>
#include <array>

#include "core/internal.h"
#include "gradient/csc.h"
#include "gradient/device_ops.h"
#include "kernels/sparse.h"

namespace gflow::gradient {

using internal::CommunicatorAccess;

struct Csc::DeviceJob {
  explicit DeviceJob(std::shared_ptr<DeviceOps> d) : dev(std::move(d)) {}
  // The scratch goes back when the job's ops are gone, also when they failed
  // midway (later users of a block queue behind this job's kernels on the
  // same stream). The ops may be destroyed after the reducer: the job keeps
  // the device state alive.
  ~DeviceJob() {
    for (void* p : blocks) dev->release(p);
  }
  std::shared_ptr<DeviceOps> dev;
  Bucket bucket;
  size_t n = 0, chunk = 0, chunks = 0, k = 0;
  // Scratch of the device ops (released when the job ends).
  std::vector<void*> blocks;
  float* g = nullptr;  // the bucket's gradients, contiguous
  float* v = nullptr;  // its residual
  float* u = nullptr;  // its velocity (momentum)
  float* norms = nullptr;
  uint32_t* idx = nullptr;
  float* values = nullptr;  // k * chunk picked values
  void* onWire = nullptr;   // compressed values
  void* temp = nullptr;
  size_t tempBytes = 0;
};

std::vector<std::shared_ptr<WorkState>> Csc::fireOnDevice(
    Communicator& comm, const Bucket& b, ReduceOp op, const WireOptions& wire, uint64_t step,
    Timeline* timeline, const std::string& label, std::shared_ptr<const void> owner,
    std::shared_ptr<std::atomic<bool>> nonFinite) {
  DeviceOps* dev = device_.get();
  auto job = std::make_shared<DeviceJob>(device_);
  job->bucket = b;
  job->n = b.bytes / sizeof(float);
  job->chunk = std::max<size_t>(1, std::min(config_.chunk, job->n));
  job->k = picked(job->n, job->chunk, step);
  job->chunks = kernels::numChunks(job->n, job->chunk);
  auto take = [&](size_t bytes) {
    void* p = dev->acquire(bytes);
    job->blocks.push_back(p);
    return p;
  };
  job->g = static_cast<float*>(take(job->n * sizeof(float)));
  job->v = static_cast<float*>(take(job->n * sizeof(float)));
  if (velocityDevice_) job->u = static_cast<float*>(take(job->n * sizeof(float)));
  job->norms = static_cast<float*>(take(job->chunks * sizeof(float)));
  job->idx = static_cast<uint32_t*>(take(job->k * sizeof(uint32_t)));
  job->values = static_cast<float*>(take(job->k * job->chunk * sizeof(float)));
  if (wire.compressed()) job->onWire = take(job->k * job->chunk * sizeof(uint16_t));
  job->tempBytes = dev->topChunksTempBytes(job->chunks);
  job->temp = take(job->tempBytes);

  // Copies between the tensors (and their residual / velocity) and the
  // bucket-ordered scratch.
  auto copies = [this, job](bool toBucket, bool withGradient) {
    std::vector<DeviceOps::Copy> c;
    const Bucket& bk = job->bucket;
    for (size_t j = 0; j < bk.tensors.size(); ++j) {
      const size_t t = bk.tensors[j];
      const size_t at = bk.offsets[j] / sizeof(float), len = tensors_[t].count;
      if (len == 0) continue;
      auto add = [&](float* tensorSide, float* bucketSide) {
        if (toBucket) {
          c.push_back({tensorSide, bucketSide + at, len * sizeof(float)});
        } else {
          c.push_back({bucketSide + at, tensorSide, len * sizeof(float)});
        }
      };
      if (withGradient) add(static_cast<float*>(tensors_[t].data), job->g);
      add(residualDevice_ + offset_[t], job->v);
      if (job->u) add(velocityDevice_ + offset_[t], job->u);
    }
    return c;
  };

  Timeline* tl = timeline;
  const std::string args = "\"step\": " + std::to_string(step) +
                           ", \"chunks\": " + std::to_string(job->chunks) +
                           ", \"picked\": " + std::to_string(job->k);
  auto t0 = std::make_shared<std::array<int64_t, 2>>();
  auto normsBefore = [this, dev, job, copies, owner, tl, t0] {
    (void)owner;
    dev->copy(copies(true, true));
    dev->accumulateChunkNorms(job->v, job->u, job->g, config_.momentum, job->n, job->chunk,
                              job->norms);
    if (tl) (*t0)[0] = Timeline::nowUs();
  };
  auto normsAfter = [tl, t0, label, args] {
    if (tl) {
      tl->span("csc norms: " + label, "allreduce", Timeline::kComm, (*t0)[0], Timeline::nowUs(),
               args);
    }
  };
  std::vector<std::shared_ptr<WorkState>> works;
  works.push_back(CommunicatorAccess::fusedAllreduce(
      comm, Tensor(job->norms, job->chunks, DataType::kFloat32, dev->where(), dev->stream()),
      ReduceOp::kSum, normsBefore, normsAfter));

  const size_t count = job->k * job->chunk;
  const Tensor values =
      wire.compressed()
          ? Tensor(job->onWire, count, wire.wire, dev->where(), dev->stream())
          : Tensor(job->values, count, DataType::kFloat32, dev->where(), dev->stream());
  const internal::WireOp wo = wire.compressed() ? internal::wireOp(op, wire.prescale, comm.size())
                                                : internal::WireOp{op, wire.prescale};
  auto valuesBefore = [dev, job, wire, wo, tl, t0] {
    dev->topChunks(job->norms, job->chunks, job->k, job->idx, job->temp, job->tempBytes);
    dev->gatherChunks(job->values, job->v, job->idx, job->k, job->chunk, job->n);
    if (wire.compressed()) {
      dev->narrow(job->onWire, job->values, job->k * job->chunk, wire.wire, wo.prescale);
    }
    if (tl) (*t0)[1] = Timeline::nowUs();
  };
  auto valuesAfter = [dev, job, copies, wire, nonFinite, owner, tl, t0, label, args] {
    (void)owner;
    const size_t m = job->k * job->chunk;
    if (wire.compressed()) {
      if (nonFinite && dev->nonFinite(job->onWire, m, wire.wire)) nonFinite->store(true);
      dev->widen(job->values, job->onWire, m, wire.wire, wire.postscale);
    } else if (nonFinite && dev->nonFinite(job->values, m, DataType::kFloat32)) {
      nonFinite->store(true);
    }
    if (tl) {
      tl->span("csc chunks: " + label, "allreduce", Timeline::kComm, (*t0)[1], Timeline::nowUs(),
               args);
    }
    // Momentum factor masking as on the host: kept when every chunk is sent.
    float* u = job->k < job->chunks ? job->u : nullptr;
    dev->scatterChunks(job->g, job->v, u, job->values, job->idx, job->k, job->chunk, job->n);
    dev->copy(copies(false, true));
    dev->synchronize();
  };
  submitValues(comm, values, wo.op, valuesBefore, valuesAfter, &works);
  return works;
}

}  // namespace gflow::gradient
