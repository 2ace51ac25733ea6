#include "gradient/csc.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "core/internal.h"
#include "kernels/convert.h"
#include "kernels/sparse.h"

namespace gflow::gradient {

using internal::CommunicatorAccess;

// One bucket's sparse allreduce, shared by its two ops.
struct Csc::Job {
  Bucket bucket;
  float* packed = nullptr;  // the bucket's residual, packed (the region)
  size_t n = 0;             // elements
  size_t k = 0;             // chunks sent
  std::vector<float> norms;
  std::vector<uint32_t> picked;
  std::vector<float> values;     // k * chunk
  std::vector<uint16_t> onWire;  // compressed values
};

Csc::Csc(const std::vector<Tensor>& tensors, CscConfig config)
    : tensors_(tensors), config_(config), offset_(tensors.size(), 0) {
  size_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    offset_[i] = total;
    if (tensors[i].dtype == DataType::kFloat32) total += tensors[i].count;
  }
  residual_.assign(total, 0.0f);
  if (config_.momentum > 0.0f) velocity_.assign(total, 0.0f);
}

size_t Csc::picked(size_t n, uint64_t step) const {
  const size_t chunks = kernels::numChunks(n, config_.chunk);
  if (step < config_.warmupSteps) return chunks;
  const auto k = static_cast<size_t>(std::ceil(config_.density * static_cast<double>(chunks)));
  return std::clamp<size_t>(k, chunks == 0 ? 0 : 1, chunks);
}

// residual += gradient (or velocity = m * velocity + gradient, residual +=
// velocity), then the bucket's residual packed into the region.
void Csc::accumulate(const Job& job) {
  const float m = config_.momentum;
  for (size_t j = 0; j < job.bucket.tensors.size(); ++j) {
    const size_t t = job.bucket.tensors[j];
    const auto* g = static_cast<const float*>(tensors_[t].data);
    float* v = residual_.data() + offset_[t];
    const size_t len = tensors_[t].count;
    if (m > 0.0f) {
      float* u = velocity_.data() + offset_[t];
      for (size_t i = 0; i < len; ++i) {
        u[i] = m * u[i] + g[i];
        v[i] += u[i];
      }
    } else {
      for (size_t i = 0; i < len; ++i) v[i] += g[i];
    }
    if (len > 0) std::memcpy(job.packed + job.bucket.offsets[j] / sizeof(float), v, len * 4);
  }
}

// Writes the result: each tensor gets the reduced values of its picked
// ranges and zeros elsewhere; the picked ranges leave the residual (and the
// velocity: momentum factor masking).
void Csc::finish(Job& job) {
  const size_t chunk = config_.chunk;
  for (size_t j = 0; j < job.bucket.tensors.size(); ++j) {
    const size_t t = job.bucket.tensors[j];
    auto* g = static_cast<float*>(tensors_[t].data);
    const size_t len = tensors_[t].count;
    if (len == 0) continue;
    std::fill(g, g + len, 0.0f);
    const size_t begin = job.bucket.offsets[j] / sizeof(float), end = begin + len;
    // Picked chunks that overlap [begin, end), in ascending order.
    auto it = std::lower_bound(job.picked.begin(), job.picked.end(),
                               static_cast<uint32_t>(begin / chunk));
    for (; it != job.picked.end() && static_cast<size_t>(*it) * chunk < end; ++it) {
      const size_t c0 = static_cast<size_t>(*it) * chunk;
      const size_t from = std::max(begin, c0), to = std::min(end, c0 + chunk);
      const float* src = job.values.data() + static_cast<size_t>(it - job.picked.begin()) * chunk;
      std::memcpy(g + (from - begin), src + (from - c0), (to - from) * sizeof(float));
      std::fill(residual_.begin() + static_cast<std::ptrdiff_t>(offset_[t] + from - begin),
                residual_.begin() + static_cast<std::ptrdiff_t>(offset_[t] + to - begin), 0.0f);
      if (!velocity_.empty()) {
        std::fill(velocity_.begin() + static_cast<std::ptrdiff_t>(offset_[t] + from - begin),
                  velocity_.begin() + static_cast<std::ptrdiff_t>(offset_[t] + to - begin), 0.0f);
      }
    }
  }
}

std::vector<std::shared_ptr<WorkState>> Csc::fire(Communicator& comm, const Bucket& b, char* region,
                                                  ReduceOp op, const WireOptions& wire,
                                                  uint64_t step, ReducerStats* stats,
                                                  Timeline* timeline, const std::string& label,
                                                  std::shared_ptr<const void> owner,
                                                  std::shared_ptr<std::atomic<bool>> nonFinite) {
  auto job = std::make_shared<Job>();
  job->bucket = b;
  job->packed = reinterpret_cast<float*>(region);
  job->n = b.bytes / sizeof(float);
  job->k = picked(job->n, step);
  const size_t chunks = kernels::numChunks(job->n, config_.chunk);
  job->norms.assign(chunks, 0.0f);
  job->values.assign(job->k * config_.chunk, 0.0f);
  if (wire.compressed()) job->onWire.assign(job->values.size(), 0);
  if (stats) {
    stats->fusedOps += 2;
    stats->sparseChunksSent += job->k;
    stats->sparseChunks += chunks;
  }
  Timeline* tl = timeline;
  const std::string args = "\"step\": " + std::to_string(step) +
                           ", \"chunks\": " + std::to_string(chunks) +
                           ", \"picked\": " + std::to_string(job->k);
  auto t0 = std::make_shared<std::array<int64_t, 2>>();
  // 1. Norms of (residual + gradient), summed over ranks.
  auto normsBefore = [this, job, owner, tl, t0] {
    (void)owner;
    accumulate(*job);
    kernels::chunkL1Norms(job->packed, job->n, config_.chunk, job->norms.data());
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
  auto valuesBefore = [this, job, wire, tl, t0] {
    job->picked = kernels::topChunks(job->norms.data(), job->norms.size(), job->k);
    kernels::gatherChunks(job->packed, job->n, config_.chunk, job->picked, job->values.data());
    if (wire.compressed()) {
      kernels::narrow(job->onWire.data(), job->values.data(), job->values.size(), wire.wire,
                      wire.prescale);
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
  works.push_back(CommunicatorAccess::fusedAllreduce(comm, values, op, valuesBefore, valuesAfter));
  return works;
}

}  // namespace gflow::gradient
