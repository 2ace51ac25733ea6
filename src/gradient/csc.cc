#include "gradient/csc.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "core/internal.h"
#include "gradient/device_ops.h"
#include "kernels/convert.h"
#include "kernels/sparse.h"

namespace gflow::gradient {

using internal::CommunicatorAccess;

// One bucket's sparse allreduce, shared by its two ops.
struct Csc::Job {
  Bucket bucket;
  size_t chunk = 0;  // min(configured chunk, bucket elements): same on every rank
  size_t k = 0;      // chunks sent
  std::vector<float> norms;
  std::vector<size_t> picked;
  std::vector<float> values;     // k * chunk, zero padded
  std::vector<uint16_t> onWire;  // compressed values
};

void Csc::reset() {
  std::fill(residual_.begin(), residual_.end(), 0.0f);
  std::fill(velocity_.begin(), velocity_.end(), 0.0f);
  if (residualDevice_) device_->zero(residualDevice_, total_ * sizeof(float));
  if (velocityDevice_) device_->zero(velocityDevice_, total_ * sizeof(float));
}

Csc::Csc(const std::vector<Tensor>& tensors, CscConfig config, std::shared_ptr<DeviceOps> device)
    : tensors_(tensors), config_(config), offset_(tensors.size(), 0), device_(std::move(device)) {
  size_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    offset_[i] = total;
    if (tensors[i].dtype == DataType::kFloat32) total += tensors[i].count;
  }
  total_ = total;
  if (device_) {
    residualDevice_ = static_cast<float*>(device_->allocate(total * sizeof(float)));
    if (config_.momentum > 0.0f) {
      velocityDevice_ = static_cast<float*>(device_->allocate(total * sizeof(float)));
    }
    return;
  }
  residual_.assign(total, 0.0f);
  if (config_.momentum > 0.0f) velocity_.assign(total, 0.0f);
}

size_t Csc::picked(size_t n, size_t chunk, uint64_t step) const {
  const size_t chunks = kernels::numChunks(n, chunk);
  if (step < config_.warmupSteps) return chunks;
  const auto k = static_cast<size_t>(std::ceil(config_.density * static_cast<double>(chunks)));
  return std::clamp<size_t>(k, chunks == 0 ? 0 : 1, chunks);
}

template <class Fn>
void Csc::forEachPiece(const Bucket& b, size_t chunk, Fn fn) const {
  for (size_t j = 0; j < b.tensors.size(); ++j) {
    const size_t t = b.tensors[j];
    const size_t len = tensors_[t].count;
    size_t at = b.offsets[j] / sizeof(float);
    for (size_t from = 0; from < len;) {
      const size_t to = std::min(len, from + (chunk - at % chunk));
      fn(t, from, to, at);
      at += to - from;
      from = to;
    }
  }
}

// residual += gradient (or velocity = m * velocity + gradient, residual +=
// velocity), with each chunk's L1 norm of the new residual, in one pass.
void Csc::accumulate(Job& job) {
  const float m = config_.momentum;
  std::fill(job.norms.begin(), job.norms.end(), 0.0f);
  forEachPiece(job.bucket, job.chunk, [&](size_t t, size_t from, size_t to, size_t at) {
    const float* g = static_cast<const float*>(tensors_[t].data) + from;
    float* v = residual_.data() + offset_[t] + from;
    job.norms[at / job.chunk] += m > 0.0f
                                     ? kernels::accumulateMomentumL1(
                                           v, velocity_.data() + offset_[t] + from, g, m, to - from)
                                     : kernels::accumulateL1(v, g, to - from);
  });
}

namespace {
// Where chunk c is in the picked list, or SIZE_MAX.
size_t slotOf(const std::vector<size_t>& picked, size_t c) {
  const auto it = std::lower_bound(picked.begin(), picked.end(), c);
  return it != picked.end() && *it == c ? static_cast<size_t>(it - picked.begin()) : SIZE_MAX;
}
}  // namespace

// The picked chunks of the residual into `values` (picked chunk j at
// j * chunk; the padding of a short last chunk stays zero).
void Csc::gather(Job& job) const {
  const size_t chunk = job.chunk;
  forEachPiece(job.bucket, job.chunk, [&](size_t t, size_t from, size_t to, size_t at) {
    const size_t slot = slotOf(job.picked, at / chunk);
    if (slot == SIZE_MAX) return;
    std::memcpy(job.values.data() + slot * chunk + at % chunk, residual_.data() + offset_[t] + from,
                (to - from) * sizeof(float));
  });
}

// Writes the result: each tensor gets the reduced values of its picked
// chunks and zeros elsewhere; the picked chunks leave the residual (and the
// velocity: momentum factor masking).
void Csc::finish(Job& job) {
  const size_t chunk = job.chunk;
  // Momentum factor masking: a sent chunk's velocity restarts. When every
  // chunk is sent (warm-up, density 1) the velocity is kept, which is plain
  // momentum SGD.
  const bool mask = job.k < job.norms.size();
  forEachPiece(job.bucket, job.chunk, [&](size_t t, size_t from, size_t to, size_t at) {
    float* g = static_cast<float*>(tensors_[t].data) + from;
    const size_t len = to - from, slot = slotOf(job.picked, at / chunk);
    if (slot == SIZE_MAX) {
      std::fill_n(g, len, 0.0f);
      return;
    }
    std::memcpy(g, job.values.data() + slot * chunk + at % chunk, len * sizeof(float));
    std::fill_n(residual_.data() + offset_[t] + from, len, 0.0f);
    if (mask && !velocity_.empty()) std::fill_n(velocity_.data() + offset_[t] + from, len, 0.0f);
  });
}

std::vector<std::shared_ptr<WorkState>> Csc::fire(Communicator& comm, const Bucket& b, ReduceOp op,
                                                  const WireOptions& wire, uint64_t step,
                                                  ReducerStats* stats, Timeline* timeline,
                                                  const std::string& label,
                                                  std::shared_ptr<const void> owner,
                                                  std::shared_ptr<std::atomic<bool>> nonFinite) {
  if (stats) {
    const size_t n = b.bytes / sizeof(float);
    const size_t chunk = std::max<size_t>(1, std::min(config_.chunk, n));
    stats->fusedOps += 2;
    stats->sparseChunksSent += picked(n, chunk, step);
    stats->sparseChunks += kernels::numChunks(n, chunk);
  }
  if (device_) {
    return fireOnDevice(comm, b, op, wire, step, timeline, label, std::move(owner),
                        std::move(nonFinite));
  }
  auto job = std::make_shared<Job>();
  job->bucket = b;
  const size_t n = b.bytes / sizeof(float);
  // A bucket smaller than a chunk is one chunk of its own size (no padding).
  job->chunk = std::max<size_t>(1, std::min(config_.chunk, n));
  job->k = picked(n, job->chunk, step);
  const size_t chunks = kernels::numChunks(n, job->chunk);
  job->norms.assign(chunks, 0.0f);
  job->values.assign(job->k * job->chunk, 0.0f);
  if (wire.compressed()) job->onWire.assign(job->values.size(), 0);
  Timeline* tl = timeline;
  const std::string args = "\"step\": " + std::to_string(step) +
                           ", \"chunks\": " + std::to_string(chunks) +
                           ", \"picked\": " + std::to_string(job->k);
  auto t0 = std::make_shared<std::array<int64_t, 2>>();
  // 1. Norms of (residual + gradient), summed over ranks.
  auto normsBefore = [this, job, owner, tl, t0] {
    (void)owner;
    accumulate(*job);
    if (tl) (*t0)[0] = Timeline::nowUs();
  };
  auto normsAfter = [tl, t0, label, args] {
    if (tl)
      tl->span("csc norms: " + label, "allreduce", Timeline::kComm, (*t0)[0], Timeline::nowUs(),
               args);
  };
  std::vector<std::shared_ptr<WorkState>> works;
  works.push_back(CommunicatorAccess::fusedAllreduce(
      comm, Tensor(job->norms.data(), job->norms.size(), DataType::kFloat32), ReduceOp::kSum,
      normsBefore, normsAfter));
  // 2. The same top chunks on every rank (the norms are the same bits).
  const Tensor values = wire.compressed()
                            ? Tensor(job->onWire.data(), job->onWire.size(), wire.wire)
                            : Tensor(job->values.data(), job->values.size(), DataType::kFloat32);
  // On a compressed wire avg is a sum with 1/N in the prescale (no overflow).
  const internal::WireOp wo = wire.compressed() ? internal::wireOp(op, wire.prescale, comm.size())
                                                : internal::WireOp{op, wire.prescale};
  auto valuesBefore = [this, job, wire, wo, tl, t0] {
    job->picked = kernels::topChunks(job->norms.data(), job->norms.size(), job->k);
    gather(*job);
    if (wire.compressed()) {
      kernels::narrow(job->onWire.data(), job->values.data(), job->values.size(), wire.wire,
                      wo.prescale);
    }
    if (tl) (*t0)[1] = Timeline::nowUs();
  };
  auto valuesAfter = [this, job, wire, nonFinite, owner, tl, t0, label, args] {
    (void)owner;
    if (wire.compressed()) {
      if (nonFinite && kernels::anyNonFinite(job->onWire.data(), job->onWire.size(), wire.wire)) {
        nonFinite->store(true);
      }
      kernels::widen(job->values.data(), job->onWire.data(), job->values.size(), wire.wire,
                     wire.postscale);
    } else if (nonFinite &&
               kernels::anyNonFinite(job->values.data(), job->values.size(), DataType::kFloat32)) {
      nonFinite->store(true);
    }
    if (tl)
      tl->span("csc chunks: " + label, "allreduce", Timeline::kComm, (*t0)[1], Timeline::nowUs(),
               args);
    finish(*job);
  };
  submitValues(comm, values, wo.op, valuesBefore, valuesAfter, &works);
  return works;
}

void Csc::submitValues(Communicator& comm, const Tensor& values, ReduceOp op,
                       std::function<void()> before, std::function<void()> after,
                       std::vector<std::shared_ptr<WorkState>>* works) {
  try {
    works->push_back(
        CommunicatorAccess::fusedAllreduce(comm, values, op, std::move(before), std::move(after)));
  } catch (...) {
    // The communicator failed between the two submits: the norms op still
    // runs (and fails); it touches this Csc, so let it end first.
    try {
      works->front()->wait(std::chrono::milliseconds(0));
    } catch (const Error&) {
    }
    throw;
  }
}

}  // namespace gflow::gradient
